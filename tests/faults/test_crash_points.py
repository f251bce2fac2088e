"""``kill -9`` at each crash point of the sender (``outbox.crash``), on SQLite and PostgreSQL.

A real ``outbox worker`` delivers a few intents to a receiver behind our idempotency middleware
and kills itself with SIGKILL at one step: after its claim commits, after an attempt's start
commits, once the request is written (its body handed to the socket, no answer read), once the
channel's send has returned with the answer, with the outcome decided but not yet handed to the
store, or with the outcome written inside its transaction but not committed. A second worker,
without the setting, recovers the expired leases and settles everything. The history the store
kept and what the receiver saw are then judged by the fault matrix's checker, and its truth table
printed.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, get_args

import pytest

from outbox import DestinationSpec, OnUnknown, Outbox, Settings, crash
from outbox.crash import CrashPoint
from receivers import IdempotencyMiddleware, SqliteRecordStore, wire
from sender import Worker

from ..acceptance.conftest import clean_env, outbox_worker
from ..acceptance.test_worker_crash import wait_settled as settled
from ..conftest import SECRET, eventually, records, rows
from ..servers import Served
from .checker import IntentFact, Truth, check, off_diagonal, truth_table
from .tables import store_name
from .test_matrix import facts, report, tier

pytestmark = pytest.mark.acceptance

INTENTS = 4
CONCURRENCY = 2
LEASE_SECONDS = 1.0
POLL_SECONDS = 0.1
ATTEMPT_ID = wire.ATTEMPT_ID.lower().encode()
#: Points at which a request has certainly reached the receiver and its answer is not recorded.
ANSWERED = {"after_answer", "before_outcome", "mid_group_commit"}
#: Points at which a request was written: the receiver gets it, maybe after the worker died.
WRITTEN = ANSWERED | {"after_request"}


class Ground:
    """The receiver's side: the Outbox-Attempt-Id of every request that reached it (before the
    middleware), and each effect the application behind the middleware made, per key."""

    def __init__(self, records: Path) -> None:
        self.reached: list[str] = []
        self.effects: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.store = SqliteRecordStore(records)
        self.app = IdempotencyMiddleware(self._effect, self.store, secrets=SECRET)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and (attempt := dict(scope["headers"]).get(ATTEMPT_ID)):
            with self._lock:
                self.reached.append(attempt.decode())
        await self.app(scope, receive, send)

    async def _effect(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        with self._lock:
            self.effects[scope["state"]["idempotency"].key] += 1
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"ok": true}'})

    def truth(self) -> Truth:
        with self._lock:
            return Truth(effects=dict(self.effects), reached=frozenset(self.reached))


@pytest.fixture
async def ground(tmp_path: Path) -> AsyncIterator[tuple[Ground, str]]:
    """The receiver on uvicorn at a free loopback port; yields it and its URL."""
    receiver = Ground(tmp_path / "records.db")
    served = Served(receiver)
    try:
        yield receiver, f"{served.url}/orders"
    finally:
        served.stop()
        await receiver.store.close()


#: The store's own invariants, in SQL both dialects read the same way: each a count of the rows
#: that break it, named for what it would mean. ``{records}`` is where an intent is read as a record:
#: its row on SQLite, on PostgreSQL its row with its lease (the view intent_records).
INVARIANTS = {
    # (the count is of settled attempts: one started under the current lease is not counted yet)
    "an intent's attempt count differs from its attempts":
        "SELECT count(*) FROM {records} i WHERE i.attempts <> "
        "(SELECT count(DISTINCT a.number) FROM attempts a WHERE a.intent_seq = i.seq AND NOT "
        "(a.finished_at IS NULL AND i.status = 'leased' AND a.fence = i.fence))",
    "two attempts share a number":
        "SELECT count(*) FROM (SELECT intent_seq, number FROM attempts GROUP BY intent_seq, number "
        "HAVING count(*) > 1) twice",
    "a lease held outside status leased, or leased without one":
        "SELECT count(*) FROM {records} WHERE (status = 'leased') <> (lease_owner IS NOT NULL)",
    "an attempt unfinished while its intent is not leased":
        "SELECT count(*) FROM attempts a JOIN {records} i ON i.seq = a.intent_seq "
        "WHERE a.finished_at IS NULL AND i.status <> 'leased'",
    "an attempt with a fence above its intent's":
        "SELECT count(*) FROM attempts a JOIN {records} i ON i.seq = a.intent_seq WHERE a.fence > i.fence",
    "an intent without exactly one enqueued event":
        "SELECT count(*) FROM intents i WHERE "
        "(SELECT count(*) FROM events e WHERE e.intent_seq = i.seq AND e.kind = 'enqueued') <> 1",
}
#: PostgreSQL's own: a lease is a row of intent_leases, one above its intent's stored fence, beside a stored 'pending'.
POSTGRES_INVARIANTS = {
    "a stored status that says leased, or a lease beside another stored status than pending":
        "SELECT count(*) FROM intents i LEFT JOIN intent_leases l ON l.intent_seq = i.seq "
        "WHERE i.status = 'leased' OR (l.intent_seq IS NOT NULL AND i.status <> 'pending')",
    "a lease whose fence is not one above its intent's stored fence":
        "SELECT count(*) FROM intents i JOIN intent_leases l ON l.intent_seq = i.seq WHERE l.fence <> i.fence + 1",
}


async def integrity(url: str) -> None:
    """The store's integrity: SQLite's own check, and the outbox's invariants on either store."""
    sqlite = url.startswith("sqlite:")
    if sqlite:
        assert await rows(url, "PRAGMA integrity_check") == [("ok",)]
    invariants = {**INVARIANTS, **({} if sqlite else POSTGRES_INVARIANTS)}
    broken = {what: n for what, query in invariants.items()
              if (n := (await rows(url, query.format(records=records(url))))[0][0])}
    assert broken == {}, broken


