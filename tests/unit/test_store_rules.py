"""The store's domain rules (outbox/store/rules.py), decided without a database."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from outbox import (
    DestinationInUse,
    IntentConflict,
    NotFound,
    StaleWrite,
    Status,
    UnknownDestination,
)
from outbox.model import NewIntent
from outbox.store.rules import (
    decide_destination_delete,
    decide_existing,
    decide_initial_status,
    decide_target,
    inserted_intent,
)

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
NEW = NewIntent(action_id="a1", scope="acme", destination="billing", payload_json='{"n":1}',
                payload_digest="sha256:aa", max_attempts=5, next_attempt_at=T0, not_before=None,
                expires_at=T0 + timedelta(days=1), created_at=T0)
EXISTING = inserted_intent(7, NEW, "webhook", Status.PENDING)


# -- enqueue ----------------------------------------------------------------------------------


def test_an_intent_starts_held_when_its_destination_requires_approval_else_pending():
    assert decide_initial_status(NEW, True) is Status.HELD
    assert decide_initial_status(NEW, False) is Status.PENDING


def test_an_unregistered_destination_is_refused():
    with pytest.raises(UnknownDestination, match="destination 'billing' is not registered"):
        decide_initial_status(NEW, None)


def test_the_inserted_intent_is_what_was_written():
    assert (EXISTING.seq, EXISTING.key, EXISTING.status, EXISTING.attempts, EXISTING.fence) == (
        7, "acme/a1", Status.PENDING, 0, 0)
    assert (EXISTING.created_at, EXISTING.updated_at, EXISTING.expires_at) == (T0, T0, T0 + timedelta(days=1))
    assert EXISTING.lease_owner is None and EXISTING.approved_digest is None


def test_the_same_operation_again_is_the_existing_intent_not_created():
    again = replace(NEW, next_attempt_at=T0 + timedelta(minutes=1), created_at=T0 + timedelta(minutes=1))
    result = decide_existing(EXISTING, again)
    assert result.intent is EXISTING and not result.created


@pytest.mark.parametrize(
    "changes,named,unnamed",
    [
        ({"payload_digest": "sha256:bb"}, ["payload_digest 'sha256:aa' (this request: 'sha256:bb')"], "destination"),
        ({"destination": "crm"}, ["destination 'billing' (this request: 'crm')"], "payload_digest"),
        ({"destination": "crm", "payload_digest": "sha256:bb"}, ["destination", "payload_digest"], None),
    ],
)
def test_another_operation_under_the_same_key_is_a_conflict_naming_what_differs(changes, named, unnamed):
    with pytest.raises(IntentConflict) as raised:
        decide_existing(EXISTING, replace(NEW, **changes))
    message = raised.value.message
    assert message.startswith("action_id 'a1' already exists in scope 'acme' with ")
    assert all(part in message for part in named)
    assert unnamed is None or unnamed not in message
    assert message.endswith("never reused for another")


# -- changes ----------------------------------------------------------------------------------


def test_a_change_applies_only_to_the_status_and_fence_it_expects():
    assert decide_target("acme/a1", ("leased", 3), expected=Status.LEASED, fence=3) is None
    assert decide_target("acme/a1", ("leased", 3), expected=Status.LEASED, fence=None) is None
    missing = decide_target("acme/a1", None, expected=Status.LEASED, fence=3)
    assert isinstance(missing, NotFound) and missing.message == "intent 'acme/a1' does not exist"
    moved = decide_target("acme/a1", ("pending", 3), expected=Status.LEASED, fence=None)
    assert isinstance(moved, StaleWrite)
    assert moved.message == "intent 'acme/a1' is pending at fence 3, not leased; the write was not applied"
    fenced = decide_target("acme/a1", ("leased", 4), expected=Status.LEASED, fence=3)
    assert isinstance(fenced, StaleWrite)
    assert fenced.message == "intent 'acme/a1' is leased at fence 4, not leased at fence 3; the write was not applied"


# -- destinations -----------------------------------------------------------------------------


def test_a_destination_is_deleted_only_when_nothing_refers_to_it():
    decide_destination_delete("crm", exists=True, waiting=0, in_history=False, grants=[])
    with pytest.raises(NotFound, match="'crm' is not registered"):
        decide_destination_delete("crm", exists=False, waiting=0, in_history=False, grants=[])
    with pytest.raises(DestinationInUse, match="has 2 intent\\(s\\) still waiting"):
        decide_destination_delete("crm", exists=True, waiting=2, in_history=True, grants=["g1"])
    with pytest.raises(DestinationInUse, match="disable it instead"):
        decide_destination_delete("crm", exists=True, waiting=0, in_history=True, grants=["g1"])
    with pytest.raises(DestinationInUse, match="named by grants 'g1', 'g2'; delete them first"):
        decide_destination_delete("crm", exists=True, waiting=0, in_history=False, grants=["g1", "g2"])
