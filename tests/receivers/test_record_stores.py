"""One conformance suite for every record store: the same decisions from memory, a real SQLite
file and the real PostgreSQL (a unique table per test, dropped afterwards)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from receivers import MemoryRecordStore, PostgresRecordStore, SqliteRecordStore, State, StoredResponse
from receivers.records import Busy, Claimed, ClaimRequest, Mismatch, ProbeResult, Replay, StaleFence, decide_claim

from .conftest import T0

FP_A = "sha256:" + "a" * 64
FP_B = "sha256:" + "b" * 64
LEASE = timedelta(seconds=60)
RETENTION = timedelta(hours=1)
US = timedelta(microseconds=1)
OK = StoredResponse(201, (("content-type", "application/json"), ("x-trace", "1"), ("x-trace", "2")),
                    b'{"done":true}')


@dataclass
class Backend:
    kind: str
    new: Callable[[], Any]  # a fresh, unopened store over the same storage (memory: the same one)
    opened: list[Any] = field(default_factory=list)

    async def open(self) -> Any:
        store = self.new()
        await store.open()
        self.opened.append(store)
        return store


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    table = "idem_" + uuid.uuid4().hex[:20]
    if request.param == "memory":
        shared = MemoryRecordStore()
        backend = Backend("memory", lambda: shared)
    elif request.param == "sqlite":
        path = tmp_path / "records.db"
        backend = Backend("sqlite", lambda: SqliteRecordStore(path, table=table))
    else:
        dsn = request.getfixturevalue("pg_dsn")
        backend = Backend("postgres", lambda: PostgresRecordStore(dsn, table=table, pool_size=4))
    try:
        yield backend
    finally:
        for store in backend.opened:
            await store.close()
        if request.param == "postgres":
            import asyncpg

            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute(f"DROP TABLE IF EXISTS {table}")
            finally:
                await conn.close()


@pytest.fixture
async def store(backend: Backend) -> Any:
    return await backend.open()


async def claim(store: Any, ident: str, fp: str = FP_A, *, at=T0, fence: int | None = None,
                lease: timedelta = LEASE, retention: timedelta = RETENTION) -> Any:
    return await store.claim(ident, fp, fence=fence, now=at, lease_until=at + lease, expires_at=at + retention)


# -- claims --------------------------------------------------------------------------------


async def test_claim_on_nothing_claims_epoch_1(store: Any) -> None:
    assert await store.get("k") is None
    assert await claim(store, "k") == Claimed(1)
    record = await store.get("k")
    assert record.state is State.IN_PROGRESS
    assert (record.identity, record.fingerprint, record.epoch, record.min_fence) == ("k", FP_A, 1, 0)
    assert record.lease_expires_at == T0 + LEASE
    assert record.expires_at == T0 + RETENTION
    assert record.response is None


async def test_same_fingerprint_while_in_progress_with_valid_lease_is_busy(store: Any) -> None:
    await claim(store, "k")
    before = await store.get("k")
    result = await claim(store, "k", at=T0 + timedelta(seconds=10))
    assert isinstance(result, Busy)
    assert result.retry_after == pytest.approx(50.0)
    # one microsecond before the lease runs out it is still busy
    assert isinstance(await claim(store, "k", at=T0 + LEASE - US), Busy)
    assert await store.get("k") == before


async def test_other_fingerprint_is_a_mismatch_and_leaves_the_record_unchanged(store: Any) -> None:
    await claim(store, "k", fence=3)
    before = await store.get("k")
    assert await claim(store, "k", FP_B, at=T0 + timedelta(seconds=1), fence=9) == Mismatch()
    assert await store.get("k") == before  # not even the fence moved
    # also once completed
    assert await store.complete("k", 1, OK, expires_at=T0 + RETENTION) is True
    completed = await store.get("k")
    assert await claim(store, "k", FP_B, at=T0 + timedelta(seconds=2), fence=11) == Mismatch()
    assert await store.get("k") == completed


async def test_expired_lease_is_taken_over_with_a_higher_epoch(store: Any) -> None:
    assert await claim(store, "k") == Claimed(1)
    later = T0 + LEASE  # the lease ends at exactly this instant
    assert await claim(store, "k", at=later) == Claimed(2)
    record = await store.get("k")
    assert (record.state, record.epoch, record.lease_expires_at) == (State.IN_PROGRESS, 2, later + LEASE)


async def test_complete_with_the_right_epoch_then_replays_the_stored_response(store: Any) -> None:
    assert await claim(store, "k") == Claimed(1)
    assert await store.complete("k", 1, OK, expires_at=T0 + RETENTION) is True
    assert await claim(store, "k", at=T0 + timedelta(seconds=5)) == Replay(OK)
    record = await store.get("k")
    assert (record.state, record.epoch, record.lease_expires_at, record.response) == (
        State.COMPLETED, 1, None, OK)
    # a replay changes nothing: still completed, still epoch 1
    assert await claim(store, "k", at=T0 + RETENTION - US) == Replay(OK)
    assert await store.get("k") == record


async def test_complete_with_a_stale_epoch_is_refused_and_changes_nothing(store: Any) -> None:
    await claim(store, "k")
    assert await claim(store, "k", at=T0 + LEASE) == Claimed(2)  # takeover
    before = await store.get("k")
    assert await store.complete("k", 1, OK, expires_at=T0 + RETENTION) is False
    assert await store.complete("k", 3, OK, expires_at=T0 + RETENTION) is False
    assert await store.get("k") == before
    # on nothing: refused and nothing is created
    assert await store.complete("nothing", 1, OK, expires_at=T0 + RETENTION) is False
    assert await store.get("nothing") is None
    # once completed, the owner cannot complete it again with another response
    assert await store.complete("k", 2, OK, expires_at=T0 + RETENTION) is True
    done = await store.get("k")
    other = StoredResponse(500, (), b"late")
    assert await store.complete("k", 2, other, expires_at=T0 + RETENTION) is False
    assert await store.get("k") == done


async def test_release_lets_the_next_claim_run(store: Any) -> None:
    await claim(store, "k", fence=4)
    assert await store.release("k", 2) is False  # not the owner
    assert await store.release("k", 1) is True
    record = await store.get("k")
    assert (record.state, record.fingerprint, record.min_fence) == (State.ABSENT, None, 4)
    # the next request runs, whatever its fingerprint (the released one left nothing behind)
    assert await claim(store, "k", FP_B, at=T0 + timedelta(seconds=1)) == Claimed(2)
    assert await store.release("k", 1) is False  # the old epoch cannot release the new claim
    assert (await store.get("k")).state is State.IN_PROGRESS
    await store.complete("k", 2, OK, expires_at=T0 + RETENTION)
    assert await store.release("k", 2) is False  # nor can a completed record be released
    assert (await store.get("k")).state is State.COMPLETED
    assert await store.release("nothing", 1) is False
    assert await store.get("nothing") is None


# -- fences --------------------------------------------------------------------------------


async def test_a_fence_lower_than_the_highest_seen_is_stale_when_the_handler_would_run(store: Any) -> None:
    assert await claim(store, "k", fence=5) == Claimed(1)
    assert await store.release("k", 1) is True  # free to run again, its fence kept
    before = await store.get("k")
    assert await claim(store, "k", at=T0 + timedelta(seconds=1), fence=4) == StaleFence(5)
    assert await store.get("k") == before
    # the same fence is not lower
    assert await claim(store, "k", at=T0 + timedelta(seconds=1), fence=5) == Claimed(2)
    # nor may a lower fence take over an expired lease
    assert await claim(store, "k", at=T0 + timedelta(seconds=1) + LEASE, fence=4) == StaleFence(5)
    assert isinstance(await claim(store, "k", at=T0 + timedelta(seconds=1) + LEASE), Claimed)  # no fence


async def test_a_fence_never_turns_a_completed_or_running_request_into_a_refusal(store: Any) -> None:
    assert await claim(store, "k", fence=5) == Claimed(1)
    running = await store.get("k")
    assert isinstance(await claim(store, "k", at=T0 + timedelta(seconds=1), fence=4), Busy)
    assert await store.get("k") == running
    assert await store.complete("k", 1, OK, expires_at=T0 + RETENTION)
    done = await store.get("k")
    for fence in (0, 4, None):
        assert await claim(store, "k", at=T0 + timedelta(seconds=2), fence=fence) == Replay(OK)
    assert await claim(store, "k", FP_B, at=T0 + timedelta(seconds=2), fence=4) == Mismatch()
    assert await store.get("k") == done


async def test_only_a_claim_or_a_probe_raises_the_minimum_fence(store: Any) -> None:
    assert await claim(store, "k", fence=5) == Claimed(1)
    assert isinstance(await claim(store, "k", at=T0 + timedelta(seconds=1), fence=8), Busy)
    assert await claim(store, "k", FP_B, at=T0 + timedelta(seconds=1), fence=9) == Mismatch()
    assert (await store.get("k")).min_fence == 5  # neither a busy answer nor a mismatch raised it
    assert await store.complete("k", 1, OK, expires_at=T0 + RETENTION)
    assert await claim(store, "k", at=T0 + timedelta(seconds=3), fence=10) == Replay(OK)
    assert (await store.get("k")).min_fence == 5  # nor a replay
    assert (await store.probe("k", 12, now=T0 + timedelta(seconds=4), expires_at=T0 + RETENTION)).fence == 12
    assert (await store.get("k")).min_fence == 12  # a probe does
    # a claim does: a fresh one, and a takeover
    assert await claim(store, "t", fence=2) == Claimed(1)
    assert await claim(store, "t", at=T0 + LEASE, fence=6) == Claimed(2)
    assert (await store.get("t")).min_fence == 6
    assert await store.release("t", 2) is True
    assert await claim(store, "t", at=T0 + LEASE, fence=3) == StaleFence(6)
    # a claim without a fence keeps the minimum it found
    assert await claim(store, "t", at=T0 + LEASE) == Claimed(3)
    assert (await store.get("t")).min_fence == 6


async def test_a_raised_fence_lives_only_as_long_as_its_record(store: Any) -> None:
    """The highest fence a store holds (10**18-1) cannot lock a key out past its retention, and
    neither a probe nor a release extends that retention."""
    top = 10**18 - 1
    expires = T0 + RETENTION
    # made by a probe on a key never used
    assert await store.probe("probed", top, now=T0, expires_at=expires) == ProbeResult(State.ABSENT, top, None)
    # made by a release of a claim with that fence
    assert await claim(store, "released", fence=top) == Claimed(1)
    assert await store.release("released", 1) is True
    # probed again later, on a released record and on a completed one
    assert await claim(store, "done", fence=1) == Claimed(1)
    assert await store.complete("done", 1, OK, expires_at=expires)
    later = T0 + timedelta(minutes=30)
    for ident in ("released", "done"):
        await store.probe(ident, top, now=later, expires_at=later + RETENTION)
    for ident in ("probed", "released", "done"):
        record = await store.get(ident)
        assert (record.min_fence, record.expires_at) == (top, expires), ident  # the retention did not move
    assert await claim(store, "probed", at=expires - US, fence=1) == StaleFence(top)
    assert await claim(store, "released", at=expires - US, fence=1) == StaleFence(top)
    assert await claim(store, "done", at=expires - US, fence=1) == Replay(OK)
    # at expires_at the records read as absent, fence and all
    for ident in ("probed", "released", "done"):
        result = await claim(store, ident, at=expires, fence=1)
        assert isinstance(result, Claimed), (ident, result)
        assert (await store.get(ident)).min_fence == 1


async def test_probe_on_nothing_is_absent_and_fences_out_a_late_request(store: Any) -> None:
    assert await store.probe("k", 7, now=T0, expires_at=T0 + RETENTION) == ProbeResult(State.ABSENT, 7, None)
    assert await claim(store, "k", at=T0 + timedelta(seconds=1), fence=6) == StaleFence(7)
    assert isinstance(await claim(store, "k", at=T0 + timedelta(seconds=1), fence=7), Claimed)


async def test_probe_on_completed_answers_the_stored_response(store: Any) -> None:
    await claim(store, "k", fence=1)
    await store.complete("k", 1, OK, expires_at=T0 + RETENTION)
    result = await store.probe("k", 2, now=T0 + timedelta(seconds=1), expires_at=T0 + RETENTION)
    assert result == ProbeResult(State.COMPLETED, 2, OK)
    record = await store.get("k")
    assert (record.state, record.response, record.min_fence) == (State.COMPLETED, OK, 2)
    # the earlier attempt, arriving late, is the same request: replayed, not refused
    assert await claim(store, "k", at=T0 + timedelta(seconds=2), fence=1) == Replay(OK)
    assert await claim(store, "k", at=T0 + timedelta(seconds=2), fence=2) == Replay(OK)
    assert (await store.get("k")).min_fence == 2


async def test_probe_on_in_progress_with_a_valid_lease_is_in_progress(store: Any) -> None:
    await claim(store, "k", fence=1)
    result = await store.probe("k", 2, now=T0 + LEASE - US, expires_at=T0 + RETENTION)
    assert result == ProbeResult(State.IN_PROGRESS, 2, None)
    record = await store.get("k")
    assert (record.state, record.epoch, record.min_fence) == (State.IN_PROGRESS, 1, 2)
    # the running request still owns it and may complete
    assert await store.complete("k", 1, OK, expires_at=T0 + RETENTION) is True


async def test_probe_on_in_progress_with_an_expired_lease_is_absent_and_refuses_the_old_epoch(store: Any) -> None:
    assert await claim(store, "k", fence=1) == Claimed(1)
    result = await store.probe("k", 2, now=T0 + LEASE, expires_at=T0 + RETENTION)
    assert result == ProbeResult(State.ABSENT, 2, None)
    record = await store.get("k")
    assert record.state is State.ABSENT and record.epoch > 1 and record.min_fence == 2
    assert await store.complete("k", 1, OK, expires_at=T0 + RETENTION) is False
    assert await store.release("k", 1) is False
    assert (await store.get("k")).state is State.ABSENT
    # the old request (fence 1) is refused; the sender's retry (fence 2) runs under a new epoch
    assert await claim(store, "k", at=T0 + LEASE, fence=1) == StaleFence(2)
    again = await claim(store, "k", at=T0 + LEASE, fence=2)
    assert isinstance(again, Claimed) and again.epoch > record.epoch


# -- retention -----------------------------------------------------------------------------


async def test_expiry_at_the_exact_retention_boundary(store: Any) -> None:
    expires = T0 + RETENTION
    for ident in ("claim", "probe"):
        await claim(store, ident)
        await store.complete(ident, 1, OK, expires_at=expires)
    # one microsecond before: still there
    assert await claim(store, "claim", at=expires - US) == Replay(OK)
    assert (await store.probe("probe", 0, now=expires - US, expires_at=expires + RETENTION)).state is State.COMPLETED
    # exactly at expires_at: absent
    assert await claim(store, "claim", at=expires) == Claimed(2)
    assert await store.probe("probe", 0, now=expires, expires_at=expires + RETENTION) == ProbeResult(
        State.ABSENT, 0, None)
    # an expired record's fence is forgotten with it
    await claim(store, "fenced", fence=9)
    assert isinstance(await claim(store, "fenced", at=T0 + RETENTION, fence=1), Claimed)


async def test_purge_deletes_only_expired_records(store: Any) -> None:
    now = T0 + timedelta(hours=5)
    for ident, expires in (("past", now - US), ("boundary", now), ("future", now + US), ("later", now + RETENTION)):
        await claim(store, ident)
        await store.complete(ident, 1, OK, expires_at=expires)
    await claim(store, "running", retention=timedelta(hours=10))  # in progress, retention left
    assert await store.purge(now) == 2
    assert await store.get("past") is None
    assert await store.get("boundary") is None
    for ident in ("future", "later", "running"):
        assert await store.get(ident) is not None, ident
    assert await store.purge(now) == 0


async def test_purge_takes_every_expired_record_batch_after_batch(store: Any, monkeypatch) -> None:
    import receivers.stores.sqlite

    monkeypatch.setattr(receivers.stores.sqlite, "PURGE_BATCH", 2)  # a SQLite store deletes 2 per transaction
    now = T0 + timedelta(hours=5)
    for n in range(5):
        await claim(store, f"old-{n}")
        await store.complete(f"old-{n}", 1, OK, expires_at=now - US)
    await claim(store, "kept", retention=timedelta(hours=10))
    assert await store.purge(now) == 5
    assert [await store.get(f"old-{n}") for n in range(5)] == [None] * 5
    assert await store.get("kept") is not None


# -- concurrency ---------------------------------------------------------------------------


async def on_threads(count: int, body: Callable[[threading.Barrier], Awaitable[Any]]) -> list[Any]:
    """``body`` on ``count`` threads, each with its own event loop (as close to that many receiver
    processes as one test gets), released together when each waits on the barrier it is given.
    Returns each one's result; fails if any raised."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def one(index: int) -> None:
        try:
            results[index] = asyncio.run(body(barrier))
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        await asyncio.to_thread(thread.join, 60)
    assert not errors, errors
    return results


