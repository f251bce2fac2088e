"""A harness process killed with SIGKILL after the model's tool call and before the resume, and
restarted from its stored message history: the same intent (nothing enqueued twice), one effect
at the receiver, and the model told the true outcome. And the recovery policy for the calls of
other tools that a crash left without a result."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ..conftest import rows
from .conftest import SCOPE, Service
from .extra import require_pydantic_ai

require_pydantic_ai()

from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.messages import ModelRequest, ModelResponse, ToolCallPart, UserPromptPart  # noqa: E402

from outbox.harness import UNRECORDED, Effects, Recovery, Served, action_id  # noqa: E402
from outbox.harness.pydantic_ai import EffectTools  # noqa: E402

from .models import calling  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def harness(phase: str, history: Path, service: Service) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.harness.harness_process", phase, str(history), service.url,
                             service.producer], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")})


async def test_a_harness_killed_before_the_resume_resumes_from_its_history(tmp_path: Path,
                                                                           service: Service) -> None:
    history = tmp_path / "history.json"
    first = harness("call", history, service)
    assert first.stdout is not None and first.stdout.readline() == "stored\n", first.communicate()
    os.kill(first.pid, signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL
    conversation = next(m["conversation_id"] for m in json.loads(history.read_text()) if m.get("conversation_id"))

    second = harness("resume", history, service)
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    answer = json.loads(out)["c1"]
    assert answer["content"]["status"] == "delivered"  # the true outcome
    key = action_id(conversation, "c1")
    assert await rows(service.database, "SELECT action_id FROM intents") == [(key,)]  # the same intent
    assert service.effects.keys == {f"{SCOPE}/{key}": 1}  # one effect


def crashed_history(*calls: tuple[str, str]) -> list[Any]:
    """A stored history that ends with the model's tool calls, none of them answered."""
    return [ModelRequest(parts=[UserPromptPart("go")], conversation_id="conv-9"),
            ModelResponse(parts=[ToolCallPart(tool, {}, tool_call_id=id_) for tool, id_ in calls],
                          conversation_id="conv-9")]


@pytest.mark.parametrize(("policy", "reran", "unknown"), [
    (Recovery.DECLARED, ["lookup"], {"note"}), (Recovery.NEVER, [], {"lookup", "note"}),
    (Recovery.ALWAYS, ["lookup", "note"], set())])
async def test_other_tools_calls_follow_the_policy(service: Service, policy: Recovery, reran: list[str],
                                                   unknown: set[str]) -> None:
    backend = Served(service.url, token=service.producer)
    tools: EffectTools[None] = EffectTools(Effects(backend), scope=SCOPE, retry_safe={"lookup"})
    ran: list[str] = []
    agent = Agent(calling(), toolsets=[tools.toolset])

    @agent.tool_plain
    def lookup() -> str:
        ran.append("lookup")
        return "found"

    @agent.tool_plain
    def note() -> str:
        ran.append("note")
        return "noted"

    history = crashed_history(("lookup", "l1"), ("note", "n1"))
    run = await agent.run(message_history=history, deferred_tool_results=await tools.recover(history, policy))
    answers = json.loads(run.output)
    assert sorted(ran) == reran
    assert {tool for tool, id_ in (("lookup", "l1"), ("note", "n1"))
            if answers[id_]["content"] == {"status": "unknown", "message": UNRECORDED}} == unknown
    await backend.aclose()
