"""Durable webhook delivery throughput, as a ratio to a bare HTTP client loop from the same run.

Every delivery is recorded before and after it is made (an ``attempt_started`` write, then the
outcome), each write committed in WAL mode with ``synchronous=FULL`` (the store's default), so
a delivery costs SQLite commits as well as an HTTP request. Absolute rates say more about the
machine than the library, so the same receiver is first driven by a bare aiohttp client loop at
the same concurrency (the HTTP ceiling of this machine), and the worker's rate is reported as a
ratio to it:

1. a receiver in its own process: a minimal ASGI app on uvicorn (uvloop, httptools, no access
   log) answering 200 ``{"ok":true}`` to every POST and counting them per path;
2. baseline: a bare aiohttp client, CONCURRENCY requests in flight, POSTing a ~100-byte JSON
   body N times;
3. the outbox: N intents enqueued into a fresh SQLite file (untimed), then ``sender.Worker``
   with ``worker_concurrency=CONCURRENCY`` and ``authority="allow-all"``, timed until every
   intent is delivered; the receiver must have counted exactly N requests and the store exactly
   N attempts. Printed with it: claims and group commits per delivery, CPU time per request of
   this process (event loop and SQLite writer thread) and of the receiver for both loops, and
   the sender's warnings, counted rather than printed.

   Where the worker's time goes, measured in the same round: the webhook channel alone
   (``WebhookChannel.send`` at the same concurrency, no store: the HTTP side's own ceiling)
   and the worker with a no-op channel (claims, checks, attempt and outcome writes, no HTTP).

Beside it, two scaling checks:

4. peak RSS of a fresh child process that opens an outbox holding 100,000 pending intents and
   runs one ``Worker.run_once()`` against the receiver, next to the same child on an outbox
   holding 1,000 (memory must not grow with the backlog). The peak is the child's VmHWM: its
   ``ru_maxrss`` is printed too, but on Linux that keeps the high-water mark of the address
   space exec replaced, i.e. the parent's RSS when it spawned the child;
5. ``store.claim(limit=CONCURRENCY)`` latency with 10,000 and with 1,000,000 pending intents
   (the claim is a partial-index seek, so it must not grow materially), plus the claim
   pick and lease statements alone in a rolled-back transaction, which leaves out the commit's fsync.

Targets are printed beside the figures; nothing here asserts on timing. The exit status is
non-zero only when a measurement is invalid (an undelivered intent, a wrong request count, a
failed request, a dead server).

    python tests/bench/bench_delivery.py [--n N] [--rounds R] [--big-n M] [--quick] [--uvloop]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import harness
from harness import BenchError

DESTINATION = "bench"
SCOPE = "acme"
NOTE = "x" * 80
SECRET = "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODk="
CONCURRENCY = 64
BATCH = 1_000  # enqueue_many batch while filling the outbox (untimed)
HOOK_PATH = "/hook"
BASELINE_PATH = "/baseline"
CHANNEL_PATH = "/channel"
#: POSTs here are counted and never answered (bench_paused.py).
SILENT_PATH = "/silent"
#: Untimed requests before the baseline's timed loop (connection set-up, first allocations).
WARMUP = 4 * CONCURRENCY
POLL_SECONDS = 0.2
DELIVERY_TIMEOUT_SECONDS = 600.0
CHILD_TIMEOUT_SECONDS = 300.0
#: Claims timed per database, in interleaved chunks so that drift hits both sizes alike.
CLAIMS = 50
CLAIM_CHUNK = 10
SMALL_PENDING = 10_000
RSS_PENDING = 100_000
RSS_SMALL_PENDING = 1_000


# -- the receiver (its own process) ------------------------------------------------------------


def serve_receiver(port: int) -> None:
    """uvicorn (uvloop, httptools) serving a bare ASGI app: 200 ``{"ok":true}`` to any POST
    but those to SILENT_PATH (never answered), counted per path; ``GET /counts`` answers the
    counts, ``GET /healthz`` 200."""
    import uvicorn

    counts: Counter[str] = Counter()
    ok = b'{"ok":true}'
    json_headers = [(b"content-type", b"application/json")]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:  # read the whole body, as a real receiver would
            message = await receive()
            more = message.get("more_body", False)
        if scope["method"] == "POST":
            counts[scope["path"]] += 1
            if scope["path"] == SILENT_PATH:  # a receiver that has stopped answering
                await asyncio.Event().wait()
            body = ok
        elif scope["path"] == "/counts":
            body = json.dumps(counts).encode()
        elif scope["path"] == "/healthz":
            body = ok
        else:
            await send({"type": "http.response.start", "status": 404, "headers": json_headers})
            await send({"type": "http.response.body", "body": b'{"ok":false}'})
            return
        headers = [*json_headers, (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools",
                access_log=False, log_level="warning", lifespan="off")


def own_cpu() -> float:
    """CPU seconds of this process, all threads (the event loop and SQLite's writer thread)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Cpu:
    """CPU time spent during a timed run, per operation, in microseconds."""

    own_us: float  # this process
    receiver_us: float | None
    loop_us: float | None = None  # of own_us: the event loop's thread
    writer_us: float | None = None  # of own_us: the SQLite writer connection's thread

    @classmethod
    def measure(cls, before: tuple[float, float | None], after: tuple[float, float | None],
                operations: int) -> Cpu:
        own = (after[0] - before[0]) / operations * 1e6
        theirs = None if before[1] is None or after[1] is None else (after[1] - before[1]) / operations * 1e6
        return cls(own, theirs)


@dataclass
class Receiver:
    proc: subprocess.Popen[bytes]
    base: str
    log: Path

    @property
    def hook(self) -> str:
        return self.base + HOOK_PATH

    def cpu(self) -> tuple[float, float | None]:
        """(this process's CPU seconds, the receiver's)."""
        return own_cpu(), harness.process_cpu(self.proc.pid)

    def alive(self) -> None:
        harness.check_alive(self.proc, self.log, "the receiver")

    async def counts(self) -> Counter[str]:
        self.alive()
        async with aiohttp.ClientSession() as session, session.get(self.base + "/counts") as response:
            if response.status != 200:
                raise BenchError(f"GET /counts answered {response.status}")
            return Counter(await response.json())


    async def wait_ready(self) -> None:
        await harness.wait_ready(self.base + "/healthz", self.alive, self.log, late="the receiver did not answer")


@asynccontextmanager
async def running_receiver(root: Path) -> AsyncIterator[Receiver]:
    """This script's receiver in its own process (log in ``root``), ready; stopped when the block ends."""
    port = harness.free_port()
    log = root / "receiver.log"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--serve-receiver", str(port)]
    with harness.serving(cmd, cwd=root, log=log) as proc:
        receiver = Receiver(proc, f"http://127.0.0.1:{port}", log)
        await receiver.wait_ready()
        yield receiver


# -- workload ----------------------------------------------------------------------------------


def payload(i: int) -> dict[str, Any]:
    return {"order": i, "note": NOTE}


def intent(i: int) -> dict[str, Any]:
    return {"destination": DESTINATION, "scope": SCOPE, "payload": payload(i)}


def settings(**extra: Any) -> Any:
    from outbox import Settings

    return Settings(authority="allow-all", worker_concurrency=CONCURRENCY, **extra)


async def open_box(db_path: Path, hook: str) -> Any:
    from outbox import DestinationSpec, Outbox

    box = await Outbox.open(f"sqlite:///{db_path}", settings=settings())
    try:
        await box.put_destination(
            DESTINATION, DestinationSpec(url=hook, secret=SECRET, allow_private_network=True)
        )
    except BaseException:
        await box.close()
        raise
    return box


async def scalar(box: Any, sql: str, params: tuple[Any, ...] = ()) -> Any:
    return await box.store._read(lambda conn: conn.execute(sql, params).fetchone()[0])


async def fill(box: Any, first: int, stop: int, make: Callable[[int], dict[str, Any]] = intent) -> None:
    """Intents ``make(i)`` for i in first..stop-1, BATCH per ``enqueue_many``, every one new."""
    for lo in range(first, stop, BATCH):
        results = await box.enqueue_many(make(i) for i in range(lo, min(lo + BATCH, stop)))
        if not all(r.created for r in results):
            raise BenchError("enqueue_many did not create every intent of a fresh batch")


class Peer(Protocol):
    """What a timed worker run watches besides the store: the process it delivers to."""

    def cpu(self) -> tuple[float, float | None]: ...

    def alive(self) -> None: ...


def thread_cpu(box: Any) -> tuple[float, float]:
    """CPU seconds of the event loop's thread (this one) and of the SQLite store's writer thread."""
    writer = box.store._writer._thread  # aiosqlite runs each connection on a thread of its own
    return time.thread_time(), time.clock_gettime(time.pthread_getcpuclockid(writer.ident))


async def time_worker(box: Any, worker: Any, n: int, peer: Peer) -> tuple[float, float, Cpu]:
    """Run ``worker`` until the SQLite store says n intents are delivered, then stop it:
    (seconds to the last delivery recorded, seconds to the poll that saw it, CPU per delivery,
    the event loop's and the writer thread's apart)."""
    delivered_sql = "SELECT count(*) FROM intents WHERE status = 'delivered'"
    cpu = peer.cpu()
    threads = thread_cpu(box)
    start_wall = time.time()
    began = time.perf_counter()
    task = asyncio.create_task(worker.run())
    deadline = began + DELIVERY_TIMEOUT_SECONDS
    try:
        while True:
            await asyncio.sleep(POLL_SECONDS)
            if task.done():
                await task
                raise BenchError("the worker stopped by itself before delivering everything")
            if await scalar(box, delivered_sql) >= n:
                observed = time.perf_counter() - began
                used = Cpu.measure(cpu, peer.cpu(), n)
                loop, writer = (b - a for a, b in zip(threads, thread_cpu(box), strict=True))
                used.loop_us, used.writer_us = loop / n * 1e6, writer / n * 1e6
                break
            if time.perf_counter() > deadline:
                raise BenchError(f"only {await scalar(box, delivered_sql)} of {n} delivered in "
                                 f"{DELIVERY_TIMEOUT_SECONDS:.0f} s")
            peer.alive()
    finally:
        worker.stop()
        await task
    # timed to the last delivery recorded, not to the poll that saw it
    last_us = await scalar(box, "SELECT max(updated_at) FROM intents WHERE status = 'delivered'")
    return last_us / 1e6 - start_wall, observed, used


async def check_delivered(box: Any, n: int) -> None:
    """BenchError unless the SQLite store holds exactly n intents, all delivered, and n attempts."""
    statuses = dict(await box.store._read(
        lambda conn: conn.execute("SELECT status, count(*) FROM intents GROUP BY status").fetchall()))
    if statuses != {"delivered": n}:
        raise BenchError(f"intents by status after the run: {statuses}, expected {{'delivered': {n}}}")
    attempts = await scalar(box, "SELECT count(*) FROM attempts")
    if attempts != n:
        raise BenchError(f"{attempts} attempts recorded for {n} intents (expected one each)")


# -- baseline -------------------------------------------------------------------------------


@dataclass
class Load:
    ok: int = 0
    seconds: float = 0.0
    cpu: Cpu | None = None
    failures: Counter[str] = field(default_factory=Counter)
    samples: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0


async def baseline(receiver: Receiver, n: int) -> Load:
    """A bare aiohttp client loop: CONCURRENCY workers on one pooled session, n timed POSTs."""
    url = receiver.base + BASELINE_PATH
    bodies = [json.dumps(payload(i), separators=(",", ":")).encode() for i in range(WARMUP + n)]
    headers = {"Content-Type": "application/json"}
    load = Load()
    async with harness.client_session(CONCURRENCY) as session:

        async def one(i: int) -> bool:
            try:
                async with session.post(url, data=bodies[i], headers=headers) as response:
                    await response.read()
                    if response.status == 200:
                        return True
                    load.failures[f"HTTP {response.status}"] += 1
                    detail = f"HTTP {response.status}"
            except (TimeoutError, aiohttp.ClientError) as exc:
                load.failures[type(exc).__name__] += 1
                detail = repr(exc)
            if len(load.samples) < 3:
                load.samples.append(detail)
            return False

        await harness.fan_out(CONCURRENCY, 0, WARMUP, one)
        cpu = receiver.cpu()
        load.ok, load.seconds = await harness.fan_out(CONCURRENCY, WARMUP, WARMUP + n, one)
        load.cpu = Cpu.measure(cpu, receiver.cpu(), n)
    if sum(load.failures.values()):
        raise BenchError(f"baseline: {sum(load.failures.values())} requests failed: "
                         f"{dict(load.failures)}; e.g. {load.samples}")
    return load


# -- the outbox -----------------------------------------------------------------------------


@dataclass
class Delivery:
    rate: float  # intents delivered per second, first claim to last delivery recorded
    seconds: float
    observed_seconds: float  # until the 0.2 s poll saw the last one
    claims: int  # claims the worker made (``apply(..., claim=...)`` or ``store.claim``)
    claimed: int  # intents they leased
    commits: int | None  # write transactions (group commits) the store ran, if countable
    jobs: int  # writes they carried
    cpu: Cpu
    warnings: dict[str, int]  # the sender's log warnings, by their first words
    warning_samples: list[str]
    #: Final status of the intents named by "lease lost" warnings, with their attempt counts.
    lease_lost: Counter[str]


def commit_module() -> Any:
    """The module whose ``_apply_batch`` runs each group commit (best effort: a private name,
    used only to count commits; the count is left out if it moves)."""
    import importlib

    for name in ("receivers.sqlite_writer", "outbox.store.sqlite"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if callable(getattr(module, "_apply_batch", None)):
            return module
    return None


class LogCounter(logging.Handler):
    """Counts the sender's warnings (by their first words) instead of printing them."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: Counter[str] = Counter()
        self.samples: list[str] = []
        self.lease_lost: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("lease lost"):
            self.lease_lost.append(record.__dict__["action_id"])
        self.counts[" ".join(message.split(":")[0].split()[:3])] += 1
        if len(self.samples) < 3:
            self.samples.append(message)



class NoopChannel:
    """Answers every send "delivered" without sending: the worker's own cost, store included,
    without the HTTP client's (a measurement aid, never a test of delivery)."""

    async def send(self, intent: Any, destination: Any, *, attempt_id: str, fence: int) -> Any:
        from outbox import Outcome, Submission
        from sender.channel import SendResult

        await asyncio.sleep(0)  # a real send yields to the loop at least once
        return SendResult(Submission.SUBMITTED, Outcome.DELIVERED, status_code=200)

    async def probe(self, *args: Any, **kwargs: Any) -> Any:
        raise BenchError("the no-op channel was asked to reconcile")

    async def aclose(self) -> None:
        pass


async def channel_alone(receiver: Receiver, n: int) -> Load:
    """``WebhookChannel.send`` with no store around it: CONCURRENCY sends in flight on one
    channel, n timed, each a signed POST like the worker's (the channel's own ceiling)."""
    from datetime import UTC, datetime

    from outbox import Destination, Intent, OnUnknown, Status
    from sender.webhook import WebhookChannel

    now = datetime.now(UTC)
    destination = Destination(DESTINATION, "webhook", {"url": receiver.base + CHANNEL_PATH}, (SECRET,), False, 3600,
                              OnUnknown.DECLARED, 10.0, False, True, False, now, now)
    intents = [Intent(i, f"channel-{i}", SCOPE, DESTINATION, "webhook",
                      json.dumps(payload(i), separators=(",", ":")), "sha256:-", Status.LEASED, 0, 1, now,
                      None, None, "bench", now, 1, now, now, None) for i in range(WARMUP + n)]
    load = Load()
    channel = WebhookChannel(concurrency=CONCURRENCY)
    try:

        async def one(i: int) -> bool:
            result = await channel.send(intents[i], destination, attempt_id=f"attempt-{i}", fence=1)
            if result.status_code == 200:
                return True
            load.failures[result.error or result.outcome.value] += 1
            return False

        await harness.fan_out(CONCURRENCY, 0, WARMUP, one)
        cpu = receiver.cpu()
        load.ok, load.seconds = await harness.fan_out(CONCURRENCY, WARMUP, WARMUP + n, one)
        load.cpu = Cpu.measure(cpu, receiver.cpu(), n)
    finally:
        await channel.aclose()
    if sum(load.failures.values()):
        raise BenchError(f"channel alone: {sum(load.failures.values())} sends failed: {dict(load.failures)}")
    return load


@asynccontextmanager
async def counted(box: Any) -> AsyncIterator[tuple[Counter[str], LogCounter]]:
    """While the block runs: the store's claims (``claims``, ``claimed``: those made in an
    ``apply`` and by ``store.claim``) and, on SQLite, its group commits (``commits``, ``jobs``)
    counted, and the sender's log counted rather than printed; everything is put back after."""
    store = box.store
    calls = Counter[str]()
    claim, apply_changes = store.claim, store.apply

    async def counting_claim(*args: Any, **kwargs: Any) -> Any:
        got = await claim(*args, **kwargs)
        calls["claims"] += 1
        calls["claimed"] += len(got)
        return got

    async def counting_apply(changes: Any, *, claim: Any = None) -> Any:
        applied = await apply_changes(changes, claim=claim)
        if claim is not None:
            calls["claims"] += 1
            calls["claimed"] += len(applied.claimed)
        return applied

    store.claim, store.apply = counting_claim, counting_apply
    committer = commit_module()
    apply = getattr(committer, "_apply_batch", None)

    def counting_batch(conn: Any, jobs: Any) -> Any:
        calls["commits"] += 1
        calls["jobs"] += len(jobs)
        return apply(conn, jobs)  # type: ignore[misc]

    if apply is not None:
        committer._apply_batch = counting_batch
    sender_log = LogCounter()
    logger = logging.getLogger("outbox.sender")
    logger.addHandler(sender_log)
    logger.propagate = False  # counted and summarised, not printed line by line
    try:
        yield calls, sender_log
    finally:
        logger.removeHandler(sender_log)
        logger.propagate = True
        if apply is not None:
            committer._apply_batch = apply
        store.claim, store.apply = claim, apply_changes


async def outbox_delivery(workdir: Path, receiver: Receiver, n: int, *, noop: bool = False) -> Delivery:
    """Enqueue n intents (untimed), run a Worker until every one is delivered, check the counts.
    With ``noop``, the worker's channel sends nothing (see NoopChannel)."""
    from sender import Worker

    before = (await receiver.counts())[HOOK_PATH]
    db_path = workdir / "delivery.db"
    box = await open_box(db_path, receiver.hook)
    try:
        await fill(box, 0, n)
        if await scalar(box, "SELECT count(*) FROM intents WHERE status = 'pending'") != n:
            raise BenchError("the outbox does not hold n pending intents before the run")

        worker = Worker(box, channels={"webhook": NoopChannel()} if noop else None)
        async with counted(box) as (calls, sender_log):
            seconds, observed, used = await time_worker(box, worker, n, receiver)
        await check_delivered(box, n)
        if worker.stale_writes:
            raise BenchError(f"the worker had {worker.stale_writes} fenced writes rejected")
        lease_lost: Counter[str] = Counter()
        for action_id in sender_log.lease_lost:
            found = await box.store._read(lambda conn, a=action_id: conn.execute(
                "SELECT status, (SELECT count(*) FROM attempts WHERE intent_seq = seq) "
                "FROM intents WHERE action_id = ?", (a,)).fetchone())
            lease_lost[f"{found[0]} after {found[1]} attempt{'s' * (found[1] != 1)}"] += 1
    finally:
        await box.close()
    received = (await receiver.counts())[HOOK_PATH] - before
    if received != (0 if noop else n):
        raise BenchError(f"the receiver counted {received} deliveries, expected exactly {0 if noop else n}")
    return Delivery(n / seconds, seconds, observed, calls["claims"], calls["claimed"],
                    calls.get("commits"), calls["jobs"], used,
                    dict(sender_log.counts), sender_log.samples, lease_lost)


# -- peak RSS in a fresh child ----------------------------------------------------------------


async def build_db(db_path: Path, hook: str, n: int) -> float:
    """An outbox holding n pending intents: BATCH enqueued by the library, the rest copies of the
    first one (same payload) with distinct action_ids and due times, in one INSERT ... SELECT
    (no events rows for the copies). Returns seconds taken."""
    began = time.perf_counter()
    seed = min(n, BATCH)
    box = await open_box(db_path, hook)
    try:
        await box.enqueue_many(intent(i) for i in range(seed))
        if n > seed:
            sql = """
                WITH RECURSIVE k(i) AS (SELECT ? UNION ALL SELECT i + 1 FROM k WHERE i < ?)
                INSERT INTO intents (intent_key, action_id, scope, destination, channel, payload, payload_digest,
                                     status, max_attempts, next_attempt_at, created_at, updated_at)
                SELECT t.scope || printf('/bench-%09d', k.i), printf('bench-%09d', k.i), t.scope, t.destination,
                       t.channel, t.payload,
                       t.payload_digest, 'pending', t.max_attempts, t.next_attempt_at + k.i,
                       t.created_at, t.updated_at
                FROM k, (SELECT * FROM intents ORDER BY seq LIMIT 1) AS t
            """
            await box.store._write(lambda conn: conn.execute(sql, (seed, n - 1)))
        found = await scalar(box, "SELECT count(*) FROM intents WHERE status = 'pending'")
    finally:
        await box.close()
    if found != n:
        raise BenchError(f"{db_path.name}: {found} pending intents, expected {n}")
    return time.perf_counter() - began


def peak_rss_kib() -> tuple[int, int]:
    """(VmHWM, ru_maxrss) in KiB. VmHWM is the peak of this process's own address space; on
    Linux ru_maxrss also keeps the high-water mark of the address space exec replaced, which for
    a spawned child is its parent's RSS at the time, so it is printed but not trusted here."""
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]), maxrss
    except OSError:
        pass
    return maxrss, maxrss