async def test_twenty_concurrent_claims_of_one_identity_claim_exactly_once(backend: Backend) -> None:
    if backend.kind == "memory":
        shared = await backend.open()
        results = await asyncio.gather(*(claim(shared, "hot") for _ in range(20)))
    else:
        # twenty stores (connections) released together (the table exists already: concurrent
        # creation is its own test below)
        await backend.open()

        async def run(barrier: threading.Barrier) -> Any:
            store = backend.new()
            await store.open()
            try:
                barrier.wait(timeout=20)
                return await claim(store, "hot")
            finally:
                await store.close()

        results = await on_threads(20, run)
    claimed = [r for r in results if isinstance(r, Claimed)]
    assert claimed == [Claimed(1)]
    assert all(isinstance(r, Busy) for r in results if not isinstance(r, Claimed)), results
    record = await (await backend.open()).get("hot")
    assert (record.state, record.epoch) == (State.IN_PROGRESS, 1)


async def test_concurrent_opens_on_a_fresh_database_all_succeed(backend: Backend) -> None:
    """Several receiver processes starting together on a fresh database must all get a store
    (each one creates the table "if not exists")."""

    async def run(barrier: threading.Barrier) -> None:
        store = backend.new()
        barrier.wait(timeout=20)
        try:
            await store.open()
            await claim(store, "opened")
        finally:
            await store.close()

    await on_threads(8, run)


