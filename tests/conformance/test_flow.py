"""Flow control per destination in the store's claim (``outbox.flow``): max_in_flight, the rate
limit's token bucket and a receiver's pause, each held for every claimer together; what they
hold back stays pending, unattempted, with no event. Part of the conformance suite: run on every
backend of ``backends.STORE_FACTORIES``, with the fixtures of ``test_store.py``."""
# ruff: noqa: F811 (the suite's fixtures are imported by name, and the functions here take them by that name)

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from outbox import Event, OnUnknown, Status
from outbox.flow import MIN_PER_SECOND, Held, Limit, RateLimit
from outbox.model import Ordering, Settle
from outbox.store import Store
from outbox.store.protocol import Applied, Claim
from outbox.store.records import LAST

from .backends import CALLER_SQL
from .test_store import T0, destination, new, open_store, store, store_factory  # noqa: F401 (fixtures)


async def claimed(store: Store, now: datetime = T0, limit: int = 50, owner: str = "w1") -> Applied:
    return await store.apply([], claim=Claim(owner, now, now + timedelta(seconds=30), limit))


def ids(applied: Applied) -> list[str]:
    return sorted(i.action_id for i in applied.claimed)


async def test_max_in_flight_caps_a_destinations_leased_intents_until_an_outcome_frees_a_place(store):
    await store.put_destination(destination("capped", max_in_flight=2))
    assert (await store.get_destination("capped")).max_in_flight == 2
    await store.insert_intents([new(f"c{i}", dest="capped", at=T0 + timedelta(seconds=i)) for i in range(5)])
    await store.insert_intent(*new("b1"))
    first = await claimed(store, T0 + timedelta(minutes=1))
    assert ids(first) == ["b1", "c0", "c1"]  # the oldest two of capped; billing has no limit
    assert first.held == [Held("capped", Limit.IN_FLIGHT, 3)]
    again = await claimed(store, T0 + timedelta(minutes=1))
    assert again.claimed == [] and again.held == [Held("capped", Limit.IN_FLIGHT, 3)]
    c0 = await store.get_intent("acme/c0")
    finished = (Event(kind="attempt_finished", at=T0, actor="w1"),)
    await store.apply([Settle(c0.key, c0.fence, Status.DELIVERED, finished)])
    assert ids(await claimed(store, T0 + timedelta(minutes=1))) == ["c2"]


async def test_the_rate_limit_takes_a_token_per_lease_refilled_up_to_the_burst(store):
    await store.put_destination(destination("metered", rate_limit=RateLimit(per_second=2, burst=3)))
    assert (await store.get_destination("metered")).rate_limit == RateLimit(per_second=2, burst=3)
    await store.insert_intents([new(f"m{i}", dest="metered", at=T0 + timedelta(microseconds=i)) for i in range(20)])
    now = T0 + timedelta(seconds=1)
    first = await claimed(store, now)
    assert ids(first) == ["m0", "m1", "m2"]  # a full bucket: the burst
    assert first.held == [Held("metered", Limit.RATE, 17, now + timedelta(seconds=0.5))]  # the next token's time
    assert (await claimed(store, now)).claimed == []
    assert len((await claimed(store, now + timedelta(seconds=1))).claimed) == 2  # two tokens a second
    assert len((await claimed(store, now + timedelta(seconds=2, milliseconds=250))).claimed) == 2
    assert len((await claimed(store, now + timedelta(seconds=2, milliseconds=500))).claimed) == 1  # 0.5 + 0.5
    assert len((await claimed(store, now + timedelta(hours=1))).claimed) == 3  # saved up to the burst only
    assert len((await claimed(store, now + timedelta(hours=1), limit=1)).claimed) == 0  # none left: a limit of 1


