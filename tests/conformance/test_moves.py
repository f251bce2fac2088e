"""The conformance suite's tests of the lifecycle's moves: every move of ``outbox.model.MOVES``
by name, made through ``Store.apply`` (the claim through ``apply``'s claim and ``Store.claim``,
the sweeper's recovery through ``Store.recover``), and the contract of a batch of changes. They
run on every backend of ``backends.STORE_FACTORIES``, with the fixtures of ``test_store.py``;
a move added to ``MOVES`` without a test here fails ``test_every_move_is_made_by_name``.
"""
# ruff: noqa: F811 (the suite's fixtures are imported by name, and the functions here take them by that name)

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import fields, replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from outbox import Event, IllegalTransition, Intent, NotFound, Outcome, StaleWrite, Status, Submission
from outbox.model import (
    MOVES,
    Approve,
    Attempt,
    Cancel,
    Hold,
    Reject,
    Release,
    Replay,
    Resolve,
    Settle,
    Start,
)
from outbox.store import Store
from outbox.store.protocol import Claim

from .test_store import T0, new, open_store, store, store_factory  # noqa: F401 (fixtures)
from .test_store import attempt as numbered

LEASE = timedelta(seconds=30)

async def leased(store: Store, action_id: str, *, dest: str = "billing", lease: timedelta = LEASE) -> Intent:
    """A new intent, claimed by ``w1`` at T0 (fence 1)."""
    await store.insert_intent(*new(action_id, dest=dest))
    [intent] = await store.claim("w1", now=T0, lease_until=T0 + lease, limit=1)
    return intent


def attempt(key: str, number: int, fence: int, *, at: datetime = T0) -> Attempt:
    """Attempt ``number`` of intent ``key``, started at ``at`` under ``fence`` (its id unique in the store)."""
    return replace(numbered(number, fence, at=at), attempt_id=f"{key}/{number}")


def finished(started: Attempt, outcome: Outcome = Outcome.DELIVERED, **facts: Any) -> Attempt:
    """``started`` as it finished a second later, submitted."""
    return replace(started, finished_at=started.started_at + timedelta(seconds=1), submission=Submission.SUBMITTED,
                   outcome=outcome, **facts)


def event(kind: str, seconds: int = 1, actor: str = "w1", **data: Any) -> Event:
    return Event(kind=kind, at=T0 + timedelta(seconds=seconds), actor=actor, data=data)


def moved(name: str, before: Intent, after: Intent) -> dict[str, Any]:
    """The columns ``after`` changed from ``before``, checked against move ``name``: only columns
    it sets or clears change (besides status and updated_at), and those it clears are null."""
    move = MOVES[name]
    changed = {f.name: getattr(after, f.name) for f in fields(Intent)
               if getattr(after, f.name) != getattr(before, f.name)}
    assert set(changed) <= {*move.sets, *move.clears, "status", "updated_at"}, f"{name} changed {sorted(changed)}"
    assert all(getattr(after, column) is None for column in move.clears), f"{name} left a column it clears"
    assert after.status in move.targets
    return changed


async def events_since(store: Store, key: str, before: int) -> list[Event]:
    return (await store.history(key)).events[before:]


async def applied_one(store: Store, change: Any) -> Any:
    """Apply one change alone; its result."""
    result = await store.apply([change])
    assert result.claimed == []
    [answer] = result.results
    return answer


# -- each move by name ------------------------------------------------------------------------


