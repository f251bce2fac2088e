"""The rules of the moves both dialects share (outbox/store/moves.py), decided without a database."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from outbox import Event, EventKind, Outcome, StaleWrite, Status, Submission
from outbox.errors import NotFound
from outbox.model import Approve, Cancel, Hold, Reject, Release, Replay, Resolve, Settle, Start, expected_status
from outbox.store import moves

from .test_model import CHANGES, EV, STARTED, T0

LATER = T0 + timedelta(seconds=3)
LAST = Event(kind="delivered", at=LATER, actor="w")
DONE = replace(STARTED, finished_at=LATER, submission=Submission.SUBMITTED, outcome=Outcome.DELIVERED)


def test_the_operators_changes_are_answered_with_the_intent():
    assert {"replay", "resolve", "cancel", "approve", "reject"} == moves.ANSWERED


@pytest.mark.parametrize("change,status", list(zip(CHANGES, [
    Status.LEASED, Status.LEASED, Status.LEASED, Status.LEASED,  # start, settle, release, hold
    Status.DEAD, Status.UNKNOWN, Status.PENDING, Status.HELD, Status.HELD,  # replay, resolve, cancel, approve, reject
], strict=True)), ids=[change.move for change in CHANGES])
def test_a_change_expects_one_status(change, status):
    assert expected_status(change) is status


def test_a_change_whose_move_starts_in_several_statuses_expects_the_one_its_caller_saw():
    assert expected_status(Replay("acme/a1", Status.REVOKED, T0, 5, (EV,))) is Status.REVOKED
    assert expected_status(Cancel("acme/a1", Status.HELD, (EV,))) is Status.HELD


@pytest.mark.parametrize("change", CHANGES, ids=lambda change: change.move)
def test_the_workers_changes_are_fenced_and_the_operators_are_not(change):
    assert moves.fence(change) == (None if change.move in moves.ANSWERED else 1)


@pytest.mark.parametrize("change,values", [
    (Start("acme/a1", 1, STARTED, EV), ()),
    (Settle("acme/a1", 1, Status.PENDING, (EV, LAST), last_error="503", next_attempt_at=LATER, attempts=2,
            attempt=DONE, new_fence=4), (Status.PENDING, "503", LATER, 2, 4, LATER)),
    (Settle("acme/a1", 1, Status.DELIVERED, (LAST,)), (Status.DELIVERED, None, None, None, None, LATER)),
    (Release("acme/a1", 1, T0, (LAST,)), (T0, LATER)),
    (Hold("acme/a1", 1, "needs approval", (LAST,)), ("needs approval", LATER)),
    (Replay("acme/a1", Status.DEAD, T0, 6, (LAST,)), (T0, 6, LATER)),
    (Resolve("acme/a1", Status.DELIVERED, (LAST,)), (Status.DELIVERED, None, None, LATER)),
    (Approve("acme/a1", "sha256:aa", LATER, "op", T0, (LAST,)), ("sha256:aa", LATER, "op", T0, LATER)),
    (Cancel("acme/a1", Status.PENDING, (EV, LAST)), (LATER,)),
    (Reject("acme/a1", (LAST,)), (LATER,)),
], ids=lambda value: getattr(value, "move", ""))
def test_a_change_writes_its_values_in_its_blocks_order_its_last_events_time_last(change, values):
    assert moves.written(change) == values


def test_a_change_records_its_attempt():
    assert moves.attempt(Start("acme/a1", 1, STARTED, EV)) == STARTED
    assert moves.attempt(Settle("acme/a1", 1, Status.DELIVERED, (EV, LAST), attempts=1, attempt=DONE)) == DONE
    assert moves.attempt(Settle("acme/a1", 1, Status.DEAD, (LAST,))) is None
    assert all(moves.attempt(change) is None for change in CHANGES[2:])


def test_a_start_is_refused_once_its_lease_has_ended():
    start = Start("acme/a1", 1, replace(STARTED, started_at=T0), EV)
    assert moves.refusal(start, ("leased", 1, T0 + timedelta(microseconds=1))) is None
    unended = moves.refusal(start, ("leased", 1, None))  # (as PostgreSQL's cycle judges it: no end runs for no one)
    assert isinstance(unended, StaleWrite) and unended.message == (
        "intent 'acme/a1''s lease has no end recorded, so it does not run when its attempt starts at "
        "2030-01-01T00:00:00+00:00; the write was not applied")
    for ended in (T0, T0 - timedelta(seconds=1)):
        refused = moves.refusal(start, ("leased", 1, ended))
        assert isinstance(refused, StaleWrite)
    assert refused.message == ("intent 'acme/a1''s lease ended at 2029-12-31T23:59:59+00:00, before its attempt "
                               "started at 2030-01-01T00:00:00+00:00; the write was not applied")


def test_a_recovered_lease_is_told_by_the_sweeper_with_its_owner_and_when_it_is_due():
    event = moves.recovered_event("w7", LATER, "sweeper")
    assert (event.kind, event.at, event.actor, event.reason, dict(event.data)) == (
        EventKind.LEASE_EXPIRED, LATER, "sweeper", "lease of w7 expired before any attempt started",
        {"next_attempt_at": LATER.isoformat()})


def test_a_change_is_refused_as_the_rules_word_it_when_its_intent_is_gone_or_moved_on():
    settle = Settle("acme/a1", 1, Status.DELIVERED, (LAST,))
    assert isinstance(moves.refusal(settle, None), NotFound)
    assert "is pending at fence 1, not leased at fence 1" in str(moves.refusal(settle, ("pending", 1, None)))
    assert "is leased at fence 2, not leased at fence 1" in str(moves.refusal(settle, ("leased", 2, None)))
    assert moves.refusal(settle, ("leased", 1, T0)) is None  # only a start asks whether the lease runs


def test_a_key_named_again_in_a_batch_waits_for_a_later_round():
    changes = [Cancel(f"acme/{key}", Status.PENDING, (EV,)) for key in ("a", "b", "a", "c", "a")]
    assert [list(r) for r in moves.rounds(changes)] == [[0, 1], [2, 3], [4]]
    assert moves.rounds([]) == []