async def test_a_paused_destination_is_claimed_again_once_its_pause_ends_and_a_pause_is_never_shortened(store):
    await store.insert_intents([new("p1"), new("p2", at=T0 + timedelta(seconds=5))])
    until = T0 + timedelta(seconds=60)
    await store.pause_destination("billing", until)
    await store.pause_destination("billing", T0 + timedelta(seconds=10))  # a shorter pause keeps the longer one
    assert (await store.get_destination("billing")).paused_until == until
    held = await claimed(store, T0 + timedelta(seconds=30))
    assert held.claimed == [] and held.held == [Held("billing", Limit.PAUSED, 2, until)]
    # what a paused claim held back is not "due soon": a worker waits for the pause instead
    assert await store.next_due_at(T0 + timedelta(seconds=30)) is None
    assert await store.next_due_at() == T0
    assert ids(await claimed(store, until + timedelta(microseconds=1))) == ["p1", "p2"]


async def test_being_held_back_is_not_an_attempt_no_event_and_no_attempt_is_written(store):
    await store.put_destination(destination("capped", max_in_flight=1, rate_limit=RateLimit(per_second=1)))
    await store.insert_intents([new("h1", dest="capped"), new("h2", dest="capped", at=T0 + timedelta(seconds=1))])
    for _ in range(3):
        await claimed(store, T0 + timedelta(seconds=2))
    held = await store.history("acme/h2")
    assert held.intent.status is Status.PENDING and held.intent.attempts == 0 and held.intent.fence == 0
    assert held.attempts == [] and [e.kind for e in held.events] == ["enqueued"]


async def test_concurrent_claimers_together_never_exceed_a_destinations_limits(store):
    await store.put_destination(destination("capped", max_in_flight=4))
    await store.put_destination(destination("metered", rate_limit=RateLimit(per_second=0.001, burst=5)))
    await store.insert_intents([new(f"{d}{i}", dest=d) for d in ("capped", "metered") for i in range(30)])
    await store.insert_intents([new(f"b{i}") for i in range(30)])
    batches = await asyncio.gather(*(claimed(store, T0, limit=9, owner=f"w{n}") for n in range(10)))
    leased = [i.destination for batch in batches for i in batch.claimed]
    assert (leased.count("capped"), leased.count("metered"), leased.count("billing")) == (4, 5, 30)


async def test_a_limited_destination_still_delivers_each_ordering_key_one_at_a_time(store):
    await store.put_destination(destination("ordered", ordering=Ordering.KEY, max_in_flight=10,
                                            rate_limit=RateLimit(per_second=1, burst=10)))
    await store.insert_intents([new("a1", dest="ordered", key="k1"), new("a2", dest="ordered", key="k1"),
                                new("b1", dest="ordered", key="k2"), new("n1", dest="ordered")])
    assert ids(await claimed(store)) == ["a1", "b1", "n1"]  # the key's rule holds beside the limits
    assert ids(await claimed(store)) == []


# -- a destination's values the API refuses, written by hand ----------------------------------


async def written_by_hand(store: Store, *statements: str) -> None:
    async with store.transaction() as tx:
        for statement in statements:
            await tx.execute(statement, ())


@pytest.mark.parametrize("per_second", ["1e-12", "1e-300", "5e-324"])
async def test_a_rate_too_slow_for_any_time_to_hold_holds_its_destination_and_fails_no_claim(store, per_second):
    """The issue's rates (which the API took then): the time of the next token was 31,700 years
    and more away, and every claim failed on it (SQLite: OverflowError in the claim; PostgreSQL:
    a year past 9999 in its answer, or a float overflow in the function), so nothing was leased
    for any destination. The claim computes with the slowest rate the API takes; the destination
    says its stored rate is not one."""
    await store.put_destination(destination("edge", rate_limit=RateLimit(per_second=1, burst=1)))
    await written_by_hand(store, f"UPDATE destinations SET rate_per_second = {per_second} WHERE id = 'edge'")
    await store.insert_intents([new("e1", dest="edge"), new("e2", dest="edge"), new("b1")])
    now = T0 + timedelta(seconds=1)
    first = await claimed(store, now)
    assert ids(first) == ["b1", "e1"]  # the other destination's, and the burst of edge
    assert first.held == [Held("edge", Limit.RATE, 1, now + timedelta(seconds=1 / MIN_PER_SECOND))]
    again = await claimed(store, now + timedelta(seconds=1))
    assert again.claimed == [] and again.held[0].limit is Limit.RATE
    edge = await store.get_destination("edge")
    assert edge.rate_limit == RateLimit(per_second=MIN_PER_SECOND, burst=1)  # the nearest the API takes
    assert edge.unusable is not None and f"'per_second': {float(per_second)!r}" in edge.unusable
    assert "per_second from 0.00001 to 100000" in edge.unusable
    assert (await store.get_destination("billing")).unusable is None