async def make_claim(store: Store) -> None:
    await store.insert_intents([new("c1"), new("c2", at=T0 + timedelta(seconds=1))])
    at = T0 + timedelta(seconds=5)
    [first] = await store.claim("w1", now=at, lease_until=at + LEASE, limit=1)
    assert (first.action_id, first.status, first.lease_owner, first.lease_expires_at, first.fence,
            first.updated_at) == ("c1", Status.LEASED, "w1", at + LEASE, 1, at)
    assert first == await store.get_intent("acme/c1")
    before = await store.get_intent("acme/c2")
    release = Release("acme/c1", 1, next_attempt_at=at, events=(event("released", 5),))
    applied = await store.apply([release], claim=Claim("w2", now=at, lease_until=at + 2 * LEASE, limit=5))
    assert applied.results == [None]
    # the claim runs after the changes: c1, given back, is leased again (oldest due first)
    assert [(i.action_id, i.lease_owner, i.fence) for i in applied.claimed] == [("c2", "w2", 1), ("c1", "w2", 2)]
    after = await store.get_intent("acme/c2")
    assert after == applied.claimed[0]
    assert moved("claim", before, after) == {"status": Status.LEASED, "lease_owner": "w2",
                                             "lease_expires_at": at + 2 * LEASE, "fence": 1, "updated_at": at}
    events = (await store.history("acme/c2")).events
    assert [(e.kind.value, e.at, e.actor, dict(e.data)) for e in events[1:]] == [("leased", at, "w2", {"fence": 1})]
    assert (await store.history("acme/c2")).attempts == []


async def make_start(store: Store) -> None:
    before = await leased(store, "s1")
    started = attempt(before.key, 1, before.fence, at=T0 + timedelta(seconds=2))
    assert await applied_one(store, Start(before.key, before.fence, started, event("attempt_started", 2))) is None
    after = await store.get_intent(before.key)
    assert after.status is Status.LEASED and after.lease_owner == "w1" and after.fence == before.fence
    moved("start", before, after)
    history = await store.history(before.key)
    assert history.attempts == [started]  # recorded unfinished, before the send
    assert history.events[2:] == [event("attempt_started", 2)]


async def make_settle(store: Store) -> None:
    before = await leased(store, "d1")
    started = attempt(before.key, 1, 1)
    await applied_one(store, Start(before.key, 1, started, event("attempt_started")))
    done = finished(started, status_code=200, external_id="ext-1")
    settled = (event("attempt_finished", 2), event("delivered", 2))
    assert await applied_one(store, Settle(before.key, 1, Status.DELIVERED, settled, attempts=1, attempt=done)) is None
    after = await store.get_intent(before.key)
    assert moved("settle", before, after) == {
        "status": Status.DELIVERED, "attempts": 1, "lease_owner": None, "lease_expires_at": None,
        "updated_at": T0 + timedelta(seconds=2)}
    history = await store.history(before.key)
    assert history.attempts == [done]  # the started row, finished
    assert history.events[3:] == list(settled)

    # a retry whose attempt was never recorded as started (inserted finished), at a raised fence
    before = await leased(store, "r1")
    done = finished(attempt(before.key, 1, 1), Outcome.RETRYABLE, status_code=503, error="503")
    due = T0 + timedelta(minutes=1)
    settled = (event("attempt_finished", 2), event("scheduled_retry", 2))
    change = Settle(before.key, 1, Status.PENDING, settled, last_error="503", next_attempt_at=due, attempts=1,
                    attempt=done, new_fence=7)
    assert await applied_one(store, change) is None
    after = await store.get_intent(before.key)
    assert moved("settle", before, after) == {
        "status": Status.PENDING, "attempts": 1, "last_error": "503", "next_attempt_at": due, "fence": 7,
        "lease_owner": None, "lease_expires_at": None, "updated_at": T0 + timedelta(seconds=2)}
    history = await store.history(before.key)
    assert history.attempts == [done]
    assert history.events[2:] == list(settled)


async def make_release(store: Store) -> None:
    before = await leased(store, "u1")
    due = T0 + timedelta(seconds=10)
    assert await applied_one(store, Release(before.key, 1, due, (event("released"),))) is None
    after = await store.get_intent(before.key)
    assert moved("release", before, after) == {
        "status": Status.PENDING, "next_attempt_at": due, "lease_owner": None, "lease_expires_at": None,
        "updated_at": T0 + timedelta(seconds=1)}
    assert await events_since(store, before.key, 2) == [event("released")]
    assert (await store.history(before.key)).attempts == []