async def test_concurrent_batches_over_the_same_identities_claim_each_exactly_once(backend: Backend) -> None:
    """Batches naming the same keys in different orders (Kafka consumers after a rebalance)
    neither deadlock nor claim a key twice."""
    identities = [f"k{i}" for i in range(50)]

    async def batch(store: Any, order: list[str]) -> list[Any]:
        return await store.claim_many([ClaimRequest(i, FP_A, None) for i in order], now=T0,
                                      lease_until=T0 + LEASE, expires_at=T0 + RETENTION)

    if backend.kind == "memory":
        shared = await backend.open()
        results = await asyncio.gather(*(batch(shared, identities[::step]) for step in (1, -1, 1, -1)))
    else:
        await backend.open()

        async def run(barrier: threading.Barrier) -> Any:
            store = backend.new()
            await store.open()
            try:
                order = list(identities)
                if threading.get_ident() % 2:
                    order.reverse()
                barrier.wait(timeout=20)
                return await batch(store, order)
            finally:
                await store.close()

        results = await on_threads(4, run)
    claimed = [r for answers in results for r in answers if isinstance(r, Claimed)]
    assert claimed == [Claimed(1)] * len(identities)
    assert all(isinstance(r, Claimed | Busy) for answers in results for r in answers)


# -- batches -------------------------------------------------------------------------------