async def arrived(receiver: Ground, attempts: set[str], timeout: float = 10) -> None:
    """Wait until a request of one of ``attempts`` has reached the receiver."""
    assert await eventually(lambda: bool(attempts & receiver.truth().reached), timeout), \
        "no request in flight reached the receiver"


async def recorded_facts(box: Outbox, ids: list[str]) -> list[IntentFact]:
    """What the store recorded for each of ``ids`` (scope ``acme``), as the checker reads it."""
    return await facts(box, [("acme", action_id) for action_id in ids])


def crashing(url: str, point: str) -> dict[str, str]:
    """The environment of an ``outbox worker`` that kills itself at ``point``."""
    return clean_env(OUTBOX_DATABASE_URL=url, OUTBOX_AUTHORITY="allow-all", OUTBOX_CRASH_AT=point,
                     OUTBOX_LEASE_SECONDS=str(LEASE_SECONDS), OUTBOX_WORKER_CONCURRENCY=str(CONCURRENCY),
                     OUTBOX_POLL_SECONDS=str(POLL_SECONDS))


@asynccontextmanager
async def enqueued(url: str, hook: str, ids: list[str], unretried: int = 0) -> AsyncIterator[Outbox]:
    """The store at ``url`` with one intent per id for the idempotent destination ``hook``, whose
    unknown outcomes are retried; every ``unretried``-th goes to one that never retries them."""
    settings = Settings(database_url=url, authority="allow-all", lease_seconds=LEASE_SECONDS,
                        worker_concurrency=CONCURRENCY, poll_seconds=POLL_SECONDS, backoff_initial_seconds=0.1)
    async with await Outbox.open(url, settings=settings) as box:
        for name, on_unknown in (("hook", OnUnknown.DECLARED), ("never", OnUnknown.NEVER)):
            await box.put_destination(name, DestinationSpec(
                url=hook, secret=SECRET, allow_private_network=True, idempotent=True, retention_seconds=3600,
                on_unknown=on_unknown))
        await box.enqueue_many({"destination": "never" if unretried and n % unretried == 0 else "hook",
                                "scope": "acme", "action_id": action_id, "payload": {"n": n}}
                               for n, action_id in enumerate(ids))
        yield box


async def recover(box: Outbox, count: int) -> None:
    """A worker without the setting recovers the expired leases and settles ``count`` intents."""
    recovery = Worker(box)
    running = asyncio.create_task(recovery.run())
    try:
        await settled(box, timeout=20 + count / 5, count=count)
    finally:
        recovery.stop()
        await running


async def recovered(box: Outbox, url: str, ids: list[str]) -> list[IntentFact]:
    """After the crashes: a worker without the setting settles every intent, the store's
    integrity holds, and what the store recorded for each."""
    await recover(box, len(ids))
    await integrity(url)
    return await recorded_facts(box, ids)


def judged(receiver: Ground, facts: list[IntentFact], row: str, title: str) -> None:
    """The checker's verdict on ``facts`` against what ``receiver`` saw, its table reported."""
    truth = receiver.truth()
    table = truth_table(facts, truth)
    report("webhook", row, title, table)
    assert check(facts, truth) == [], title
    assert off_diagonal(table) == 0, title


