"""The core against a real served outbox whose worker delivers to a real receiver behind the
idempotency middleware, over HTTP (``Served``) and through the library (``Local``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from outbox import Outbox
from outbox.client import InvalidInput
from outbox.harness import (
    UNRECORDED,
    Action,
    ApprovalNeeded,
    ArgumentsChanged,
    Effects,
    Failed,
    Local,
    Pending,
    Recovery,
    Returned,
    Served,
)

from .conftest import SCOPE, Service


def call(tool_call_id: str, destination: str = "billing", **arguments: object) -> Action:
    return Action("conv-1", tool_call_id, f"send_{destination}", destination, SCOPE, arguments or {"invoice": 42})


@pytest.fixture
async def served(service: Service) -> AsyncIterator[Served]:
    backend = Served(service.url, token=service.producer, approver_token=service.operator)
    yield backend
    await backend.aclose()


async def test_a_call_is_one_intent_however_often_it_is_submitted(service: Service, served: Served) -> None:
    effects = Effects(served)
    first = await effects.submit(call("c1"))
    assert isinstance(first, Pending)
    settled = await effects.outcome(first.action_id, SCOPE, wait=10)
    assert isinstance(settled, Returned) and settled.value["status"] == "delivered"
    assert await effects.submit(call("c1")) == settled  # the same intent, answered from its record
    assert service.effects.keys == {f"{SCOPE}/{first.action_id}": 1}


async def test_a_submission_that_settles_within_the_wait_is_answered_at_once(served: Served) -> None:
    dead = await Effects(served, wait_seconds=10).submit(call("c2", "gone"))
    assert isinstance(dead, Failed) and "answered 400" in dead.message


async def test_an_approval_binds_the_digest_and_is_refused_for_other_arguments(service: Service,
                                                                               served: Served) -> None:
    effects = Effects(served)
    held = await effects.submit(call("c3", "wires"))
    assert isinstance(held, ApprovalNeeded) and held.payload_digest == call("c3").payload_digest
    with pytest.raises(ArgumentsChanged):
        await effects.approve(held, call("c3", "wires", invoice=43), reason="checked")
    with pytest.raises(InvalidInput):  # the outbox itself refuses a digest its intent does not carry
        await served.approve(held.action_id, SCOPE, call("c9", invoice=43).payload_digest, "checked")
    assert (await served.find(held.action_id, SCOPE)).status == "held"  # type: ignore[union-attr]
    await effects.approve(held, call("c3", "wires"), reason="checked")
    delivered = await effects.outcome(held.action_id, SCOPE, wait=10)
    assert isinstance(delivered, Returned) and delivered.value["status"] == "delivered"


async def test_recovery_answers_from_the_record_and_by_the_policy_without_one(served: Served) -> None:
    effects = Effects(served)
    assert await effects.recovered(call("never-sent"), Recovery.DECLARED) is None  # run again: enqueue it now
    assert await effects.recovered(call("never-sent"), Recovery.NEVER) == Returned(
        {"status": "unknown", "message": UNRECORDED})
    sent = await effects.submit(call("c4"))
    assert isinstance(sent, Pending)
    settled = await effects.outcome(sent.action_id, SCOPE, wait=10)
    assert await effects.recovered(call("c4"), Recovery.NEVER) == settled
    with pytest.raises(ArgumentsChanged):
        await effects.recovered(call("c4", invoice=41), Recovery.DECLARED)


async def test_the_library_backend_records_the_same_intent(service: Service, served: Served) -> None:
    async with await Outbox.open(service.database) as box:
        local = Effects(Local(box))
        pending = await local.submit(call("c5"))
        assert isinstance(pending, Pending)
        over_http = await Effects(served).outcome(pending.action_id, SCOPE, wait=10)
        assert await local.outcome(pending.action_id, SCOPE) == over_http