async def make_hold(store: Store) -> None:
    before = await leased(store, "h1")
    reason = "destination 'billing' requires approval of this payload"
    assert await applied_one(store, Hold(before.key, 1, reason, (event("held"),))) is None
    after = await store.get_intent(before.key)
    assert moved("hold", before, after) == {
        "status": Status.HELD, "last_error": reason, "lease_owner": None, "lease_expires_at": None,
        "updated_at": T0 + timedelta(seconds=1)}
    assert await events_since(store, before.key, 2) == [event("held")]


async def make_recover(store: Store) -> None:
    before = await leased(store, "x1", lease=timedelta(seconds=10))
    now = T0 + timedelta(seconds=11)
    assert await store.recover(now, 10, "sweeper") == 1
    after = await store.get_intent(before.key)
    assert moved("recover", before, after) == {
        "status": Status.PENDING, "next_attempt_at": now, "fence": 2, "lease_owner": None,
        "lease_expires_at": None, "updated_at": now}
    [expired] = await events_since(store, before.key, 2)
    assert (expired.kind.value, expired.at, expired.actor) == ("lease_expired", now, "sweeper")
    assert await store.recover(now, 10, "sweeper") == 0


async def dead(store: Store, action_id: str, status: Status = Status.DEAD) -> Intent:
    """A new intent settled (by its first, rejected attempt) in ``status``."""
    intent = await leased(store, action_id)
    done = finished(attempt(intent.key, 1, 1), Outcome.REJECTED, status_code=400, error="400")
    await applied_one(store, Settle(intent.key, 1, status, (event("attempt_finished"), event("dead_lettered")),
                                    last_error="400", attempts=1, attempt=done))
    return await store.get_intent(intent.key)


async def make_replay(store: Store) -> None:
    before = await dead(store, "p1")
    due = T0 + timedelta(minutes=5)
    answer = await applied_one(store, Replay(before.key, Status.DEAD, due, 6, (event("replayed", 9, "op"),)))
    after = await store.get_intent(before.key)
    assert answer == after
    assert moved("replay", before, after) == {
        "status": Status.PENDING, "next_attempt_at": due, "max_attempts": 6, "last_error": None,
        "updated_at": T0 + timedelta(seconds=9), "replayed_after": 1}
    assert after.attempts == 1  # the attempts made stay counted (a retry schedule starts over after them)
    assert await events_since(store, before.key, 4) == [event("replayed", 9, "op")]


async def make_resolve(store: Store) -> None:
    before = await dead(store, "v1", Status.UNKNOWN)
    answer = await applied_one(store, Resolve(before.key, Status.DELIVERED, (event("resolved", 9, "op"),)))
    assert answer == await store.get_intent(before.key)
    assert moved("resolve", before, answer) == {"status": Status.DELIVERED, "updated_at": T0 + timedelta(seconds=9)}
    assert await events_since(store, before.key, 4) == [event("resolved", 9, "op")]

    before = await dead(store, "v2", Status.UNKNOWN)
    due = T0 + timedelta(minutes=5)
    answer = await applied_one(store, Resolve(before.key, Status.PENDING, (event("resolved", 9, "op"),),
                                              next_attempt_at=due, max_attempts=9))
    assert answer == await store.get_intent(before.key)
    assert moved("resolve", before, answer) == {
        "status": Status.PENDING, "next_attempt_at": due, "max_attempts": 9, "updated_at": T0 + timedelta(seconds=9),
        "replayed_after": 1}


async def make_cancel(store: Store) -> None:
    await store.insert_intent(*new("k1"))
    before = await store.get_intent("acme/k1")
    answer = await applied_one(store, Cancel(before.key, Status.PENDING, (event("cancelled", 9, "op"),)))
    assert answer == await store.get_intent(before.key)
    assert moved("cancel", before, answer) == {"status": Status.CANCELLED, "updated_at": T0 + timedelta(seconds=9)}
    assert await events_since(store, before.key, 1) == [event("cancelled", 9, "op")]


