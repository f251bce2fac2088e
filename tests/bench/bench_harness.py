"""The harness adapter's cost, against the plain enqueue it wraps, from the same run.

1. Overhead per tool call: a plain ``Outbox.enqueue`` (the baseline), the core's
   ``Effects.submit`` of the same intent, and a whole Pydantic AI run (``FunctionModel``) whose
   one effect call enqueues and is deferred; each per call, and as a ratio to the baseline.
2. Runs resumed per second: runs that each ended with 100 deferred effect calls, whose intents
   are then settled, are answered and resumed with ``settle``; 100 outcome lookups and one
   resume per run.

Everything runs in this process on the library (``Local``) over a fresh SQLite database
(``synchronous=FULL``, as served), without a worker: nothing is delivered, so what is measured
is the harness, not a receiver. Intents are settled by cancelling them (an operator's move),
which the model is told as a failure. Nothing here asserts on timing.

    python tests/bench/bench_harness.py [--n N] [--runs R]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from outbox import DestinationSpec, Outbox, operations
from outbox.harness import Action, Effects, Local
from outbox.harness.pydantic_ai import EffectTools

SECRET = "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODk="
SETTLER = operations.Actor("bench", "settled for the benchmark")


def calling(count: int) -> FunctionModel:
    """A model that calls the effect tool ``count`` times at once, then answers."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("send", {"n": n}, tool_call_id=f"c{n}") for n in range(count)])
        return ModelResponse(parts=[TextPart("done")])

    return FunctionModel(respond)


def tools_for(box: Outbox) -> EffectTools[None]:
    tools: EffectTools[None] = EffectTools(Effects(Local(box)), scope="bench")

    @tools.tool("sink")
    def send(n: int) -> None:
        """Send n."""

    return tools


async def per_call(box: Outbox, n: int) -> dict[str, float]:
    """Seconds per call of each path, over ``n`` calls each."""
    tools = tools_for(box)
    agent = Agent(calling(1), toolsets=[tools.toolset], output_type=[str, DeferredToolRequests])
    started = time.perf_counter()
    for i in range(n):
        await box.enqueue(destination="sink", scope="bench", payload={"n": 0}, action_id=f"plain-{i}")
    plain = (time.perf_counter() - started) / n
    started = time.perf_counter()
    for i in range(n):
        await tools.effects.submit(Action(f"core-{i}", "c0", "send", "sink", "bench", {"n": 0}))
    core = (time.perf_counter() - started) / n
    started = time.perf_counter()
    for i in range(n):
        run = await agent.run("go", conversation_id=f"run-{i}")
        assert isinstance(run.output, DeferredToolRequests)
    whole = (time.perf_counter() - started) / n
    return {"plain enqueue": plain, "Effects.submit": core, "agent run, one effect call": whole}


async def resumed_per_second(box: Outbox, runs: int, calls: int) -> float:
    """Runs resumed per second, each from ``calls`` deferred calls whose intents have settled."""
    tools = tools_for(box)
    agent = Agent(calling(calls), toolsets=[tools.toolset], output_type=[str, DeferredToolRequests])
    suspended: list[tuple[list[ModelMessage], DeferredToolRequests]] = []
    for i in range(runs):
        run = await agent.run("go", conversation_id=f"batch-{i}")
        assert isinstance(run.output, DeferredToolRequests) and len(run.output.calls) == calls
        suspended.append((run.all_messages(), run.output))
        for identities in (m["outbox"] for m in run.output.metadata.values()):
            await operations.cancel(box, identities["action_id"], SETTLER, scope="bench")
    started = time.perf_counter()
    for history, requests in suspended:
        resumed: Any = await tools.settle(agent, history, requests)
        assert resumed is not None and resumed.output == "done"
    return runs / (time.perf_counter() - started)


async def main(n: int, runs: int) -> None:
    with tempfile.TemporaryDirectory() as workdir:
        async with await Outbox.open(f"sqlite:///{Path(workdir) / 'bench.db'}") as box:
            await box.put_destination("sink", DestinationSpec(url="https://sink.example/hook", secret=SECRET))
            costs = await per_call(box, n)
            rate = await resumed_per_second(box, runs, 100)
    baseline = costs["plain enqueue"]
    print(f"overhead per tool call ({n} calls each, library on SQLite):")
    for name, seconds in costs.items():
        print(f"  {name:<28} {seconds * 1e6:>9.0f} us  {seconds / baseline:>5.2f}x")
    print(f"runs resumed per second, 100 deferred calls each ({runs} runs): {rate:.1f}/s "
          f"({rate * 100:.0f} calls answered/s)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=500, help="calls per path for the overhead (default 500)")
    parser.add_argument("--runs", type=int, default=20, help="runs to resume (default 20)")
    options = parser.parse_args()
    asyncio.run(main(options.n, options.runs))
