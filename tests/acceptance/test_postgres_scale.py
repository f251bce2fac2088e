"""Three ``outbox worker`` processes and ``outbox serve --no-worker`` on one PostgreSQL database,
3,000 intents to an idempotent receiver, and faults in the middle of the run.

Intents are enqueued through the served HTTP API (in waves, each started as a fault hits) and,
for the bulk, through the library's ``enqueue_many`` on the same database. The faults: ``kill -9``
of one worker while its sends are in flight, then, twice and a few seconds apart, every connection
to the database (the workers', the service's, the test's own) terminated by the server.

No replacement is started for the killed worker: its expired leases must be recovered by the
sweepers of the two that are left (a newcomer could do that work instead and hide a survivor that
does not), and they carry the rest of the load.

Then the database and the receiver must agree: every intent delivered (an idempotent destination
with ``on_unknown: declared`` retries what may have been sent), each key's effect done exactly
once at the receiver, every request the receiver got accounted for by an attempt that says it
may have been or was submitted, no write under a superseded fence applied, the dead worker
writing nothing after its death, work spread over all three workers, and nothing lost. A lost
connection is "not now" to a producer: StoreUnavailable from the library, 503 from the API.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import subprocess
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from outbox import DestinationSpec, OnUnknown, Outbox, Settings, StoreUnavailable
from outbox.model import SETTLED
from outbox.store.plumbing import statements
from outbox.store.postgres import PostgresStore
from outbox.tokens import Role

from ..conftest import SECRET, free_port
from .conftest import OUTBOX, clean_env, kill_9, served_in_thread

pytestmark = pytest.mark.acceptance

INTENTS = 3000
#: Enqueued over HTTP: one wave at the start and one as each fault hits.
API_WAVES = 4
API_PER_WAVE = 100
#: The rest go through ``enqueue_many``, in chunks: this many before the kill, then half of what is
#: left after the first outage, and the other half right before the second.
LIBRARY_FIRST = 1200
LIBRARY_CHUNK = 100
WORKERS = 3
CONCURRENCY = 16
LEASE_SECONDS = 2.0
POLL_SECONDS = 0.2
#: How long the receiver takes over an effect: long enough that batches are in flight.
DELAY = 0.02
#: The worker is killed once this many of its attempts are started and unfinished.
KILL_WHEN_IN_FLIGHT = 4
#: Between the kill and the first outage, and between the two outages.
SPACING = (1.0, 2.0)
SETTLE_TIMEOUT = 60.0


# -- the receiver -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hit:
    """One request as the receiver got it, and what it answered."""

    key: str
    attempt_id: str
    fence: int
    status: int


@dataclass
class IdempotentReceiver:
    """Deduplicates on Idempotency-Key: the first request of a key does the effect (taking
    DELAY); one arriving while it runs gets 409 (in progress, retried); later ones are replays
    answered 200 without a new effect. The same key with another body is refused 422."""

    effects: Counter[str] = field(default_factory=Counter)
    replays: Counter[str] = field(default_factory=Counter)
    hits: list[Hit] = field(default_factory=list)
    _state: dict[str, tuple[str, str]] = field(default_factory=dict)  # key: (running|done, body digest)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        key = headers.get("idempotency-key", "")
        digest = hashlib.sha256(body).hexdigest()
        with self._lock:
            state = self._state.get(key)
            if state is None:
                self._state[key] = ("running", digest)
        if state is None:
            await asyncio.sleep(DELAY)  # the effect; it completes even if the client has gone
            with self._lock:
                self.effects[key] += 1
                self._state[key] = ("done", digest)
            status = 200
        elif state[1] != digest:
            status = 422
        elif state[0] == "running":
            status = 409
        else:
            with self._lock:
                self.replays[key] += 1
            status = 200
        with self._lock:
            self.hits.append(Hit(key, headers.get("outbox-attempt-id", ""), int(headers.get("outbox-fence", -1)),
                                 status))
        reply = b'{"ok":true}'
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(reply)).encode())]})
        await send({"type": "http.response.body", "body": reply})

    def snapshot(self) -> tuple[Counter[str], list[Hit]]:
        with self._lock:
            return Counter(self.effects), list(self.hits)


@pytest.fixture
def idempotent_receiver() -> Iterator[tuple[IdempotentReceiver, str]]:
    """An IdempotentReceiver under uvicorn on 127.0.0.1 at a free port, in a thread; with its URL."""
    app = IdempotentReceiver()
    with served_in_thread(app, "scale-receiver") as url:
        yield app, f"{url}/hook"


# -- the processes ------------------------------------------------------------------------------


@dataclass
class Process:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tail(self, lines: int = 40) -> str:
        return f"--- {self.name} (pid {self.pid}) ---\n" + "\n".join(self.log.read_text().splitlines()[-lines:])


def start(tmp_path: Path, name: str, args: list[str], env: dict[str, str]) -> Process:
    log = tmp_path / f"{name}.log"
    with log.open("w") as out:
        proc = subprocess.Popen([OUTBOX, *args], env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    return Process(name, proc, log)


def named(url: str, name: str) -> str:
    """``url`` with connections that show as ``name`` in pg_stat_activity (a process's pool; its
    listening connection names itself "outbox listener")."""
    return f"{url}?application_name={name}"


def pid_of(worker_id: str) -> int:
    """The process id in a worker id, ``host:pid:suffix``."""
    return int(worker_id.rsplit(":", 2)[1])


async def wait_until(check: Any, what: str, timeout: float, logs: list[Process]) -> Any:
    """``await check()`` until it returns something true; fails naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (found := await check()):
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not within {timeout:.0f} s\n" + "\n".join(p.tail() for p in logs))
        await asyncio.sleep(0.02)
    return found