def rss_child(db_path: str) -> None:
    """In a fresh process: open the outbox, run one ``Worker.run_once()``, print peak RSS (KiB)."""

    async def main() -> dict[str, Any]:
        from outbox import Outbox
        from sender import Worker

        imported = peak_rss_kib()[0]
        box = await Outbox.open(f"sqlite:///{db_path}", settings=settings())
        try:
            opened = peak_rss_kib()[0]
            worker = Worker(box)
            try:
                claimed = await worker.run_once()
            finally:
                await worker.aclose()  # run_once leaves the channels open
            delivered = await scalar(box, "SELECT count(*) FROM intents WHERE status = 'delivered'")
        finally:
            await box.close()
        peak, maxrss = peak_rss_kib()
        return {"imported_kib": imported, "opened_kib": opened, "peak_kib": peak,
                "ru_maxrss_kib": maxrss, "claimed": claimed, "delivered": delivered}

    print(json.dumps(asyncio.run(main())))


def measure_rss(db_path: Path, workdir: Path) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--rss-child", str(db_path)]
    done = subprocess.run(cmd, env=harness.clean_env(), cwd=workdir, capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT_SECONDS)
    if done.returncode != 0:
        raise BenchError(f"the RSS child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if result["claimed"] != CONCURRENCY or result["delivered"] != CONCURRENCY:
        raise BenchError(f"the RSS child claimed {result['claimed']} and delivered "
                         f"{result['delivered']}, expected {CONCURRENCY} each")
    return result


# -- claim latency at 10k and 1M pending ------------------------------------------------------


@dataclass
class ClaimTimes:
    claims: list[float] = field(default_factory=list)  # seconds per store.claim (with commit)
    statements: list[float] = field(default_factory=list)  # seconds per claim (pick and lease statements), rolled back


async def claim_latency(small: Path, big: Path, hook: str) -> tuple[ClaimTimes, ClaimTimes]:
    """CLAIMS store.claim(limit=CONCURRENCY) per database, interleaved in chunks; then the claim's
    pick and lease statements alone on a plain connection, rolled back each time (no fsync)."""
    from outbox.store.sqlite import SQL, to_us

    times = {small: ClaimTimes(), big: ClaimTimes()}
    boxes = {path: await open_box(path, hook) for path in (small, big)}
    try:
        for box in boxes.values():  # warm-up: first pages into the cache, first WAL growth
            now = box.clock.now()
            await box.store.claim("warmup", now=now, lease_until=now + timedelta(seconds=60), limit=CONCURRENCY)
        for chunk in range(CLAIMS // CLAIM_CHUNK):
            for path, box in boxes.items():
                for _ in range(CLAIM_CHUNK):
                    now = box.clock.now()
                    began = time.perf_counter()
                    got = await box.store.claim(f"bench-{chunk}", now=now,
                                                lease_until=now + timedelta(seconds=60), limit=CONCURRENCY)
                    times[path].claims.append(time.perf_counter() - began)
                    if len(got) != CONCURRENCY:
                        raise BenchError(f"{path.name}: a claim returned {len(got)} intents")
    finally:
        for box in boxes.values():
            await box.close()

    sql = SQL
    conns = {path: sqlite3.connect(path, isolation_level=None) for path in (small, big)}
    try:
        for _ in range(CLAIMS // CLAIM_CHUNK):
            for path, conn in conns.items():
                for _ in range(CLAIM_CHUNK):
                    at = to_us(boxes[path].clock.now())
                    began = time.perf_counter()
                    conn.execute("BEGIN IMMEDIATE")
                    seqs = conn.execute(sql["due_seqs"], (at, CONCURRENCY)).fetchone()[0]
                    conn.execute(sql["lease"], ("stmt", at + 60_000_000, at, seqs))
                    conn.execute("ROLLBACK")
                    times[path].statements.append(time.perf_counter() - began)
                    if len(json.loads(seqs)) != CONCURRENCY:
                        raise BenchError(f"{path.name}: the claim statements picked {seqs.count(',') + 1} rows")
    finally:
        for conn in conns.values():
            conn.close()
    return times[small], times[big]


# -- running and reporting ---------------------------------------------------------------------


@dataclass
class Row:
    label: str
    value: str
    unit: str
    ratio: str = ""
    spread: str = ""
    target: str = ""
    verdict: str = ""


def render(rows: list[Row], header: tuple[str, ...]) -> str:
    lines = [header, *((r.label, r.value, r.unit, r.ratio, r.spread, r.target, r.verdict) for r in rows)]
    return harness.render_table(lines, right={1, 3})


def progress(stage: str, label: str, value: str) -> None:
    print(f"{stage + ':':<10} {label:<44} {value}", flush=True)


def claim_rows(small: Any, big: Any, big_n: int, limit: int, statements: str) -> list[Row]:
    """Print the claim latencies at SMALL_PENDING and big_n pending; their rows for the table
    (``small`` and ``big`` hold ``claims`` and ``statements`` in seconds, ``statements`` names the latter)."""
    for label, t in ((f"{SMALL_PENDING:,}", small), (f"{big_n:,}", big)):
        progress("claims", f"store.claim(limit={limit}), {label} pending",
                 f"{ms(statistics.mean(t.claims)):>9} ms mean, {ms(statistics.median(t.claims))} median")
    growth = statistics.mean(big.claims) / statistics.mean(small.claims)
    s_growth = statistics.mean(big.statements) / statistics.mean(small.statements)
    return [
        Row(f"store.claim({limit}), {SMALL_PENDING:,} pending, mean of {CLAIMS}",
            ms(statistics.mean(small.claims)), "ms", "1.00x"),
        Row(f"store.claim({limit}), {big_n:,} pending, mean of {CLAIMS}",
            ms(statistics.mean(big.claims)), "ms", f"{growth:.2f}x", "", "<= 1.5x",
            "met" if growth <= 1.5 else "NOT MET"),
        Row(f"  {statements} (rolled back), {SMALL_PENDING:,}", ms(statistics.mean(small.statements)), "ms", "1.00x"),
        Row(f"  {statements} (rolled back), {big_n:,}", ms(statistics.mean(big.statements)), "ms", f"{s_growth:.2f}x"),
    ]


def check_sizes(parser: argparse.ArgumentParser, args: argparse.Namespace, names: tuple[str, ...]) -> None:
    """``parser.error`` unless each of ``names`` given is positive and ``--big-n`` exceeds SMALL_PENDING."""
    harness.require_positive(parser, args, names)
    if args.big_n is not None and args.big_n <= SMALL_PENDING:
        parser.error(f"--big-n must be more than {SMALL_PENDING:,}")


def per_delivery(runs: list[Delivery], n: int) -> str:
    """The medians over ``runs`` of the worker's CPU per delivery (by thread) and of its commits
    and writes per delivery."""
    def median(values: Any) -> float:
        return statistics.median(v for v in values if v is not None)

    cpu = [d.cpu for d in runs]
    commits = "" if runs[0].commits is None else (
        f"; {median(d.commits for d in runs) / n:.3f} commits, {median(d.jobs for d in runs) / n:.3f} writes "
        f"and {median(d.claims for d in runs) / n:.3f} claims per delivery")
    return (f"{median(c.own_us for c in cpu):,.0f} us CPU per delivery (event loop thread "
            f"{median(c.loop_us for c in cpu):,.0f} us, SQLite writer thread "
            f"{median(c.writer_us for c in cpu):,.0f} us){commits}")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def mib(kib: int) -> str:
    return f"{kib / 1024:.1f}"


async def run(args: argparse.Namespace) -> int:
    n = args.n or (2_000 if args.quick else 20_000)
    big_n = args.big_n or (100_000 if args.quick else 1_000_000)
    rounds = args.rounds or (1 if args.quick else 3)
    problems: list[str] = []
    rows: list[Row] = []
    began = time.perf_counter()
    loop_name = "uvloop" if args.uvloop else "asyncio"
    print(f"delivery benchmark (N={n:,} intents per round, {rounds} round{'s' * (rounds > 1)}, "
          f"concurrency {CONCURRENCY}; store WAL, synchronous=FULL (its default))")
    print(f"{harness.machine_summary()}, worker and client on the {loop_name} loop, receiver "
          f"uvicorn+uvloop+httptools in its own process, files under {args.dir or tempfile.gettempdir()}\n",
          flush=True)

    base_rates: list[float] = []
    base_loads: list[Load] = []
    deliveries: list[Delivery] = []
    ratios: list[float] = []
    channel_loads: list[Load] = []
    channel_ratios: list[float] = []
    noops: list[Delivery] = []
    noop_ratios: list[float] = []
    rss: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-delivery-", dir=args.dir) as tmp:
        root = Path(tmp)
        async with running_receiver(root) as receiver:
            # 2-3: baseline and outbox, in interleaved rounds
            for round_ in range(1, rounds + 1):
                workdir = harness.fresh_dir(root, "round")
                try:
                    load = await baseline(receiver, n)
                    base_rates.append(load.rate)
                    base_loads.append(load)
                    progress(f"round {round_}", f"bare aiohttp client, {CONCURRENCY} in flight",
                             f"{load.rate:>9,.0f} req/s")
                    alone = await channel_alone(receiver, n)
                    channel_loads.append(alone)
                    channel_ratios.append(alone.rate / load.rate)
                    progress(f"round {round_}", "webhook channel alone, no store",
                             f"{alone.rate:>9,.0f} req/s ({alone.rate / load.rate:.2f}x)")
                    got = await outbox_delivery(workdir, receiver, n)
                    deliveries.append(got)
                    ratios.append(got.rate / load.rate)
                    progress(f"round {round_}", f"outbox Worker, concurrency {CONCURRENCY}",
                             f"{got.rate:>9,.0f} deliveries/s ({got.rate / load.rate:.2f}x)")
                    shutil.rmtree(workdir, ignore_errors=True)
                    workdir = harness.fresh_dir(root, "round")
                    idle = await outbox_delivery(workdir, receiver, n, noop=True)
                    noops.append(idle)
                    noop_ratios.append(idle.rate / load.rate)
                    progress(f"round {round_}", "outbox Worker, no-op channel",
                             f"{idle.rate:>9,.0f} deliveries/s ({idle.rate / load.rate:.2f}x)")
                except BenchError as exc:
                    problems.append(f"delivery round {round_}: {exc}")
                    print(f"round {round_}: FAILED: {exc}", flush=True)
                finally:
                    shutil.rmtree(workdir, ignore_errors=True)
            counts = await receiver.counts()
            if counts[BASELINE_PATH] != rounds * (WARMUP + n):
                problems.append(f"the receiver counted {counts[BASELINE_PATH]} baseline requests, "
                                f"expected {rounds * (WARMUP + n)}")
            if counts[CHANNEL_PATH] != len(channel_loads) * (WARMUP + n):
                problems.append(f"the receiver counted {counts[CHANNEL_PATH]} channel-alone requests, "
                                f"expected {len(channel_loads) * (WARMUP + n)}")

            if base_rates:
                rows.append(Row(f"bare aiohttp client -> receiver ({CONCURRENCY} in flight)",
                                f"{statistics.median(base_rates):,.0f}", "req/s", "1.00x"))
            if deliveries:
                median, spread = harness.fmt_ratio(ratios)
                rows.append(Row(f"outbox Worker, durable delivery ({CONCURRENCY} in flight)",
                                f"{statistics.median(d.rate for d in deliveries):,.0f}", "deliveries/s",
                                median, spread, ">= 0.5x",
                                "met" if statistics.median(ratios) >= 0.5 else "NOT MET"))
            if channel_loads:  # where the worker's time goes: the HTTP channel, and the rest
                median, spread = harness.fmt_ratio(channel_ratios)
                rows.append(Row("  apart: the webhook channel alone, no store",
                                f"{statistics.median(c.rate for c in channel_loads):,.0f}", "req/s", median, spread))
            if noops:
                median, spread = harness.fmt_ratio(noop_ratios)
                rows.append(Row("  apart: the Worker with a no-op channel (no HTTP)",
                                f"{statistics.median(d.rate for d in noops):,.0f}", "deliveries/s", median, spread))

            # 4: peak RSS
            if not args.skip_rss:
                for pending in (RSS_SMALL_PENDING, RSS_PENDING):
                    workdir = harness.fresh_dir(root, f"rss-{pending}")
                    try:
                        db_path = workdir / "rss.db"
                        await build_db(db_path, receiver.hook, pending)
                        rss[pending] = measure_rss(db_path, workdir)
                        progress("RSS", f"child, {pending:,} pending, run_once()",
                                 f"{mib(rss[pending]['peak_kib']):>9} MiB peak")
                    except BenchError as exc:
                        problems.append(f"RSS with {pending:,} pending: {exc}")
                    finally:
                        shutil.rmtree(workdir, ignore_errors=True)
            if len(rss) == 2:
                small, large = rss[RSS_SMALL_PENDING], rss[RSS_PENDING]
                growth = large["peak_kib"] / small["peak_kib"]
                rows.append(Row(f"peak RSS (VmHWM), {RSS_SMALL_PENDING:,} pending, open + run_once",
                                mib(small["peak_kib"]), "MiB", "1.00x"))
                rows.append(Row(f"peak RSS (VmHWM), {RSS_PENDING:,} pending, open + run_once",
                                mib(large["peak_kib"]), "MiB", f"{growth:.2f}x", "", "<= 1.2x",
                                "met" if growth <= 1.2 else "NOT MET"))

            # 5: claim latency
            if not args.skip_claims:
                workdir = harness.fresh_dir(root, "claims")
                try:
                    small_db, big_db = workdir / "small.db", workdir / "big.db"
                    build_small = await build_db(small_db, receiver.hook, SMALL_PENDING)
                    build_big = await build_db(big_db, receiver.hook, big_n)
                    size = big_db.stat().st_size + sum(
                        p.stat().st_size for p in workdir.glob("big.db-*"))
                    progress("claims", f"built {big_n:,} pending intents",
                             f"{build_big:>9.1f} s ({size / 2**20:,.0f} MiB; "
                             f"{SMALL_PENDING:,} in {build_small:.1f} s)")
                    small_t, big_t = await claim_latency(small_db, big_db, receiver.hook)
                    rows += claim_rows(small_t, big_t, big_n, CONCURRENCY, "claim statements alone")
                except BenchError as exc:
                    problems.append(f"claim latency: {exc}")
                finally:
                    shutil.rmtree(workdir, ignore_errors=True)
            receiver.alive()

    print(f"\ndelivery benchmark (N={n:,}; WAL, synchronous=FULL; median of {rounds} "
          f"round{'s' * (rounds > 1)}, ratio per round against the bare client)")
    print(render(rows, ("case", "value", "unit", "ratio", "spread", "target", "")))
    if deliveries:
        d = deliveries[-1]
        commits = "" if d.commits is None else (
            f"; {d.commits:,} SQLite commits carrying {d.jobs:,} writes ({d.commits / n:.2f} "
            f"commits and {d.jobs / n:.2f} writes per delivery, {d.commits / d.seconds:,.0f} commits/s)")
        print(f"worker, last round: {d.claims:,} claims for {d.claimed:,} intents "
              f"({d.claimed / max(1, d.claims):.1f} per claim){commits}; {d.seconds:.2f} s to the last "
              f"recorded delivery, {d.observed_seconds:.2f} s to the poll that saw it")
        if d.cpu.receiver_us is not None and base_loads[-1].cpu and base_loads[-1].cpu.receiver_us is not None:
            b = base_loads[-1].cpu
            print(f"CPU per request, last round: bare client {b.own_us:,.0f} us (receiver {b.receiver_us:,.0f} us); "
                  f"worker process {d.cpu.own_us:,.0f} us per delivery, event loop and SQLite writer "
                  f"thread together (receiver {d.cpu.receiver_us:,.0f} us)")
        if channel_loads and channel_loads[-1].cpu and noops:
            print(f"  apart, last round: the webhook channel alone {channel_loads[-1].cpu.own_us:,.0f} us per "
                  f"request; the worker with a no-op channel {noops[-1].cpu.own_us:,.0f} us per delivery")
        for label, runs in (("durable webhook", deliveries), ("no-op channel", noops)):
            if runs:
                print(f"worker, {label}, median of {len(runs)}: {per_delivery(runs, n)}")
        for round_, got in enumerate(deliveries, 1):
            if got.warnings:
                print(f"worker warnings, round {round_}: {got.warnings}; e.g. {got.warning_samples[:1]}")
            if got.lease_lost:
                print(f"  the intents named by 'lease lost', round {round_}: {dict(got.lease_lost)} "
                      f"(the worker had no fenced write rejected)")
    if rss:
        for pending, got in sorted(rss.items()):
            print(f"RSS child, {pending:,} pending (VmHWM): {mib(got['imported_kib'])} MiB after imports, "
              f"{mib(got['opened_kib'])} after open, {mib(got['peak_kib'])} after run_once "
              f"({got['claimed']} claimed and delivered); its ru_maxrss says {mib(got['ru_maxrss_kib'])} "
              "MiB, which on Linux includes the parent's RSS when it spawned the child")
    return harness.finish(began, problems)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = harness.new_parser(__doc__)
    add = parser.add_argument
    add("--n", type=int, help="intents (and baseline requests) per round (20,000; --quick 2,000)")
    add("--rounds", type=int, help="interleaved baseline/outbox rounds (3; --quick 1)")
    add("--big-n", type=int, help="pending intents for the large claim case (1,000,000; --quick 100,000)")
    add("--quick", action="store_true", help="a short run: N=2,000, 100,000 instead of 1,000,000")
    add("--uvloop", action="store_true", help="run the worker and the client on uvloop")
    add("--skip-rss", action="store_true", help="skip the peak RSS case")
    add("--skip-claims", action="store_true", help="skip the claim latency case")
    add("--dir", help="where the databases go (the fsync cost depends on the filesystem)")
    add("--serve-receiver", type=int, metavar="PORT", help=argparse.SUPPRESS)
    add("--rss-child", metavar="DB", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    check_sizes(parser, args, ("n", "rounds", "big_n"))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve_receiver is not None:
        serve_receiver(args.serve_receiver)
        return 0
    if args.rss_child is not None:
        rss_child(args.rss_child)
        return 0
    return harness.run_main(run(args), uvloop=args.uvloop)


if __name__ == "__main__":
    sys.exit(main())
