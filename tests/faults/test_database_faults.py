"""The fault matrix's database row: the outbox's own database fails under a working sender.

A real worker delivers a few hundred webhook intents (their due times spread over the fault's
window, so deliveries go on while it lasts) to the fault matrix's receiver (tests/faults/
test_matrix.py: the receivers' idempotency middleware, recording every request and every
effect), while the database fails underneath it:

- PostgreSQL: another connection terminates the worker's backends (its pool and its listener)
  every 100-300 ms, some of them caught inside a statement or an open transaction;
- SQLite, disk full: a real ``outbox worker`` process has its file-size limit (RLIMIT_FSIZE)
  lowered below the size of the database's write-ahead log while it delivers, so the kernel
  refuses its writes (EFBIG, which SQLite reports as a disk I/O error), and then raised again;
- SQLite, disk full on the worker's own connection: SQLite's ``max_page_count`` lowered to the
  database's size, so every write that needs a page answers SQLITE_FULL ("database or disk is
  full"), then raised again;
- SQLite, locked: another connection holds ``BEGIN EXCLUSIVE`` well past the store's busy
  timeout, again and again.

Each fault is proven to have happened (backends terminated, the worker's own words about the
error). The worker must live through it and settle every intent by itself once the database
answers again; then the store's histories and the receiver's truth go through the checker:
nothing lost, one effect per key, nothing recorded delivered without its effect, no request
recorded not submitted that reached the receiver. The truth table is printed and kept.
"""

from __future__ import annotations

import asyncio
import logging
import random
import resource
import signal
import sqlite3
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from outbox import DestinationSpec, Outbox, Settings
from outbox.store.plumbing import on_thread
from outbox.store.postgres import LISTENER
from outbox.store.sqlite import SqliteStore
from sender import Worker

from ..acceptance.conftest import clean_env, outbox_worker
from ..acceptance.test_postgres_scale import Process, named, start
from ..conftest import SECRET, eventually, rows
from ..servers import Served
from .checker import IntentFact, Truth, check, off_diagonal, truth_table
from .test_crash_points import integrity
from .test_matrix import Ground, facts, receiver_app, report, run_until_settled, settled, tier

#: Intents per run, and the window their due times are spread over (the fault's window); the
#: seeded rows (terminated, locked) take LONG times as many, and as long, with ``--faults=long``.
INTENTS = 300
SPREAD_SECONDS = 6.0
LONG = 4
#: The worker's settings: short leases and quick retries, so recovery fits in a test.
WORKER: dict[str, Any] = {"authority": "allow-all", "lease_seconds": 3.0, "poll_seconds": 0.1,
                          "backoff_initial_seconds": 0.05, "backoff_cap_seconds": 0.5, "circuit_failures": 0,
                          "default_max_attempts": 100, "drain_seconds": 2.0}
#: How the test's own PostgreSQL connections show in pg_stat_activity: they are spared.
OBSERVER = "fault observer"
SETTLE_SECONDS = 45.0


@pytest.fixture
def ground(tmp_path: Path) -> Iterator[tuple[Ground, str]]:
    """The fault matrix's receiver on uvicorn; yields its ground truth and URL."""
    truth = Ground()
    served = Served(receiver_app(truth, tmp_path / "records.db"), lifespan="on", timeout_graceful_shutdown=2)
    try:
        yield truth, served.url
    finally:
        served.stop()


@pytest.fixture
def seeded(request: pytest.FixtureRequest) -> tuple[int, int]:
    """This run's seed, and how many times the tier-1 size the seeded rows run."""
    long, seed = tier(request)
    return seed, LONG if long else 1