async def test_a_batch_of_claims_answers_as_the_same_claims_one_after_another(store: Any) -> None:
    await claim(store, "done")
    await store.complete("done", 1, OK, expires_at=T0 + RETENTION)
    await claim(store, "fenced", fence=5)
    await store.release("fenced", 1)
    at = T0 + timedelta(seconds=1)
    answers = await store.claim_many(
        [ClaimRequest("new", FP_A, 3), ClaimRequest("done", FP_A, None), ClaimRequest("done", FP_B, None),
         ClaimRequest("fenced", FP_A, 4), ClaimRequest("new", FP_A, 3), ClaimRequest("fenced", FP_A, 5)],
        now=at, lease_until=at + LEASE, expires_at=at + RETENTION)
    # a key repeated in the batch sees what the claim before it wrote
    assert answers == [Claimed(1), Replay(OK), Mismatch(), StaleFence(5), Busy(60.0), Claimed(2)]
    new = await store.get("new")
    assert (new.state, new.epoch, new.min_fence, new.fingerprint) == (State.IN_PROGRESS, 1, 3, FP_A)
    assert (new.lease_expires_at, new.expires_at) == (at + LEASE, at + RETENTION)
    assert (await store.get("done")).state is State.COMPLETED
    assert await store.claim_many([], now=at, lease_until=at + LEASE, expires_at=at + RETENTION) == []


