"""A harness in a process of its own, for the crash test. ``call``: the model calls the effect
tool, the run ends deferred, the message history is stored in HISTORY, and the process says
``stored`` and waits to be killed. ``resume``: a new process restarts from that history, answers
its unanswered call (``recover``), resumes, settles, and prints what the model was told.

    python -m tests.harness.harness_process call|resume HISTORY URL TOKEN
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import ModelMessagesTypeAdapter

from outbox.harness import Effects, Recovery, Served
from outbox.harness.pydantic_ai import EffectTools

from .models import calling


async def main(phase: str, history: Path, url: str, token: str) -> None:
    backend = Served(url, token=token)
    tools: EffectTools[None] = EffectTools(Effects(backend), scope="acme")

    @tools.tool("billing")
    def send_invoice(invoice: int) -> None:
        """Send the customer's invoice."""

    agent = Agent(calling(("send_invoice", "c1", {"invoice": 42})), toolsets=[tools.toolset],
                  output_type=[str, DeferredToolRequests])
    if phase == "call":
        run = await agent.run("send invoice 42")
        assert isinstance(run.output, DeferredToolRequests)
        history.write_bytes(ModelMessagesTypeAdapter.dump_json(run.all_messages()))
        print("stored", flush=True)
        await asyncio.sleep(3600)  # killed here, before any resume
    messages = ModelMessagesTypeAdapter.validate_json(history.read_bytes())
    resumed = await agent.run(message_history=messages, deferred_tool_results=await tools.recover(
        messages, Recovery.DECLARED))
    while isinstance(resumed.output, DeferredToolRequests):
        settled = await tools.settle(agent, resumed.all_messages(), resumed.output, wait=10)
        assert settled is not None, "still pending after 10 s"
        resumed = settled
    print(resumed.output, flush=True)
    await backend.aclose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]))
