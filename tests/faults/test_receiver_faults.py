"""The fault matrix's receiver row: the receiver, not the sender, fails, on SQLite and PostgreSQL.

A real ``sender.Worker`` delivers webhook intents (the destination declares idempotency and its
retention, ``on_unknown: declared``, short timeouts) to a receiver behind
``receivers.IdempotencyMiddleware``; the receiver's ground truth goes through the fault checker.

Killed between its effect and its record: the receiver is a real uvicorn process
(tests/faults/receiver_process.py) with its records in a SQLite file. For a seeded subset of keys
its handler commits the effect in its own SQLite file and SIGKILLs its process before answering, so
the middleware never completes the record. A supervisor starts it again on the same port. The
contract leaves this window to the application: the record stays in progress until its lease runs
out, and then a retry takes it over with a higher epoch and runs the handler again. With a plain
effect the effect therefore happens twice; the outbox still records nothing false (the cut attempt
is ``maybe_submitted``, ``delivered`` only after an effect), and the checker, told the receiver is
idempotent, flags exactly the keys the window duplicated. With the effect fenced on the key as the
README asks (``INSERT ... ON CONFLICT (key) DO NOTHING`` in the handler's own transaction) every key
has exactly one effect and every intent ends delivered.

Record store down: the receiver's ``PostgresRecordStore`` database stops taking connections
(``ALLOW_CONNECTIONS false`` and its backends terminated), or its ``SqliteRecordStore`` file's write
lock is held by another connection, while intents are sent. The middleware
answers 503 without running the handler, the sender records those attempts submitted and
retryable and backs off, and once the database is back every intent is delivered with one effect.
"""

from __future__ import annotations

import asyncio
import random
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest

from outbox import DestinationSpec, OnUnknown, Outbox, Settings
from receivers import IdempotencyMiddleware, PostgresRecordStore, RecordStore, SqliteRecordStore
from sender import Worker

from .. import pg
from ..acceptance.conftest import clean_env
from ..conftest import SECRET, free_port
from ..servers import Served
from .checker import IntentFact, Truth, check, off_diagonal, truth_table
from .receiver_process import header, lifespan
from .tables import store_name
from .test_matrix import facts, report, run_until_settled, settled, tier
from .test_paused_and_revoked import until

ROOT = Path(__file__).resolve().parents[2]
INTENTS = 12
CRASHES = 3
RECEIVER_LEASE_SECONDS = 2.0
SETTINGS = Settings(authority="allow-all", backoff_initial_seconds=0.05, backoff_cap_seconds=0.5,
                    circuit_failures=0, poll_seconds=0.1, default_max_attempts=500,
                    secrets_key_file=pg.key_file())  # (made before pg_url could set it; PostgreSQL needs it)
#: Takes a record store down (False) or brings it back (True).
Switch = Callable[[bool], Awaitable[None]]
DESTINATION: dict[str, Any] = {"secret": SECRET, "allow_private_network": True, "timeout_seconds": 2.0,
                               "idempotent": True, "retention_seconds": 3600, "on_unknown": OnUnknown.DECLARED}