async def test_batches_of_completions_and_releases_refuse_stale_epochs(store: Any) -> None:
    requests = [ClaimRequest(f"k{i}", FP_A, None) for i in range(4)]
    assert await store.claim_many(requests, now=T0, lease_until=T0 + LEASE, expires_at=T0 + RETENTION) == [
        Claimed(1)] * 4
    later = T0 + timedelta(seconds=2)
    assert await store.complete_many([("k0", 1, OK), ("k1", 2, OK), ("absent", 1, OK)],
                                     expires_at=later + RETENTION) == [True, False, False]
    assert await store.release_many([("k2", 1), ("k3", 7), ("k0", 1)]) == [True, False, False]
    assert await store.complete_many([], expires_at=later) == [] and await store.release_many([]) == []
    at = T0 + timedelta(seconds=3)
    answers = await store.claim_many(requests, now=at, lease_until=at + LEASE, expires_at=at + RETENTION)
    assert answers == [Replay(OK), Busy(57.0), Claimed(2), Busy(57.0)]
    assert (await store.get("k0")).expires_at == later + RETENTION


async def test_a_batch_of_completions_stores_each_record_its_own_response(store: Any) -> None:
    """A batch's responses travel together (on PostgreSQL their headers as one JSON array): each
    row keeps its own status, headers (none, repeated, in order, not ASCII) and body, and a key
    named twice in the batch is completed once, its repeat refused."""
    responses = [StoredResponse(200, (), b""), StoredResponse(201, (("x-a", "1"), ("x-a", "2"), ("x-b", "é")), None),
                 StoredResponse(409, (("external-id", "orders/0/7"),), bytes(range(256))),
                 StoredResponse(204, (("x-q", '"[],{}\\'),), b"")]
    idents = [f"r{i}" for i in range(len(responses))]
    await store.claim_many([ClaimRequest(ident, FP_A, None) for ident in idents], now=T0, lease_until=T0 + LEASE,
                           expires_at=T0 + RETENTION)
    done = [(ident, 1, response) for ident, response in zip(idents, responses, strict=True)]
    assert await store.complete_many([*done, ("r0", 1, OK)], expires_at=T0 + RETENTION) == [True] * 4 + [False]
    for ident, response in zip(idents, responses, strict=True):
        assert (await store.get(ident)).response == response, ident