async def make_approve(store: Store) -> None:
    await store.insert_intent(*new("a1", dest="approvals"))
    before = await store.get_intent("acme/a1")
    assert before.status is Status.HELD
    until, due = T0 + timedelta(hours=1), T0 + timedelta(seconds=9)
    answer = await applied_one(store, Approve(before.key, "sha256:aa", until, "op", due, (event("approved", 9, "op"),)))
    assert answer == await store.get_intent(before.key)
    assert moved("approve", before, answer) == {
        "status": Status.PENDING, "approved_digest": "sha256:aa", "approval_expires_at": until, "approved_by": "op",
        "next_attempt_at": due, "updated_at": due}
    assert await events_since(store, before.key, 1) == [event("approved", 9, "op")]


async def make_reject(store: Store) -> None:
    await store.insert_intent(*new("j1", dest="approvals"))
    before = await store.get_intent("acme/j1")
    answer = await applied_one(store, Reject(before.key, (event("rejected", 9, "op"),)))
    assert answer == await store.get_intent(before.key)
    assert moved("reject", before, answer) == {"status": Status.CANCELLED, "updated_at": T0 + timedelta(seconds=9)}
    assert await events_since(store, before.key, 1) == [event("rejected", 9, "op")]


#: How each move is made and checked, by name.
MAKE: dict[str, Callable[[Store], Awaitable[None]]] = {
    "claim": make_claim, "start": make_start, "settle": make_settle, "release": make_release, "hold": make_hold,
    "recover": make_recover, "replay": make_replay, "resolve": make_resolve, "cancel": make_cancel,
    "approve": make_approve, "reject": make_reject,
}


@pytest.mark.parametrize("name", list(MOVES))
async def test_every_move_is_made_by_name(store, name):
    assert name in MAKE, f"move {name!r} has no conformance test: add one to MAKE"
    await MAKE[name](store)


# -- a batch of changes -----------------------------------------------------------------------


async def test_a_stale_fence_in_a_batch_is_refused_alone_and_the_rest_applies(store):
    a, b, c = [await leased(store, name) for name in ("a", "b", "c")]
    before = await store.history(b.key)
    applied = await store.apply([
        Settle(a.key, 1, Status.DELIVERED, (event("delivered"),), attempts=1),
        Settle(b.key, 2, Status.DELIVERED, (event("delivered"),), attempts=1),
        Release(c.key, 1, T0, (event("released"),)),
    ])
    assert applied.results[0] is None and applied.results[2] is None
    refused = applied.results[1]
    assert isinstance(refused, StaleWrite)
    assert str(refused) == "intent 'acme/b' is leased at fence 1, not leased at fence 2; the write was not applied"
    assert await store.history(b.key) == before  # nothing of it written
    assert [(await store.get_intent(i.key)).status for i in (a, c)] == [Status.DELIVERED, Status.PENDING]


async def test_a_missing_intent_in_a_batch_is_not_found_in_its_place(store):
    a = await leased(store, "a")
    applied = await store.apply([Cancel("acme/nope", Status.PENDING, (event("cancelled"),)),
                                 Release(a.key, 1, T0, (event("released"),))])
    assert isinstance(applied.results[0], NotFound) and applied.results[1] is None
    assert (await store.get_intent(a.key)).status is Status.PENDING


async def test_a_start_on_an_expired_lease_is_refused(store):
    intent = await leased(store, "e1", lease=timedelta(seconds=10))
    late = attempt(intent.key, 1, 1, at=T0 + timedelta(seconds=10))  # the lease ends as it starts
    [refused] = (await store.apply([Start(intent.key, 1, late, event("attempt_started", 10))])).results
    assert isinstance(refused, StaleWrite)
    history = await store.history(intent.key)
    assert history.attempts == [] and [e.kind.value for e in history.events] == ["enqueued", "leased"]
    in_time = attempt(intent.key, 1, 1, at=T0 + timedelta(seconds=9))
    assert (await store.apply([Start(intent.key, 1, in_time, event("attempt_started", 9))])).results == [None]
    assert (await store.history(intent.key)).attempts == [in_time]


async def test_a_start_leaves_the_intent_row_as_it_was(store):
    intent = await leased(store, "s1")
    started = attempt(intent.key, 1, 1, at=T0 + timedelta(seconds=3))
    await store.apply([Start(intent.key, 1, started, event("attempt_started", 3))])
    after = await store.get_intent(intent.key)
    assert after == intent  # attempts counts settled attempts; updated_at is the claim's
    assert (after.attempts, after.updated_at) == (0, T0)