BAD_VALUES = ("UPDATE destinations SET max_in_flight = -2147483648, rate_burst = NULL, on_unknown = 'sideways', "
              "retention_seconds = -5, timeout_seconds = 0, max_age_seconds = 2147483647, "
              """retry_schedule = '["soon", 5]' WHERE id = 'edge'""")


async def test_a_destinations_values_written_by_hand_are_read_as_the_nearest_the_api_takes_and_named(store):
    """Each value the API refuses, in one row: it fails no read (a listing, the sender's; an
    unknown on_unknown raised ValueError, and a rate limit RateLimit's validation), it reads as the
    nearest value the API takes (where there is none, its default), and the record says which
    values are not as stored; the others read as ever."""
    await store.put_destination(destination("edge", rate_limit=RateLimit(per_second=1, burst=2), max_in_flight=5))
    await written_by_hand(store, BAD_VALUES)
    listed = {d.id: d for d in await store.list_destinations()}
    edge = listed["edge"]
    assert (edge.max_in_flight, edge.rate_limit, edge.on_unknown, edge.retention_seconds, edge.timeout_seconds,
            edge.max_age_seconds, edge.retry_schedule) == (1, RateLimit(per_second=1, burst=1), OnUnknown.DECLARED,
                                                           60, 10.0, 90 * 86_400, None)
    for said in ("max_in_flight -2147483648", "'burst': None", "on_unknown 'sideways'", "retention_seconds -5",
                 "timeout_seconds 0", "max_age_seconds 2147483647", "retry_schedule ['soon', 5]"):
        assert said in (edge.unusable or ""), (said, edge.unusable)
    assert await store.get_destination("edge") == edge
    assert listed["billing"].unusable is None and listed["approvals"].unusable is None


async def test_a_destinations_values_written_by_hand_fail_no_claim_beside_them(store):
    """The claim computes with the nearest values the API takes: a bucket at minus infinity
    (floor(-inf) raised in both), a max_in_flight of -2**31 (PostgreSQL: a negative LIMIT), a pause
    until the latest the store can hold, and what it says to look again at is a time."""
    sql = CALLER_SQL[store.dialect]
    await store.put_destination(destination("edge", rate_limit=RateLimit(per_second=1, burst=2), max_in_flight=5))
    await store.insert_intents([new(f"e{i}", dest="edge") for i in range(3)] + [new("b1")])
    await claimed(store, T0, limit=1)  # (b1: the bucket row is made by edge's first claim)
    await claimed(store, T0)  # e0 and e1 leased: edge's bucket is now made and empty
    await written_by_hand(store, sql.edge_bucket_minus_infinity, BAD_VALUES)
    await store.insert_intent(*new("b2"))
    later = await claimed(store, T0 + timedelta(seconds=10))
    assert ids(later) == ["b2"] and later.held == [Held("edge", Limit.IN_FLIGHT, 1)]  # at most 1 in flight
    await written_by_hand(store, "UPDATE destinations SET max_in_flight = NULL WHERE id = 'edge'")
    refilled = await claimed(store, T0 + timedelta(seconds=20))
    assert ids(refilled) == ["e2"]  # the bucket, read as empty, refilled at 1 a second up to a burst of 1
    await store.insert_intent(*new("e3", dest="edge"))
    await written_by_hand(store, sql.edge_paused_latest)
    paused = await claimed(store, T0 + timedelta(seconds=30))
    [held] = paused.held
    assert (held.destination, held.limit, held.count) == ("edge", Limit.PAUSED, 1)
    assert held.retry_at is not None and held.retry_at >= datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
    edge = await store.get_destination("edge")
    assert edge.paused_until == LAST and "paused_until after 9999-12-31T23:59:59.999999Z" in (edge.unusable or "")