async def enqueue(box: Outbox, url: str, count: int = INTENTS, spread: float = SPREAD_SECONDS) -> list[tuple[str, str]]:
    """Register the receiver (idempotent, so an unknown outcome is retried) and enqueue
    ``count`` intents due one after another over ``spread`` seconds; returns their keys."""
    spec: dict[str, Any] = {"url": f"{url}/hook", "secret": SECRET, "allow_private_network": True,
                            "timeout_seconds": 5.0, "idempotent": True, "retention_seconds": 3600}
    await box.put_destination("hook", DestinationSpec(**spec))
    start = box.clock.now()
    results = await box.enqueue_many(
        {"scope": "acme", "action_id": f"a-{n}", "destination": "hook", "payload": {"n": n, "pad": "x" * 500},
         "not_before": start + timedelta(seconds=spread * n / count)} for n in range(count))
    return [(r.intent.scope, r.intent.action_id) for r in results]


def worker_env(url: str) -> dict[str, str]:
    """The environment of an ``outbox worker`` process on ``url`` with the WORKER settings."""
    return clean_env(OUTBOX_DATABASE_URL=url, OUTBOX_WORKER_CONCURRENCY="8",
                     **{f"OUTBOX_{name.upper()}": str(value) for name, value in WORKER.items()})


def judge(store: str, title: str, still_open: list[str], history: list[IntentFact], truth: Truth) -> None:
    """Print the truth table; assert everything settled, delivered, and the checker found nothing."""
    table = truth_table(history, truth)
    submissions = Counter(a.submission for fact in history for a in fact.attempts)
    rendered = report("webhook", store, f"{title}; attempts: " + ", ".join(
        f"{kind} {n}" for kind, n in sorted(submissions.items(), key=str)), table)
    assert still_open == [], f"not settled: {still_open}"
    assert check(history, truth) == []
    assert off_diagonal(table) == 0, rendered
    assert {fact.status for fact in history} == {"delivered"}, rendered  # the receiver accepts every one


def said(caplog: pytest.LogCaptureFixture, words: str) -> int:
    """How many of the outbox's log records carry ``words`` (in the message or its exception)."""
    return sum(1 for r in caplog.records if r.name.startswith("outbox")
               and words in r.getMessage() + (logging.Formatter().formatException(r.exc_info) if r.exc_info else ""))


# -- PostgreSQL: connections terminated -------------------------------------------------------

#: Every backend of the outbox database but the terminator's own and the test's observer.
TERMINATE = ("SELECT state, application_name, pg_terminate_backend(pid) FROM pg_stat_activity "
             "WHERE datname = current_database() AND pid <> pg_backend_pid() AND application_name <> $1")
#: Only those inside a statement or an open transaction (not the listener waiting).
TERMINATE_BUSY = TERMINATE + (" AND (state = 'idle in transaction' OR (state = 'active' AND application_name <> "
                              f"'{LISTENER}'))")


async def terminate(url: str, rng: random.Random, rounds: int) -> Counter[str]:
    """Every 100-300 ms terminate the worker's backends: all of them, or (every other round)
    the first caught inside a statement or a transaction; returns how many per state."""
    conn = await asyncpg.connect(url)
    killed: Counter[str] = Counter()
    try:
        for n in range(rounds):
            await asyncio.sleep(rng.uniform(0.1, 0.3))
            for _ in range(1 if n % 2 == 0 else 100):
                found = await conn.fetch(TERMINATE if n % 2 == 0 else TERMINATE_BUSY, OBSERVER)
                killed.update(state or "none" for state, _, done in found if done)
                if found:
                    break
                await asyncio.sleep(0.003)
    finally:
        await conn.close()
    return killed