async def test_a_key_named_twice_in_a_batch_is_changed_in_turn(store):
    intent = await leased(store, "t1")
    started = attempt(intent.key, 1, 1)
    done = finished(started)
    applied = await store.apply([
        Start(intent.key, 1, started, event("attempt_started")),
        Settle(intent.key, 1, Status.DELIVERED, (event("delivered", 2),), attempts=1, attempt=done),
        Release(intent.key, 1, T0, (event("released", 3),)),  # sees the intent delivered
    ])
    assert applied.results[:2] == [None, None]
    assert isinstance(applied.results[2], StaleWrite)
    history = await store.history(intent.key)
    assert history.intent.status is Status.DELIVERED and history.attempts == [done]
    assert [e.kind.value for e in history.events] == ["enqueued", "leased", "attempt_started", "delivered"]


async def test_a_change_its_move_cannot_make_raises_and_writes_nothing_of_the_batch(store):
    a, b = await leased(store, "a"), await leased(store, "b")
    with pytest.raises(IllegalTransition):
        await store.apply([Release(a.key, 1, T0, (event("released"),)),
                           Settle(b.key, 1, Status.HELD, (event("held"),))])
    for intent in (a, b):
        history = await store.history(intent.key)
        assert history.intent == intent and len(history.events) == 2


async def test_an_apply_that_fails_fails_alone_beside_the_applies_made_with_it(store):
    intents = [await leased(store, f"g{i}") for i in range(4)]
    unwritable = Event(kind="released", at=T0, actor="w1", data={"what": object()})  # no JSON holds it
    answers = await asyncio.gather(
        store.apply([Release(intents[0].key, 1, T0, (unwritable,))]),
        *(store.apply([Release(i.key, 1, T0, (event("released"),))]) for i in intents[1:]),
        return_exceptions=True)
    assert isinstance(answers[0], TypeError)
    assert [a.results for a in answers[1:]] == [[None]] * 3
    history = await store.history(intents[0].key)
    assert history.intent == intents[0] and len(history.events) == 2
    assert [(await store.get_intent(i.key)).status for i in intents[1:]] == [Status.PENDING] * 3


async def test_operator_changes_answer_the_intent_as_it_became(store):
    worker = await leased(store, "o3")
    await store.insert_intents([new("o1"), new("o2", dest="approvals")])
    applied = await store.apply([
        Cancel("acme/o1", Status.PENDING, (event("cancelled", 5, "op"),)),
        Release(worker.key, 1, T0, (event("released"),)),
        Reject("acme/o2", (event("rejected", 6, "op"),)),
    ])
    cancelled, released, rejected = applied.results
    assert released is None
    assert cancelled == await store.get_intent("acme/o1") and cancelled.status is Status.CANCELLED
    assert rejected == await store.get_intent("acme/o2") and rejected.updated_at == T0 + timedelta(seconds=6)


async def test_recover_gives_back_only_expired_leases_with_no_attempt_in_flight(store):
    idle, busy = [await leased(store, name, lease=timedelta(seconds=10)) for name in ("idle", "busy")]
    live = await leased(store, "live", lease=timedelta(minutes=5))
    started = attempt(busy.key, 1, 1)
    await store.apply([Start(busy.key, 1, started, event("attempt_started"))])
    now = T0 + timedelta(seconds=20)
    assert await store.recover(now, 10, "sweeper") == 1
    recovered = await store.get_intent(idle.key)
    assert (recovered.status, recovered.fence, recovered.lease_owner) == (Status.PENDING, 2, None)
    assert [e.kind.value for e in (await store.history(idle.key)).events][-1] == "lease_expired"
    assert await store.get_intent(live.key) == live
    assert (await store.get_intent(busy.key)).status is Status.LEASED
    assert [(i.key, a) for i, a in await store.expired_leases(now, 10)] == [(busy.key, started)]