async def test_completions_and_claims_in_one_step_complete_first(backend: Backend) -> None:
    """The Kafka consumer stores one batch's completions with the next batch's claims: the
    completions land first (a key completed and claimed again replays), a stale epoch is refused,
    and the SQL stores run it as one transaction."""
    store = await backend.open()
    first = [ClaimRequest(f"k{i}", FP_A, 1) for i in range(3)]
    assert await store.claim_many(first, now=T0, lease_until=T0 + LEASE, expires_at=T0 + RETENTION) == [
        Claimed(1)] * 3
    at = T0 + timedelta(seconds=1)
    async with statements(backend.kind, store) as ran:
        completed, answers = await store.complete_and_claim(
            [("k0", 1, OK), ("k1", 2, OK)], [ClaimRequest("k0", FP_A, 1), ClaimRequest("k2", FP_A, 1),
                                             ClaimRequest("new", FP_A, 1)],
            now=at, lease_until=at + LEASE, expires_at=at + RETENTION)
    assert completed == [True, False]  # k1's epoch is stale
    assert answers == [Replay(OK), Busy(59.0), Claimed(1)]
    assert (await store.get("k0")).expires_at == at + RETENTION
    assert (await store.get("k1")).state is State.IN_PROGRESS
    assert (await store.get("new")).lease_expires_at == at + LEASE
    if backend.kind != "memory":
        begins = [sql for sql in ran if sql.strip().upper().startswith("BEGIN")]
        assert len(begins) == 1, ran
    assert await store.complete_and_claim([], [], now=at, lease_until=at + LEASE, expires_at=at) == ([], [])


async def test_postgresql_batches_find_their_rows_by_key_on_a_fresh_table(pg_dsn: str) -> None:
    """A fresh table has no statistics yet: left to its estimates, the planner hashes the whole
    table for each batch of completions or releases (a cost that grows with the table). The
    store's sessions find the rows by key."""
    store = PostgresRecordStore(pg_dsn, table="idem_" + uuid.uuid4().hex[:20], pool_size=1)
    await store.open()
    try:
        for b in range(8):
            await store.claim_many([ClaimRequest(f"{b}-{i}", FP_A, None) for i in range(500)], now=T0,
                                   lease_until=T0 + LEASE, expires_at=T0 + RETENTION)
        keys = [f"3-{i}" for i in range(500)]
        async with store._pool.acquire() as conn:
            no_headers = "[" + ", ".join(["[]"] * 500) + "]"  # one JSON array, each row's pairs
            for name, args in (("complete_many", (keys, [1] * 500, [200] * 500, no_headers, [b""] * 500,
                                                  T0 + RETENTION)),
                               ("release_many", (keys, [1] * 500))):
                plan = "\n".join(row[0] for row in await conn.fetch("EXPLAIN " + store._sql[name], *args))
                assert "Seq Scan" not in plan, plan
    finally:
        async with store._pool.acquire() as conn:
            await conn.execute(f"DROP TABLE {store.table}")
        await store.close()


# -- what is stored ------------------------------------------------------------------------