async def test_postgres_connections_terminated_mid_batch_lose_duplicate_or_misreport_nothing(
        seeded: tuple[int, int], pg_url: str, ground: tuple[Ground, str], caplog: pytest.LogCaptureFixture
) -> None:
    (seed, scale), (receiver, url) = seeded, ground
    settings = Settings(**WORKER)
    observer = await Outbox.open(f"{pg_url}?application_name={OBSERVER.replace(' ', '+')}", settings=settings)
    box = await Outbox.open(pg_url, settings=settings)
    worker = Worker(box, concurrency=8)
    try:
        keys = await enqueue(observer, url, INTENTS * scale, SPREAD_SECONDS * scale)
        killing = asyncio.create_task(terminate(pg_url, random.Random(seed), rounds=36 * scale))
        still_open, history = await run_until_settled(observer, worker, keys, timeout=SETTLE_SECONDS * scale)
        killed = await killing
    finally:
        await worker.aclose()
        await box.close()
        await observer.close()
    busy = killed["active"] + killed["idle in transaction"]
    judge("postgres-terminated", f"{len(keys)} intents, seed {seed}, backends terminated: "
          + ", ".join(f"{state} {n}" for state, n in sorted(killed.items())), still_open, history, receiver.truth())
    assert sum(killed.values()) >= 10 and busy > 0, killed
    assert said(caplog, "connection") > 0, "the worker never noticed a lost connection"


# -- PostgreSQL: every connection of three worker processes terminated, five times -------------

#: Worker processes, and the rounds in which every backend of theirs is terminated.
PROCESSES = 3
ROUNDS = 5
#: The pause before each round, drawn from this range (seconds; LONG times as long with --faults=long).
ROUND_PAUSE = (0.2, 1.2)
#: The intents' due times are spread over this long, past the last round however the pauses fall.
ROUNDS_SPREAD_SECONDS = 12.0
#: What a worker's log must never say: asyncpg's words for work refused on a connection whose
#: session the server had ended, and any traceback (a fault not answered as "not now").
NEVER_LOGGED = ("another operation", "cannot switch to state", "InternalClientError", "Traceback")


async def test_three_worker_processes_deliver_everything_through_five_rounds_of_terminated_connections(
        seeded: tuple[int, int], pg_url: str, ground: tuple[Ground, str], tmp_path: Path) -> None:
    """Three real ``outbox worker`` processes deliver while, five times at random moments, every
    backend of theirs (pools and listeners) is terminated. A connection the server ended must
    never be given more work: no worker may log asyncpg's refusal of it or die, and every intent
    is delivered within a minute of the last round."""
    (seed, scale), (receiver, url) = seeded, ground
    rng = random.Random(seed)
    observer = await Outbox.open(f"{pg_url}?application_name={OBSERVER.replace(' ', '+')}",
                                 settings=Settings(**WORKER))
    monitor = await asyncpg.connect(pg_url)
    workers: list[Process] = []
    rounds: list[tuple[int, Counter[str]]] = []  # intents not yet delivered, and the backends cut by name
    try:
        keys = await enqueue(observer, url, INTENTS * scale, ROUNDS_SPREAD_SECONDS * scale)
        workers = [start(tmp_path, f"worker-{n}", ["worker"], worker_env(named(pg_url, f"worker-{n}")))
                   for n in range(PROCESSES)]
        for w in workers:  # each has its pool open, and claims
            assert await eventually(lambda w=w: " started (concurrency" in w.log.read_text(), timeout=30), w.tail()
        for _ in range(ROUNDS):
            await asyncio.sleep(rng.uniform(*ROUND_PAUSE) * scale)
            found = await monitor.fetch(TERMINATE, OBSERVER)
            rounds.append((len(keys) - await delivered(pg_url), Counter(name for _, name, done in found if done)))
        still_open = await settled(observer, keys, timeout=60.0)
        alive = {w.name: w.proc.poll() is None for w in workers}
        history = await facts(observer, keys)
    finally:
        for w in workers:
            if w.proc.poll() is None:
                w.proc.terminate()
        for w in workers:
            w.proc.wait(15)
        await monitor.close()
        await observer.close()
    judge("postgres-terminated-processes", f"{len(keys)} intents, {PROCESSES} worker processes, seed {seed}, "
          f"{ROUNDS} rounds of every backend terminated (undelivered, backends cut): "
          + "; ".join(f"{left}, {sum(cut.values())}" for left, cut in rounds), still_open, history, receiver.truth())
    assert all(alive.values()), alive
    # each round hit a running system and cut every worker's pool, and listeners (a listener may
    # still be pausing before it listens again after the round before)
    for left, cut in rounds:
        assert left > 0, rounds
        assert all(cut[f"worker-{n}"] > 0 for n in range(PROCESSES)) and cut[LISTENER] > 0, rounds
    said = {w.name: [words for words in NEVER_LOGGED if words in w.log.read_text()] for w in workers}
    assert not any(said.values()), "\n".join(w.tail() for w in workers if said[w.name])