# -- producing ----------------------------------------------------------------------------------


def intent(action_id: str) -> dict[str, Any]:
    return {"destination": "hook", "scope": "acme", "action_id": action_id, "payload": {"id": action_id}}


async def enqueue_library(box: Outbox, ids: list[str], failures: list[BaseException]) -> None:
    """``enqueue_many`` in chunks; a chunk the outage cut off is sent again (the same action ids
    and payloads: an enqueue already recorded answers with the existing intent). Every failure is
    kept in ``failures``: the test asserts they all said the store was unavailable."""
    for start_at in range(0, len(ids), LIBRARY_CHUNK):
        chunk = [intent(action_id) for action_id in ids[start_at:start_at + LIBRARY_CHUNK]]
        for _ in range(100):
            try:
                await box.enqueue_many(chunk)
                break
            except Exception as exc:
                failures.append(exc)
                await asyncio.sleep(0.05)
        else:
            pytest.fail(f"enqueue_many kept failing for {chunk[0]['action_id']}...: {failures[-5:]}")


@dataclass
class Answers:
    """What the served API answered each action id: its tries' statuses (or transport errors)."""

    tries: dict[str, list[int | str]] = field(default_factory=lambda: defaultdict(list))
    unexpected: list[str] = field(default_factory=list)  # answers other than 200, 201 and 503


async def enqueue_api(client: httpx.AsyncClient, ids: list[str], answers: Answers) -> None:
    """POST /v1/intents for each id, four at a time; an answer other than 200 or 201 is kept and
    the enqueue sent again with the same action id (the test asserts that such answers were all
    503, the store unavailable)."""
    slots = asyncio.Semaphore(4)

    async def one(action_id: str) -> None:
        async with slots:
            for _ in range(100):
                try:
                    response = await client.post("/v1/intents", json=intent(action_id))
                except httpx.TransportError as exc:
                    answers.tries[action_id].append(f"{type(exc).__name__}: {exc}")
                    return
                answers.tries[action_id].append(response.status_code)
                if response.status_code in (200, 201):
                    return
                if response.status_code != 503:
                    answers.unexpected.append(f"{action_id}: {response.status_code} {response.text[:300]}")
                await asyncio.sleep(0.05)

    await asyncio.gather(*(one(action_id) for action_id in ids))


# -- faults -------------------------------------------------------------------------------------


async def read_right_after(box: Outbox, action_id: str, failures: list[BaseException]) -> None:
    """Eight concurrent reads through the library as an outage begins, each kept in ``failures``
    if it fails (the test asserts they all said the store was unavailable)."""
    for result in await asyncio.gather(*(box.get(action_id) for _ in range(8)), return_exceptions=True):
        if isinstance(result, BaseException):
            failures.append(result)