@pytest.mark.parametrize("point", get_args(CrashPoint))
async def test_a_worker_killed_at_a_crash_point_loses_and_misreports_nothing(
    tmp_path: Path, ground: tuple[Ground, str], store_url: str, point: str
) -> None:
    receiver, hook = ground
    url = store_url
    ids = [f"order-{n}" for n in range(INTENTS)]
    async with enqueued(url, hook, ids) as box:
        # 1. a worker process that kills itself at the point
        with outbox_worker(tmp_path, crashing(url, point)) as (worker, log):
            code = await asyncio.to_thread(worker.wait, 30)
        assert code == -9, f"the worker ended with {code}, not SIGKILL:\n{log.read_text()}"
        await integrity(url)
        attempts_at_crash = await rows(url, "SELECT attempt_id, finished_at FROM attempts")
        in_flight = {attempt for attempt, finished in attempts_at_crash if finished is None}
        # the crash cut every outcome short: none was committed
        assert len(in_flight) == len(attempts_at_crash), attempts_at_crash
        if point == "after_claim":
            assert not attempts_at_crash
        else:
            assert in_flight, f"no attempt had started when the worker died at {point}"
        if point in WRITTEN:  # a request written by the dead worker reaches the receiver
            await arrived(receiver, in_flight)
        reached_at_crash = set(receiver.truth().reached)
        if point == "after_claim":
            assert not reached_at_crash

        # 2. a worker without the setting recovers the expired leases and settles everything
        facts = await recovered(box, url, ids)
    judged(receiver, facts, f"{store_name(url)}-crash-{point}",
           f"{INTENTS} intents, {len(in_flight)} attempt(s) cut in flight")
    assert all(fact.status == "delivered" for fact in facts), facts  # idempotent: each retried to the end
    # an attempt is recorded maybe_submitted only if it really was in flight when the worker died
    maybe = {a.attempt_id for fact in facts for a in fact.attempts if a.submission == "maybe_submitted"}
    assert maybe == in_flight


def test_an_unknown_crash_point_is_refused_and_none_is_set_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OUTBOX_CRASH_AT", raising=False)
    assert Settings().crash_at is None
    monkeypatch.setenv("OUTBOX_CRASH_AT", "after_lunch")
    with pytest.raises(ValueError, match="crash_at"):
        Settings()


def test_a_crash_point_not_armed_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset, or set to another point, a point is passed (this test process survives it)."""
    monkeypatch.setattr(crash, "armed", None)
    for point in get_args(CrashPoint):
        crash.crash_point(point)
    crash.arm("after_claim")
    assert crash.armed == "after_claim"
    crash.crash_point("mid_group_commit")
    crash.arm("")
    assert crash.armed is None


async def test_workers_killed_one_after_another_at_drawn_points_lose_and_misreport_nothing(
    request: pytest.FixtureRequest, tmp_path: Path, ground: tuple[Ground, str], store_url: str
) -> None:
    """A chain of worker processes, each killing itself at a crash point drawn from the seed,
    take turns on one backlog (each recovers what the one before left in flight); then a worker
    without the setting finishes it. A third of the intents go to a destination that never
    retries an unknown outcome, so the table shows what the crashes left unknown.
    ``--faults=long``: more intents and more kills, random seed."""
    long, seed = tier(request)
    rng = random.Random(seed)
    count, kills = (60, 25) if long else (8, 4)
    receiver, hook = ground
    url = store_url
    ids = [f"order-{n}" for n in range(count)]
    died: Counter[str] = Counter()
    async with enqueued(url, hook, ids, unretried=3) as box:
        for _ in range(kills):
            point = rng.choice(get_args(CrashPoint))
            with outbox_worker(tmp_path, crashing(url, point)) as (worker, log):
                deadline = time.monotonic() + 30
                while (code := worker.poll()) is None and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                log_text = log.read_text()
            assert code in (-9, None), f"seed {seed}: the worker ended with {code}:\n{log_text}"
            if code is None:  # the backlog ran dry before the point came up (killed on leaving)
                break
            died[point] += 1
            await integrity(url)
        facts = await recovered(box, url, ids)
    kinds = ", ".join(f"{point} {n}" for point, n in sorted(died.items()))
    judged(receiver, facts, f"{store_name(url)}-crashes", f"{count} intents, seed {seed}, workers killed: {kinds}")
    assert sum(died.values()) > 0, f"seed {seed}: no worker died"
    # an unknown outcome is retried to the end where the destination allows it, and kept otherwise
    assert all(fact.status == "delivered" or (fact.status == "unknown" and n % 3 == 0)
               for n, fact in enumerate(facts)), f"seed {seed}: {facts}"


@pytest.mark.parametrize("breakage", [
    "UPDATE intents SET attempts = attempts + 1",
    {"sqlite": "UPDATE intents SET lease_owner = 'w'", "postgres": "UPDATE intents SET status = 'leased'"},
    {"sqlite": "UPDATE intents SET status = 'leased'",
     "postgres": "INSERT INTO intent_leases SELECT seq, destination, 'w', now(), fence + 2, now() FROM intents"},
    "DELETE FROM events WHERE kind = 'enqueued'",
])
async def test_the_integrity_check_finds_a_broken_store(store_url: str, breakage: str | dict[str, str]) -> None:
    async with enqueued(store_url, "http://127.0.0.1:9/", ["order-0"]):
        pass
    await integrity(store_url)
    await rows(store_url, breakage if isinstance(breakage, str) else
               breakage["sqlite" if store_url.startswith("sqlite:") else "postgres"])
    with pytest.raises(AssertionError):
        await integrity(store_url)