# -- SQLite: locked ---------------------------------------------------------------------------

def hold_locks(path: Path, rng: random.Random, holds: int, stop: threading.Event) -> int:
    """From a connection of its own, take ``BEGIN EXCLUSIVE`` ``holds`` times for 0.6-1.0 s each
    (three to five times the worker's busy timeout), 0.1-0.4 s apart; returns how many were held."""
    held = 0
    with closing(sqlite3.connect(path, isolation_level=None, timeout=30)) as conn:
        for _ in range(holds):
            if stop.wait(rng.uniform(0.1, 0.4)):
                break
            conn.execute("BEGIN EXCLUSIVE")
            held += 1
            stop.wait(rng.uniform(0.6, 1.0))
            conn.execute("COMMIT")
    return held


async def test_sqlite_locked_past_the_busy_timeout_loses_duplicates_or_misreports_nothing(
        seeded: tuple[int, int], db_path: Path, ground: tuple[Ground, str], caplog: pytest.LogCaptureFixture
) -> None:
    (seed, scale), (receiver, url) = seeded, ground
    box = await Outbox.open(f"sqlite:///{db_path}", settings=Settings(**WORKER, sqlite_busy_timeout_ms=200))
    worker = Worker(box, concurrency=8)
    stop = threading.Event()
    try:
        keys = await enqueue(box, url, INTENTS * scale, SPREAD_SECONDS * scale)
        locking = asyncio.create_task(asyncio.to_thread(hold_locks, db_path, random.Random(seed), 6 * scale, stop))
        still_open, history = await run_until_settled(box, worker, keys, timeout=SETTLE_SECONDS * scale)
        held = await locking
    finally:
        stop.set()
        await worker.aclose()
        await box.close()
    judge("sqlite-locked", f"{len(keys)} intents, seed {seed}, exclusive lock held {held} times", still_open,
          history, receiver.truth())
    assert held == 6 * scale
    assert said(caplog, "database is locked") > 0, "the worker never met the lock"
    await integrity(f"sqlite:///{db_path}")


# -- SQLite: disk full ------------------------------------------------------------------------

async def delivered(url: str) -> int:
    """How many intents the database at ``url`` holds delivered."""
    return int((await rows(url, "SELECT count(*) FROM intents WHERE status = 'delivered'"))[0][0])


async def delivering(url: str) -> bool:
    """Whether the worker has delivered anything yet."""
    return await delivered(url) > 0


def file_size_limit(pid: int, limit: int) -> None:
    """Set the running process ``pid``'s file-size limit (RLIMIT_FSIZE, soft; the hard one stays)."""
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, resource.prlimit(pid, resource.RLIMIT_FSIZE)[1]))