@dataclass(frozen=True)
class Outage:
    unsettled: int  # intents not yet settled when it hit
    terminated: Counter[str]  # connections terminated, by application_name


async def terminate_all(monitor: asyncpg.Connection, database: str) -> Outage:
    """Every connection to ``database`` but the monitor's own, terminated by the server."""
    unsettled = await monitor.fetchval(
        "SELECT count(*) FROM intents WHERE NOT (status = ANY($1::text[]))", [s.value for s in SETTLED])
    rows = await monitor.fetch(
        "SELECT application_name, pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = $1 AND pid <> pg_backend_pid()", database)
    return Outage(unsettled, Counter(row[0] for row in rows if row[1]))


@dataclass(frozen=True)
class AtKill:
    """What the store held for the killed worker the moment it died."""

    worker_id: str
    leased: dict[str, tuple[int, str | None]]  # key: (fence, the attempt in flight under it or None)
    events: int  # events written by it
    finished: int  # its attempts with a recorded end


#: How many facts of the timelines name worker $1 as their actor, in one snapshot: events rows, the events attempts
#: keep, and the "leased" facts of leases only their lease rows record yet (outbox/store/timeline.py).
EVENTS_BY = (
    "SELECT (SELECT count(*) FROM events WHERE actor = $1)"
    " + (SELECT count(*) FROM attempts, jsonb_array_elements(attempts.events) AS g, jsonb_array_elements(g -> 1) AS e"
    "    WHERE e ->> 2 = $1)"
    f" + (SELECT count(*) FROM intent_leases AS l WHERE l.lease_owner = $1"
    f" AND {statements('postgres')['unrecorded_lease']})"
).replace("{of}", "l")


async def state_at_kill(monitor: asyncpg.Connection, pid: int) -> AtKill:
    owners = {row[0] for row in await monitor.fetch("SELECT DISTINCT worker FROM attempts")}
    (worker_id,) = [w for w in owners if pid_of(w) == pid]
    rows = await monitor.fetch(
        "SELECT i.intent_key, i.fence, (SELECT a.attempt_id FROM attempts a WHERE a.intent_seq = i.seq"
        "  AND a.fence = i.fence AND a.finished_at IS NULL) FROM intent_records i"
        " WHERE i.status = 'leased' AND i.lease_owner = $1", worker_id)
    events = await monitor.fetchval(EVENTS_BY, worker_id)
    finished = await monitor.fetchval(
        "SELECT count(*) FROM attempts WHERE worker = $1 AND finished_at IS NOT NULL", worker_id)
    return AtKill(worker_id, {row[0]: (row[1], row[2]) for row in rows}, events, finished)


# -- the test -----------------------------------------------------------------------------------