class Supervisor:
    """Runs the receiver process on one port and starts it again each time it dies."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = ["--port", str(self.port), *args]
        self.log = log
        self.exits: list[int] = []  # the exit code of each process that died while supervised
        self._lock = threading.Lock()
        self._stopping = False
        self._process: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._supervise, daemon=True, name="receiver-supervisor")

    def start(self) -> None:
        """Start supervising; returns once the first process listens."""
        self._thread.start()
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                assert time.monotonic() < deadline, f"the receiver did not start:\n{self.log.read_text()}"
                time.sleep(0.05)

    def _supervise(self) -> None:
        while True:
            with self._lock:
                if self._stopping:
                    return
                with self.log.open("a") as out:
                    process = subprocess.Popen(
                        [sys.executable, "-m", "tests.faults.receiver_process", *self.args], cwd=ROOT,
                        env=clean_env(RECEIVER_SECRET=SECRET), stdout=out, stderr=subprocess.STDOUT)
                self._process = process
            code = process.wait()
            with self._lock:
                if self._stopping:
                    return
                self.exits.append(code)

    def stop(self) -> None:
        """Stop the running process (SIGTERM, then SIGKILL) and supervising."""
        with self._lock:
            self._stopping = True
            process = self._process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._thread.join(10)


@contextmanager
def supervised(args: list[str], log: Path) -> Iterator[Supervisor]:
    """The receiver process with ``args``, supervised until leaving (then stopped)."""
    supervisor = Supervisor(args, log)
    try:
        supervisor.start()
        yield supervisor
    finally:
        supervisor.stop()


@dataclass(frozen=True)
class Run:
    """One run of the handler, from the effects file: its key, claim epoch and attempt."""

    key: str
    epoch: int
    attempt_id: str


@dataclass(frozen=True)
class Effects:
    """What the effects file says happened at the receiver process."""

    reached: frozenset[str]
    runs: tuple[Run, ...]  # in order
    effects: tuple[Run, ...]  # the effect rows, in order
    crashed: frozenset[str]

    @classmethod
    def read(cls, path: Path) -> Effects:
        with sqlite3.connect(path) as db:
            def runs(table: str) -> tuple[Run, ...]:
                query = f"SELECT key, epoch, attempt_id FROM {table} ORDER BY rowid"
                return tuple(Run(*row) for row in db.execute(query))

            return cls(frozenset(a for (a,) in db.execute("SELECT attempt_id FROM reached")), runs("runs"),
                       runs("effects"), frozenset(k for (k,) in db.execute("SELECT key FROM crashed")))

    def truth(self, *, idempotent: bool) -> Truth:
        return Truth(Counter(e.key for e in self.effects), self.reached, idempotent=idempotent)


async def enqueue(box: Outbox, numbers: range) -> list[tuple[str, str]]:
    """One intent for ``hook`` per number (scope ``acme``, action ``a-N``); their keys."""
    return [(r.intent.scope, r.intent.action_id) for r in await box.enqueue_many(
        {"scope": "acme", "action_id": f"a-{n}", "destination": "hook", "payload": {"n": n}} for n in numbers)]


def maybe_submitted(history: list[IntentFact]) -> set[str]:
    """The attempts the outbox recorded ``maybe_submitted``."""
    return {a.attempt_id for i in history for a in i.attempts if a.submission == "maybe_submitted"}


@pytest.mark.parametrize("fenced", [False, True], ids=["plain-effect", "fenced-effect"])
async def test_a_receiver_killed_between_its_effect_and_its_record(
        request: pytest.FixtureRequest, store_url: str, tmp_path: Path, fenced: bool) -> None:
    seed = tier(request)[1]
    crash_keys = sorted(f"acme/a-{n}" for n in random.Random(seed).sample(range(INTENTS), CRASHES))
    effects_file = tmp_path / "effects.db"
    args = ["--records", str(tmp_path / "records.db"), "--effects", str(effects_file), "--lease-seconds",
            str(RECEIVER_LEASE_SECONDS), "--crash-keys", ",".join(crash_keys), *(["--fenced"] if fenced else [])]
    with supervised(args, tmp_path / "receiver.log") as receiver:
        async with await Outbox.open(store_url, settings=SETTINGS) as box:
            worker = Worker(box, concurrency=4)
            try:
                await box.put_destination("hook", DestinationSpec(**{**DESTINATION, "url": f"{receiver.url}/hook"}))
                keys = await enqueue(box, range(INTENTS))
                still_open, history = await run_until_settled(box, worker, keys, timeout=45)
                delivered_ids = {key: (await box.show(key.partition("/")[2], scope="acme"))[1].attempts[-1].external_id
                                 for key in crash_keys}
            finally:
                await worker.aclose()
    seen = Effects.read(effects_file)
    truth = seen.truth(idempotent=fenced)
    table = truth_table(history, truth)
    kind = "fenced" if fenced else "plain"
    effect = ("effect fenced on the key" if fenced
              else "plain effect, not idempotent: the README's window duplicates it")
    rendered = report("webhook", f"{store_name(store_url)}-receiver-crash-{kind}",
                      f"{INTENTS} intents, seed {seed}, receiver killed after its effect for "
                      f"{', '.join(crash_keys)} ({effect}); {len(maybe_submitted(history))} attempt(s) "
                      f"maybe_submitted, {sum(r.epoch > 1 for r in seen.runs)} takeover(s)", table, summed=fenced)
    log = (tmp_path / "receiver.log").read_text()
    assert still_open == [], f"seed {seed}: not settled: {still_open}"
    # the receiver died once per chosen key, each time of its own SIGKILL, and was started again
    assert seen.crashed == set(crash_keys) and receiver.exits == [-9] * CRASHES, (receiver.exits, log)
    assert all(i.status == "delivered" for i in history), f"seed {seed}\n{rendered}"
    assert check(history, truth) == [], f"seed {seed}"
    cut = maybe_submitted(history)
    runs: dict[str, list[Run]] = {}
    for run in seen.runs:
        runs.setdefault(run.key, []).append(run)
    for key in crash_keys:
        # the killed run's attempt was recorded maybe_submitted; a retry took the record over,
        # once its lease had run out, with a higher epoch and ran the handler again
        assert runs[key][0].attempt_id in cut and runs[key][0].attempt_id in seen.reached, (key, runs[key])
        assert len(runs[key]) >= 2 and runs[key][-1].epoch > runs[key][0].epoch, (key, runs[key])
    for key, each in runs.items():
        # every handler run but a key's last was cut by a kill: its attempt is maybe_submitted
        assert all(r.attempt_id in cut for r in each[:-1]), key
    duplicated = {key for key, n in truth.effects.items() if n > 1}
    if fenced:
        assert duplicated == set() and set(truth.effects) == {f"{s}/{a}" for s, a in keys}
        assert off_diagonal(table) == 0, f"seed {seed}\n{rendered}"
        for key in crash_keys:  # the takeover answered with the effect the killed run made
            assert delivered_ids[key] == f"effect-{key}-{runs[key][0].epoch}", (key, delivered_ids)
    else:
        # exactly the README's window: each killed key's effect happened again, and the checker,
        # told the receiver deduplicates, says so for exactly the duplicated keys
        assert set(crash_keys) <= duplicated
        assert off_diagonal(table) == table[("delivered", "more than once")] == len(duplicated)
        flagged = check(history, seen.truth(idempotent=True))
        assert sorted(flagged) == sorted(f"{key}: {truth.effects[key]} effects at an idempotent receiver"
                                         for key in duplicated)


@dataclass
class Ground:
    """The in-process receiver's truth: each request's answer, each handler run and when."""

    answers: list[tuple[str, str, int]] = field(default_factory=list)  # (key, attempt id, status)
    runs: list[tuple[str, str, float]] = field(default_factory=list)  # (key, attempt id, monotonic time)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def truth(self) -> Truth:
        with self.lock:
            return Truth(Counter(key for key, _, _ in self.runs), frozenset(a for _, a, _ in self.answers))

    def answered(self, status: int) -> list[tuple[str, str]]:
        """(key, attempt id) of each request answered ``status``."""
        with self.lock:
            return [(key, attempt) for key, attempt, answer in self.answers if answer == status]


def recording_app(ground: Ground, records: RecordStore) -> Any:
    """Each request's answer, recorded around the middleware; each handler run, behind it."""

    async def effect(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        with ground.lock:
            ground.runs.append((scope["state"]["idempotency"].key, header(scope, b"outbox-attempt-id"),
                                time.monotonic()))
        await send({"type": "http.response.start", "status": 201, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"ok": true}'})

    guarded = IdempotencyMiddleware(effect, records, secrets=SECRET, retention_seconds=3600,
                                    lease_seconds=RECEIVER_LEASE_SECONDS)

    async def recorder(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await guarded(scope, receive, send)
            return
        key, attempt = header(scope, b"idempotency-key"), header(scope, b"outbox-attempt-id")

        async def answering(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                with ground.lock:
                    ground.answers.append((key, attempt, message["status"]))
            await send(message)

        await guarded(scope, receive, answering)

    return recorder


async def allow_connections(dsn: str, allowed: bool) -> None:
    """Open or close the database at ``dsn`` to connections; closing also ends the open ones."""
    name = urlsplit(dsn).path.lstrip("/")
    admin = await asyncpg.connect(pg.ADMIN_DSN)
    try:
        await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(allowed).lower()}')
        if not allowed:
            await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                "WHERE datname = $1 AND pid <> pg_backend_pid()", name)
    finally:
        await admin.close()


@asynccontextmanager
async def unreliable_records(kind: str, tmp_path: Path) -> AsyncIterator[tuple[RecordStore, Switch]]:
    """A record store of ``kind`` and the switch that takes it down (False) and back up (True).

    PostgreSQL: its database stops taking connections and the open ones are ended. SQLite: another
    connection holds the file's write lock (``BEGIN EXCLUSIVE``, as a long transaction or a backup
    would), so the store's writes give up after its busy timeout.
    """
    if kind == "postgres":
        async with pg.database() as dsn:
            try:
                yield PostgresRecordStore(dsn), partial(allow_connections, dsn)
            finally:
                await allow_connections(dsn, True)
        return
    path = tmp_path / "records.db"
    holder = sqlite3.connect(path, isolation_level=None, timeout=10)

    async def hold(available: bool) -> None:
        holder.execute("ROLLBACK" if available else "BEGIN EXCLUSIVE")

    try:
        yield SqliteRecordStore(path, busy_timeout_ms=100), hold
    finally:
        holder.close()


@pytest.mark.parametrize("records", ["postgres", "sqlite"], ids=["pg-records", "sqlite-records"])
async def test_a_receiver_whose_record_store_is_down_runs_nothing_until_it_is_back(
        store_url: str, tmp_path: Path, records: str) -> None:
    ground = Ground()
    async with (unreliable_records(records, tmp_path) as (store, available),
                await Outbox.open(store_url, settings=SETTINGS) as box):
        receiver = Served(recording_app(ground, store), lifespan="on", timeout_graceful_shutdown=2)
        worker = Worker(box, concurrency=4)
        running = asyncio.create_task(worker.run())
        try:
            await box.put_destination("hook", DestinationSpec(**{**DESTINATION, "url": f"{receiver.url}/hook"}))
            # 1. a first batch delivered while the store is up (so it is open and in use)
            before = await enqueue(box, range(4))
            assert await settled(box, before, timeout=30) == []
            # 2. the store goes down; a second batch is sent meanwhile, each key at least twice
            await available(False)
            during = await enqueue(box, range(4, INTENTS))
            refused = {f"{s}/{a}" for s, a in during}

            def ran_while_down() -> bool:
                with ground.lock:
                    return any(key in refused for key, _, _ in ground.runs)

            def refused_twice() -> bool:
                answered = Counter(key for key, _ in ground.answered(503))
                return answered.keys() == refused and min(answered.values()) >= 2

            await until(lambda: ran_while_down() or refused_twice(), 30, "answered 503 twice for each key")
            assert not ran_while_down(), "a handler ran while the store was down"
            # 3. the store is back: everything is delivered
            back_at = time.monotonic()
            await available(True)
            still_open = await settled(box, before + during, timeout=30)
            history = await facts(box, before + during)
        finally:
            worker.stop()
            await asyncio.wait_for(running, 15)
            await worker.aclose()
            receiver.stop()
    truth = ground.truth()
    table = truth_table(history, truth)
    unavailable = ground.answered(503)
    down = "refused connections" if records == "postgres" else "was locked"
    rendered = report("webhook", f"{store_name(store_url)}-records-down-{records}",
                      f"{len(history)} intents, the receiver's {records} record store {down} while "
                      f"{len(during)} of them were sent ({len(unavailable)} requests answered 503)", table)
    assert still_open == [], still_open
    assert all(i.status == "delivered" for i in history), rendered
    assert check(history, truth) == []
    assert off_diagonal(table) == 0, rendered
    assert set(truth.effects.values()) == {1} and len(truth.effects) == INTENTS
    # no request answered 503 ran the handler; the refused batch's effects all came once it was back
    ran = {attempt for _, attempt, _ in ground.runs}
    assert not ran & {attempt for _, attempt in unavailable}
    assert all(at > back_at for key, _, at in ground.runs if key in refused)
    # the sender recorded each 503 as an answer (submitted) to retry after a backoff
    recorded = {a.attempt_id: (a.submission, a.outcome) for i in history for a in i.attempts}
    assert {recorded[attempt] for _, attempt in unavailable} == {("submitted", "retryable")}