async def test_bodies_not_stored_round_trip_as_none(store: Any) -> None:
    omitted = StoredResponse(200, (("x-a", "1"),), None)
    empty = StoredResponse(204, (), b"")
    binary = StoredResponse(409, (("content-type", "application/octet-stream"),), bytes(range(256)))
    for ident, response in (("omitted", omitted), ("empty", empty), ("binary", binary)):
        assert await claim(store, ident) == Claimed(1)
        assert await store.complete(ident, 1, response, expires_at=T0 + RETENTION) is True
        assert await claim(store, ident, at=T0 + timedelta(seconds=1)) == Replay(response), ident
        assert (await store.get(ident)).response == response
    replayed = await claim(store, "omitted", at=T0 + timedelta(seconds=2))
    assert replayed.response.body is None  # not stored, distinct from an empty body
    assert (await claim(store, "empty", at=T0 + timedelta(seconds=2))).response.body == b""
    probed = await store.probe("omitted", 0, now=T0 + timedelta(seconds=3), expires_at=T0 + RETENTION)
    assert probed == ProbeResult(State.COMPLETED, 0, omitted)
    # the headers keep their order and their repeats
    assert await claim(store, "ok") == Claimed(1)
    await store.complete("ok", 1, OK, expires_at=T0 + RETENTION)
    assert (await store.get("ok")).response.headers == OK.headers


async def test_records_of_different_identities_are_independent(store: Any) -> None:
    assert await claim(store, "1:a|3:b:c") == Claimed(1)
    assert await claim(store, "3:a:b|1:c", FP_B) == Claimed(1)
    await store.complete("1:a|3:b:c", 1, OK, expires_at=T0 + RETENTION)
    assert (await store.get("3:a:b|1:c")).state is State.IN_PROGRESS


# -- batches: one statement per batch, the single claim's rules ------------------------------


@asynccontextmanager
async def statements(kind: str, store: Any) -> AsyncIterator[list[str]]:
    """The SQL statements ``store`` runs meanwhile, from its real connection's trace (the memory
    store runs none)."""
    ran: list[str] = []

    def logged(query: Any) -> None:
        # executemany is logged once with its list of argument rows: the server ran one each
        ran.extend([query.query] * (len(query.args) if isinstance(query.args, list) else 1))

    if kind == "sqlite":
        await store._committer.db.set_trace_callback(ran.append)
    elif kind == "postgres":
        async with store._pool.acquire() as conn:  # sequential calls all run on this one connection
            conn.add_query_logger(logged)
    yield ran
    if kind == "sqlite":
        await store._committer.db.set_trace_callback(None)
    elif kind == "postgres":
        await asyncio.sleep(0)  # query loggers are called soon after their statement
        async with store._pool.acquire() as conn:
            conn.remove_query_logger(logged)


async def mixed_batch(store: Any, backend: Backend, new: int) -> tuple[list[Any], list[str]]:
    """Claim, in one batch, a completed key, one in progress in another store, one whose lease ran
    out, one fenced higher, one of another payload and ``new`` fresh keys; returns the answers and
    the statements the batch ran."""
    tag = f"{new}-"
    elsewhere = backend.new() if backend.kind != "memory" else store
    if elsewhere is not store:
        await elsewhere.open()
    try:
        await claim(elsewhere, tag + "done")
        await elsewhere.complete(tag + "done", 1, OK, expires_at=T0 + RETENTION)
        await claim(elsewhere, tag + "busy", at=T0)
        await claim(elsewhere, tag + "stale-lease", at=T0 - LEASE)
        await claim(elsewhere, tag + "fenced", fence=9)
        await elsewhere.release(tag + "fenced", 1)
        await claim(elsewhere, tag + "other", FP_B)
    finally:
        if elsewhere is not store:
            await elsewhere.close()
    at = T0 + timedelta(seconds=1)
    requests = [ClaimRequest(tag + name, FP_A, fence) for name, fence in
                (("done", 1), ("busy", 1), ("stale-lease", 1), ("fenced", 3), ("other", 1))]
    requests += [ClaimRequest(f"{tag}new-{i}", FP_A, 1) for i in range(new)]
    async with statements(backend.kind, store) as ran:
        answers = await store.claim_many(requests, now=at, lease_until=at + LEASE, expires_at=at + RETENTION)
    return answers, ran