@pytest.mark.parametrize("recovery", ["in place", "restarted"])
async def test_sqlite_disk_full_for_a_worker_process_loses_duplicates_or_misreports_nothing(
        db_path: Path, tmp_path: Path, ground: tuple[Ground, str], recovery: str) -> None:
    """The disk fills up under a worker process; space comes back for that same worker (it goes
    on by itself), or the worker is stopped while the disk is still full (SIGTERM: it drains
    and stops, unable to record what it drains) and a new one takes over."""
    receiver, url = ground
    db_url = f"sqlite:///{db_path}"
    env = worker_env(db_url)
    async with await Outbox.open(db_url, settings=Settings(**WORKER)) as box:
        keys = await enqueue(box, url)
        with outbox_worker(tmp_path, env) as (worker, log):
            assert await eventually(lambda: delivering(db_url), timeout=30), log.read_text()
            # the disk fills up: no write of the worker's may reach past what its log needs (the
            # write-ahead log, where every commit goes first, is already longer)
            limit = log.stat().st_size + 64 * 1024
            assert Path(f"{db_path}-wal").stat().st_size > limit
            file_size_limit(worker.pid, limit)
            full_at = await delivered(db_url)
            assert full_at < INTENTS, "everything was delivered before the disk filled up"
            assert await eventually(lambda: "disk I/O error" in log.read_text(), timeout=20), log.read_text()
            await asyncio.sleep(3)
            assert worker.poll() is None, log.read_text()
            during = await delivered(db_url)
            if recovery == "in place":  # space comes back: the same worker goes on by itself
                file_size_limit(worker.pid, resource.RLIM_INFINITY)
                still_open = await settled(box, keys, timeout=SETTLE_SECONDS)
            worker.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(worker.wait, 15)
            words = log.read_text()
        if recovery == "restarted":  # a new worker, with room to write
            still_open, _ = await run_until_settled(box, Worker(box, concurrency=8), keys, timeout=SETTLE_SECONDS)
        history = await facts(box, keys)
    errors = words.count("disk I/O error")
    judge(f"sqlite-full-{recovery.replace(' ', '-')}",
          f"{INTENTS} intents, disk full after {full_at} delivered, {during - full_at} more committed "
          f"as it filled ({errors} errors logged), recovery: {recovery}", still_open, history, receiver.truth())
    assert code == 0, words
    await integrity(db_url)


async def fill_up(store: SqliteStore, caplog: pytest.LogCaptureFixture, seconds: float) -> tuple[int, int]:
    """Once something was delivered, cap the store's own writing connection at the pages the
    database has (SQLite then answers every write that needs one more page SQLITE_FULL); once
    the worker has met it, ``seconds`` more, then lift the cap. Returns the pages and how many
    intents were delivered when the cap came."""
    url = f"sqlite:///{store.path}"
    assert await eventually(lambda: delivering(url), timeout=30)
    writer = store._open_committer.db  # the cap is the connection's own: it must be the store's writer

    def cap(conn: sqlite3.Connection, pages: int | None) -> int:
        limit = conn.execute("PRAGMA page_count").fetchone()[0] if pages is None else pages
        return int(conn.execute(f"PRAGMA max_page_count = {int(limit)}").fetchone()[0])

    pages = await on_thread(writer, cap, None)
    full_at = await delivered(url)
    assert await eventually(lambda: said(caplog, "database or disk is full") > 0, timeout=20), "never full"
    await asyncio.sleep(seconds)
    await on_thread(writer, cap, 2**31)
    return pages, full_at


async def test_sqlite_full_on_the_workers_connection_loses_duplicates_or_misreports_nothing(
        db_path: Path, ground: tuple[Ground, str], caplog: pytest.LogCaptureFixture) -> None:
    receiver, url = ground
    box = await Outbox.open(f"sqlite:///{db_path}", settings=Settings(**WORKER))
    assert isinstance(box.store, SqliteStore)
    worker = Worker(box, concurrency=8)
    try:
        keys = await enqueue(box, url)
        filling = asyncio.create_task(fill_up(box.store, caplog, seconds=3.0))
        still_open, history = await run_until_settled(box, worker, keys, timeout=SETTLE_SECONDS)
        pages, full_at = await filling
    finally:
        await worker.aclose()
        await box.close()
    judge("sqlite-max-pages", f"{INTENTS} intents, full at {pages} pages after {full_at} delivered "
          f"({said(caplog, 'database or disk is full')} errors logged)", still_open, history, receiver.truth())
    await integrity(f"sqlite:///{db_path}")
    # "not now" from the database is a line in the log, not a traceback
    assert [r.getMessage() for r in caplog.records if r.exc_info and "disk is full" in str(r.exc_info[1])] == []