async def test_three_workers_and_a_service_survive_a_kill_and_two_outages_with_every_effect_once(
    tmp_path: Path, pg_url: str, idempotent_receiver: tuple[IdempotentReceiver, str]
) -> None:
    app, hook = idempotent_receiver
    database = pg_url.rsplit("/", 1)[1]
    settings = Settings(database_url=pg_url, authority="allow-all")
    api_ids = [f"api-{wave}-{n:03d}" for wave in range(API_WAVES) for n in range(API_PER_WAVE)]
    lib_ids = [f"lib-{n:04d}" for n in range(INTENTS - len(api_ids))]
    middle = LIBRARY_FIRST + (len(lib_ids) - LIBRARY_FIRST) // 2
    parts = (lib_ids[:LIBRARY_FIRST], lib_ids[LIBRARY_FIRST:middle], lib_ids[middle:])
    expected = {f"acme/{action_id}" for action_id in (*api_ids, *lib_ids)}
    assert len(expected) == INTENTS

    box = await Outbox.open(named(pg_url, "test"), settings=settings)
    monitor = await asyncpg.connect(pg_url)
    processes: list[Process] = []
    waves: list[asyncio.Task[None]] = []
    try:
        await box.put_destination("hook", DestinationSpec(
            url=hook, secret=SECRET, allow_private_network=True, idempotent=True, retention_seconds=3600,
            on_unknown=OnUnknown.DECLARED))
        producer, _ = await box.create_token(Role.PRODUCER, ["acme"])

        def env(name: str) -> dict[str, str]:
            return clean_env(OUTBOX_DATABASE_URL=named(pg_url, name), OUTBOX_AUTHORITY="allow-all",
                             OUTBOX_LEASE_SECONDS=str(LEASE_SECONDS), OUTBOX_POLL_SECONDS=str(POLL_SECONDS),
                             OUTBOX_WORKER_CONCURRENCY=str(CONCURRENCY))

        port = free_port()
        serve = start(tmp_path, "serve", ["serve", "--no-worker", "--port", str(port)], env("serve"))
        workers = [start(tmp_path, f"worker-{n}", ["worker"], env(f"worker-{n}")) for n in range(WORKERS)]
        processes = [serve, *workers]
        for worker in workers:
            await wait_until(lambda w=worker: asyncio.to_thread(lambda: " started (concurrency" in w.log.read_text()),
                             f"{worker.name} starting", 30, processes)

        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30,
                                     headers={"Authorization": f"Bearer {producer}"}) as client:

            async def ready() -> bool:
                try:
                    return (await client.get("/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            await wait_until(ready, "outbox serve ready", 30, processes)
            answers = Answers()
            waves.append(asyncio.create_task(enqueue_api(client, api_ids[:API_PER_WAVE], answers)))
            library_failures: list[BaseException] = []
            await enqueue_library(box, parts[0], library_failures)

            # 1. kill -9 of a worker while its sends are in flight
            victim = workers[0]

            async def victim_in_flight() -> bool:
                rows = await monitor.fetch("SELECT worker FROM attempts WHERE finished_at IS NULL")
                return sum(pid_of(row[0]) == victim.pid for row in rows) >= KILL_WHEN_IN_FLIGHT

            await wait_until(victim_in_flight, f"{KILL_WHEN_IN_FLIGHT} sends of {victim.name} in flight", 30,
                             processes)
            waves.append(asyncio.create_task(enqueue_api(client, api_ids[API_PER_WAVE:2 * API_PER_WAVE], answers)))
            kill_9(victim.proc)
            at_kill = await state_at_kill(monitor, victim.pid)
            in_flight = {key: attempt for key, (_, attempt) in at_kill.leased.items() if attempt is not None}
            assert in_flight, f"no send of the killed worker was in flight: {at_kill}"

            # 2. two outages of every database connection, spaced out, while intents keep coming
            await asyncio.sleep(SPACING[0])
            waves.append(asyncio.create_task(
                enqueue_api(client, api_ids[2 * API_PER_WAVE:3 * API_PER_WAVE], answers)))
            await asyncio.sleep(0.05)
            outages = [await terminate_all(monitor, database)]
            await read_right_after(box, parts[0][0], library_failures)
            await enqueue_library(box, parts[1], library_failures)
            await asyncio.sleep(SPACING[1])
            waves.append(asyncio.create_task(enqueue_api(client, api_ids[3 * API_PER_WAVE:], answers)))
            await enqueue_library(box, parts[2], library_failures)
            outages.append(await terminate_all(monitor, database))
            await read_right_after(box, parts[0][0], library_failures)
            await asyncio.gather(*waves)

            # 3. everything settles; the survivors and the service are still running
            settled = [s.value for s in SETTLED]

            async def all_settled() -> bool:
                count = await monitor.fetchval(
                    "SELECT count(*) FROM intents WHERE status = ANY($1::text[])", settled)
                return count >= INTENTS

            started = time.monotonic()
            await wait_until(all_settled, f"all {INTENTS} intents settled", SETTLE_TIMEOUT, processes)
            settle_seconds = time.monotonic() - started
            for process in (serve, *workers[1:]):
                assert process.proc.poll() is None, f"{process.name} exited:\n{process.tail()}"
            api_readable = (await client.get(f"/v1/intents/{api_ids[-1]}")).status_code
    finally:
        for wave in waves:
            wave.cancel()
        await asyncio.gather(*waves, return_exceptions=True)
        for process in processes:
            if process.proc.poll() is None:
                process.proc.terminate()
        for process in processes:
            try:
                process.proc.wait(15)
            except subprocess.TimeoutExpired:
                process.proc.kill()
                process.proc.wait()
        await box.close()

    try:
        intents = {row["intent_key"]: row for row in await monitor.fetch(
            "SELECT seq, intent_key, status, fence, attempts FROM intent_records")}
        by_seq = {row["seq"]: key for key, row in intents.items()}
        attempts: dict[str, list[asyncpg.Record]] = defaultdict(list)
        for row in await monitor.fetch("SELECT * FROM attempts ORDER BY intent_seq, number"):
            attempts[by_seq[row["intent_seq"]]].append(row)
        store = PostgresStore(pg_url)  # each intent's timeline, wherever its facts are kept
        await store.open()
        try:
            events = {key: [{"kind": e.kind.value, "actor": e.actor, "data": json.dumps(dict(e.data))}
                            for e in (await store.history(key)).events] for key in intents}
        finally:
            await store.close()
        dead_events = await monitor.fetchval(EVENTS_BY, at_kill.worker_id)
    finally:
        await monitor.close()
    effects, hits = app.snapshot()
    logs = "\n".join(p.tail() for p in processes)
    print(f"settled {settle_seconds:.1f} s after the last fault; "
          f"library failures {Counter(type(e).__name__ for e in library_failures)}; "
          f"API answers {Counter(t for tries in answers.tries.values() for t in tries)} "
          f"{ {a: t for a, t in answers.tries.items() if len(t) > 1} }; "
          f"outages {[(o.unsettled, sum(o.terminated.values())) for o in outages]}; "
          f"killed with {len(in_flight)} in flight and {len(at_kill.leased)} leased; "
          f"requests {len(hits)}, replays {sum(app.replays.values())}, "
          f"409s {sum(h.status == 409 for h in hits)}; "
          f"attempts per worker {Counter(pid_of(a['worker']) for rows in attempts.values() for a in rows)}")

    # nothing lost: every intent is there, with its history
    assert set(intents) == expected
    for key in expected:
        kinds = [e["kind"] for e in events[key]]
        assert kinds and kinds[0] == "enqueued", (key, kinds)

    # the faults hit a running system: work was pending at each outage, and each one cut the
    # connections of the service and of both surviving workers, their pools' and their listeners'
    for outage in outages:
        assert outage.unsettled > 0, outages
        assert all(outage.terminated[name] > 0 for name in ("serve", "worker-1", "worker-2")), outages
        assert outage.terminated["outbox listener"] >= 3, outages

    # every enqueue over HTTP ended answered 201, or 200 when a try before it was cut off (the
    # intent was already recorded); the service still answers
    for action_id in api_ids:
        tries = answers.tries[action_id]
        assert tries[-1] in (200, 201), (action_id, tries)
        assert tries[-1] == 201 or len(tries) > 1, (action_id, tries)
    assert api_readable == 200

    # delivered, or unknown only where a request was in flight; the destination is idempotent and
    # declares retention, so an attempt that may have been sent is retried: all are delivered
    reached = {hit.key for hit in hits}
    statuses = Counter(row["status"] for row in intents.values())
    for key, row in intents.items():
        if row["status"] == "unknown":
            assert key in reached, (key, [dict(a) for a in attempts[key]])
            assert attempts[key][-1]["submission"] == "maybe_submitted", (key, [dict(a) for a in attempts[key]])
    assert statuses == {"delivered": INTENTS}, f"{statuses}\n{logs}"

    # each effect exactly once at the receiver
    assert set(effects) == expected
    assert all(n == 1 for n in effects.values()), [k for k, n in effects.items() if n != 1]

    # every request the receiver got is an attempt of that intent, under its fence, sent once, and
    # recorded as submitted (with the answer it got) or maybe submitted, never as not submitted
    recorded = {a["attempt_id"]: (key, a) for key, rows in attempts.items() for a in rows}
    sent_ids = Counter(hit.attempt_id for hit in hits)
    assert all(n == 1 for n in sent_ids.values()), [a for a, n in sent_ids.items() if n > 1]
    for hit in hits:
        assert hit.attempt_id in recorded, hit
        key, attempt = recorded[hit.attempt_id]
        assert (key, attempt["fence"]) == (hit.key, hit.fence), (hit, dict(attempt))
        assert attempt["submission"] in ("submitted", "maybe_submitted"), (hit, dict(attempt))
        if attempt["submission"] == "submitted":
            assert attempt["status_code"] == hit.status, (hit, dict(attempt))
    for attempt_id, (key, attempt) in recorded.items():
        if attempt["submission"] == "submitted":
            assert attempt_id in sent_ids, (key, dict(attempt))

    # no write under a superseded fence applied: each claim has its own fence, the attempts of an
    # intent follow one another (none ends after a later claim's attempt began), the one delivered
    # attempt is the last, under the intent's final fence, and its outcome was written by the
    # holder of that fence; the fence moved only by claims and lease recoveries
    for key in expected:
        rows = attempts[key]
        kinds = [e["kind"] for e in events[key]]
        assert [a["number"] for a in rows] == list(range(1, len(rows) + 1)), (key, [dict(a) for a in rows])
        assert all(a["finished_at"] is not None for a in rows), (key, [dict(a) for a in rows])
        for earlier, later in itertools.pairwise(rows):
            assert earlier["fence"] < later["fence"], (key, [dict(a) for a in rows])
            assert earlier["finished_at"] <= later["started_at"], (key, [dict(a) for a in rows])
        delivered = [a for a in rows if a["outcome"] == "delivered"]
        assert len(delivered) == 1 and delivered[0] is rows[-1], (key, [dict(a) for a in rows])
        last = rows[-1]
        assert (last["submission"], last["status_code"], last["fence"]) == (
            "submitted", 200, intents[key]["fence"]), (key, dict(last), dict(intents[key]))
        assert kinds.count("delivered") == 1 and kinds[-1] == "delivered", (key, kinds)
        final_claim = [e for e in events[key] if e["kind"] == "leased"][-1]
        assert final_claim["actor"] == last["worker"] == events[key][-1]["actor"], (key, kinds, dict(last))
        assert intents[key]["fence"] == kinds.count("leased") + kinds.count("lease_expired"), (key, kinds)

    # the dead worker wrote nothing after its death; its leases were recovered by the survivors:
    # a send in flight became maybe_submitted (then was retried), a lease without one was given back
    assert dead_events == at_kill.events
    survivors = {w.pid for w in workers[1:]}
    for key, (fence, attempt_id) in at_kill.leased.items():
        history = [(e["kind"], json.loads(e["data"]), e["actor"]) for e in events[key]]
        claimed = history.index(("leased", {"fence": fence}, at_kill.worker_id))
        expired = [actor for kind, _, actor in history[claimed:] if kind == "lease_expired"]
        assert expired and pid_of(expired[0]) in survivors, (key, history)
        assert intents[key]["fence"] > fence
        assert pid_of(attempts[key][-1]["worker"]) in survivors
        if attempt_id is None:
            assert all(a["fence"] != fence for a in attempts[key]), (key, [dict(a) for a in attempts[key]])
            continue
        cut = next(a for a in attempts[key] if a["attempt_id"] == attempt_id)
        assert (cut["submission"], cut["outcome"], cut["fence"], cut["worker"]) == (
            "maybe_submitted", "unknown", fence, at_kill.worker_id), (key, dict(cut))
    finished_later = sum(1 for rows in attempts.values() for a in rows if a["worker"] == at_kill.worker_id
                         and a["finished_at"] is not None)
    assert finished_later == at_kill.finished + len(in_flight)

    # work spread over all three workers (the killed one too); the service sent nothing
    per_process = Counter(pid_of(a["worker"]) for rows in attempts.values() for a in rows)
    assert all(per_process[w.pid] > 0 for w in workers), per_process
    assert set(per_process) <= {w.pid for w in workers}, (per_process, serve.pid)

    # a database connection lost under an enqueue or a read is "not now": StoreUnavailable from the
    # library, 503 (with Retry-After) from the API, never an error of the database driver or a 500
    assert all(isinstance(exc, StoreUnavailable) for exc in library_failures), [
        f"{type(exc).__module__}.{type(exc).__name__}: {exc}" for exc in library_failures
        if not isinstance(exc, StoreUnavailable)]
    assert answers.unexpected == []