async def test_a_mixed_batch_of_claims_runs_the_same_statements_whatever_its_size(backend: Backend) -> None:
    store = await backend.open()
    await mixed_batch(store, backend, 1)  # the driver's first use of a statement asks for its types
    few, few_ran = await mixed_batch(store, backend, 2)
    many, many_ran = await mixed_batch(store, backend, 300)
    for answers, new in ((few, 2), (many, 300)):
        assert answers == [Replay(OK), Busy(59.0), Claimed(2), StaleFence(9), Mismatch()] + [Claimed(1)] * new
    assert len(many_ran) == len(few_ran)
    if backend.kind != "memory":
        # the claim itself, the read of its refusals, and the transaction around them
        assert len(few_ran) <= 4, few_ran
    taken = await store.get("300-stale-lease")
    at = T0 + timedelta(seconds=1)
    assert (taken.state, taken.epoch, taken.lease_expires_at) == (State.IN_PROGRESS, 2, at + LEASE)
    assert (await store.get("300-busy")).lease_expires_at == T0 + LEASE  # left as it was
    assert (await store.get("300-done")).state is State.COMPLETED
    fresh = await store.get("300-new-299")
    assert (fresh.state, fresh.epoch, fresh.min_fence, fresh.fingerprint) == (State.IN_PROGRESS, 1, 1, FP_A)


async def test_batches_of_completions_and_releases_run_the_same_statements_whatever_their_size(
        backend: Backend) -> None:
    store = await backend.open()
    counts = []
    for size in (4, 6, 300):  # the first warms the driver's type cache
        requests = [ClaimRequest(f"{size}-{i}", FP_A, None) for i in range(size)]
        await store.claim_many(requests, now=T0, lease_until=T0 + LEASE, expires_at=T0 + RETENTION)
        half = size // 2
        async with statements(backend.kind, store) as completed:
            answers = await store.complete_many([(f"{size}-{i}", 1 if i else 2, OK) for i in range(half)],
                                                expires_at=T0 + RETENTION)
        assert answers == [False] + [True] * (half - 1)  # the first names a stale epoch
        async with statements(backend.kind, store) as released:
            answers = await store.release_many([(f"{size}-{i}", 1) for i in range(half - 1, size)])
        assert answers == [False] + [True] * (size - half)  # the first was completed
        counts.append((len(completed), len(released)))
        assert (await store.get(f"{size}-{half - 1}")).response == OK
        assert (await store.get(f"{size}-{size - 1}")).state is State.ABSENT
    assert counts[1] == counts[2]
    if backend.kind != "memory":
        assert counts[1][0] <= 3 and counts[1][1] <= 3, counts  # the statement (and its transaction)


async def test_a_batch_claim_decides_every_kind_of_record_as_decide_claim_does(store: Any) -> None:
    """Each record a key can have (none, absent and fenced, released, running, with its lease run
    out, completed, expired) met by the same and by another payload, with no fence, a lower, the
    same and a higher one: the batch statement answers and writes what ``decide_claim`` says."""
    past = T0 - 2 * RETENTION
    setups: dict[str, Callable[[str], Awaitable[Any]]] = {
        "none": lambda k: asyncio.sleep(0),
        "probed": lambda k: store.probe(k, 5, now=T0, expires_at=T0 + RETENTION),
        "released": lambda k: _then(claim(store, k, fence=5), store.release(k, 1)),
        "running": lambda k: claim(store, k, fence=5, at=T0),
        "lease-out": lambda k: claim(store, k, fence=5, at=T0 - LEASE),
        "completed": lambda k: _then(claim(store, k, fence=5),
                                     store.complete(k, 1, OK, expires_at=T0 + RETENTION)),
        "expired": lambda k: _then(claim(store, k, fence=5, at=past),
                                   store.complete(k, 1, OK, expires_at=past + RETENTION)),
        "expired-running": lambda k: claim(store, k, fence=5, at=past),
    }
    requests = []
    for name, setup in setups.items():
        for fp in (FP_A, FP_B):
            for fence in (None, 3, 5, 7):
                ident = f"{name}/{fp[7]}/{fence}"
                await setup(ident)
                requests.append(ClaimRequest(ident, fp, fence))
    before = {r.identity: await store.get(r.identity) for r in requests}
    at = T0 + timedelta(seconds=10)
    answers = await store.claim_many(requests, now=at, lease_until=at + LEASE, expires_at=at + RETENTION)
    for request, answer in zip(requests, answers, strict=True):
        expected, written = decide_claim(before[request.identity], request.identity, request.fingerprint,
                                         fence=request.fence, now=at, lease_until=at + LEASE,
                                         expires_at=at + RETENTION)
        assert answer == expected, request
        assert await store.get(request.identity) == (written or before[request.identity]), request


async def _then(first: Awaitable[Any], second: Awaitable[Any]) -> Any:
    await first
    return await second
