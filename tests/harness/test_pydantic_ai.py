"""Pydantic AI runs (a scripted ``FunctionModel``, no model service) whose effect tools go
through a real served outbox, its worker and a real receiver behind the idempotency middleware:
what the model is told for each outcome, approvals, and a batch with a call still pending."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from .conftest import PATHS, SCOPE, Service
from .extra import require_pydantic_ai

require_pydantic_ai()

from pydantic_ai import Agent, DeferredToolRequests, ToolApproved  # noqa: E402

from outbox.harness import UNKNOWN, ArgumentsChanged, Effects, Served, action_id  # noqa: E402
from outbox.harness.pydantic_ai import Decision, EffectTools  # noqa: E402

from .models import calling  # noqa: E402

Call = tuple[str, str, dict[str, Any]]


def effect_tools(backend: Served, wait: float = 0.0) -> EffectTools[None]:
    """One effect tool per destination, ``send_<destination>(invoice)``."""
    tools: EffectTools[None] = EffectTools(Effects(backend, wait_seconds=wait), scope=SCOPE)
    for destination in PATHS:
        def send(invoice: int) -> None:
            """Send something about an invoice."""
        tools.tool(destination, name=f"send_{destination}")(send)
    return tools


@pytest.fixture
async def backend(service: Service) -> AsyncIterator[Served]:
    served = Served(service.url, token=service.producer, approver_token=service.operator)
    yield served
    await served.aclose()


def agent_for(tools: EffectTools[None], *calls: Call) -> Agent[None, Any]:
    return Agent(calling(*calls), toolsets=[tools.toolset], output_type=[str, DeferredToolRequests])


async def told(tools: EffectTools[None], *calls: Call, approvals: Mapping[str, Decision] | None = None,
               ) -> dict[str, Any]:
    """Run the calls, settle them (``approvals`` first, then waiting for each outcome) and return
    what the model was told, by tool call id."""
    agent = agent_for(tools, *calls)
    run = await agent.run("go")
    while isinstance(run.output, DeferredToolRequests):
        resumed = await tools.settle(agent, run.all_messages(), run.output, approvals=approvals, wait=10)
        assert resumed is not None
        run, approvals = resumed, None
    answer: dict[str, Any] = json.loads(run.output)
    return answer



async def test_a_delivered_send_tells_the_model_its_external_id(service: Service, backend: Served) -> None:
    answer = await told(effect_tools(backend), ("send_billing", "c1", {"invoice": 42}))
    assert answer["c1"]["outcome"] == "success"
    content = answer["c1"]["content"]
    assert content["status"] == "delivered" and content["attempts"] == 1
    assert content["external_id"].startswith("billing-")
    assert sum(service.effects.keys.values()) == 1


async def test_a_receiver_that_times_out_under_never_is_told_unknown(service: Service, backend: Served) -> None:
    answer = await told(effect_tools(backend), ("send_slow", "c1", {"invoice": 42}))
    content = answer["c1"]["content"]
    assert answer["c1"]["outcome"] == "success"  # a result the model reads, not an error to retry
    assert content["status"] == "unknown" and content["message"] == UNKNOWN
    assert [e["submission"] for e in content["evidence"]] == ["maybe_submitted"]
    assert sum(service.effects.keys.values()) == 1  # it did happen, once: nobody resent it


async def test_a_dead_letter_and_a_revoked_grant_are_failures(service: Service, backend: Served) -> None:
    answer = await told(effect_tools(backend), ("send_gone", "dead", {"invoice": 1}),
                        ("send_refunds", "revoked", {"invoice": 2}))
    assert answer["dead"]["outcome"] == "failed" and "will not help" in str(answer["dead"]["content"])
    assert answer["revoked"]["outcome"] == "failed"
    assert "authority to do this was withdrawn" in str(answer["revoked"]["content"])
    assert sum(service.effects.keys.values()) == 0


async def test_an_approval_given_through_the_harness_approves_the_intent(service: Service,
                                                                          backend: Served) -> None:
    tools = effect_tools(backend)
    agent = agent_for(tools, ("send_wires", "c1", {"invoice": 7}))
    run = await agent.run("go")
    assert isinstance(run.output, DeferredToolRequests)
    [asked] = run.output.approvals
    identities = run.output.metadata["c1"]["outbox"]
    assert identities["payload_digest"] == tools.action(identities["conversation_id"], asked, None).payload_digest
    resumed = await tools.settle(agent, run.all_messages(), run.output, approvals={"c1": True}, wait=10)
    while resumed is not None and isinstance(resumed.output, DeferredToolRequests):
        resumed = await tools.settle(agent, resumed.all_messages(), resumed.output, wait=10)
    assert resumed is not None
    assert json.loads(resumed.output)["c1"]["content"]["status"] == "delivered"
    assert service.effects.keys == {f"{SCOPE}/{identities['action_id']}": 1}


async def test_an_approval_given_elsewhere_is_read_from_the_record_at_the_next_settle(service: Service,
                                                                                    backend: Served) -> None:
    """An operator approves (and another refuses) the held intents in the outbox itself, not
    through the harness: the next ``settle``, given no decisions, resumes with what the outbox
    recorded."""
    tools = effect_tools(backend)
    agent = agent_for(tools, ("send_wires", "yes", {"invoice": 7}), ("send_wires", "no", {"invoice": 8}))
    run = await agent.run("go")
    assert isinstance(run.output, DeferredToolRequests) and len(run.output.approvals) == 2
    approved, refused = run.output.metadata["yes"]["outbox"], run.output.metadata["no"]["outbox"]
    await backend.approve(approved["action_id"], SCOPE, approved["payload_digest"], "looked elsewhere")
    await backend.reject(refused["action_id"], SCOPE, "not today")
    resumed = await tools.settle(agent, run.all_messages(), run.output, wait=10)
    while resumed is not None and isinstance(resumed.output, DeferredToolRequests):
        resumed = await tools.settle(agent, resumed.all_messages(), resumed.output, wait=10)
    assert resumed is not None
    answer = json.loads(resumed.output)
    assert answer["yes"]["content"]["status"] == "delivered"
    assert answer["no"]["outcome"] == "denied"
    assert service.effects.keys == {f"{SCOPE}/{approved['action_id']}": 1}


async def test_an_approval_of_changed_arguments_is_refused(service: Service, backend: Served) -> None:
    tools = effect_tools(backend)
    agent = agent_for(tools, ("send_wires", "c1", {"invoice": 7}))
    run = await agent.run("go")
    assert isinstance(run.output, DeferredToolRequests)
    identities = run.output.metadata["c1"]["outbox"]
    with pytest.raises(ArgumentsChanged):
        await tools.settle(agent, run.all_messages(), run.output,
                           approvals={"c1": ToolApproved(override_args={"invoice": 8})})
    assert (await backend.find(identities["action_id"], SCOPE)).status == "held"  # type: ignore[union-attr]
    answer = await told(tools, ("send_wires", "c2", {"invoice": 9}), approvals={"c2": False})
    assert answer["c2"]["outcome"] == "denied" and "Nothing was sent" in str(answer["c2"]["content"])
    assert sum(service.effects.keys.values()) == 0


async def test_a_batch_with_a_call_still_pending_stays_deferred(service: Service, backend: Served) -> None:
    tools = effect_tools(backend)
    agent = agent_for(tools, ("send_billing", "sent", {"invoice": 1}), ("send_paused", "waiting", {"invoice": 2}))
    run = await agent.run("go")
    assert isinstance(run.output, DeferredToolRequests)
    assert {c.tool_call_id for c in run.output.calls} == {"sent", "waiting"}
    assert await tools.results(run.output, wait=10) is None  # billing settled, paused did not
    assert await tools.settle(agent, run.all_messages(), run.output, wait=0.2) is None
    conversation_id = run.output.metadata["sent"]["outbox"]["conversation_id"]
    assert service.effects.keys == {f"{SCOPE}/{action_id(conversation_id, 'sent')}": 1}
