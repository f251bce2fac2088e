"""Receiver throughput with ``IdempotencyMiddleware``, as ratios to the bare app from the same run.

A minimal receiver — a pure ASGI callable answering every POST with 201 and a small JSON body —
is served by uvicorn (uvloop, httptools, no access log, one process) in a subprocess of its own,
with and without ``receivers.IdempotencyMiddleware`` over ``receivers.SqliteRecordStore`` (WAL,
``synchronous=FULL``: a claim is group-committed and durable before the handler runs, and so is
the completed record). One aiohttp ClientSession with CONCURRENCY requests in flight drives it:

1. the bare app, POST with an ``Idempotency-Key`` header that nobody reads (the baseline: the
   ceiling of this client, this HTTP stack and this machine);
2. with the middleware, first-time requests: every request a new key, so each one costs a
   durable claim and a durable completion;
3. with the middleware, replays: KEYS keys sent once each first (untimed), then N requests
   cycling over them with identical bodies; every answer must be a replay
   (``Idempotent-Replayed: true``) of the stored 201 and its body.

Each case runs against a fresh server process and a fresh database, in interleaved rounds, and
a ratio is the median of the per-round ratios to that round's bare figure, so that a noisy
machine's drift mostly cancels. Beside each rate the table shows the CPU the server process (all
its threads) and the load generator used per wall second, which tells who was the bottleneck,
the server's CPU time per request, and the CPU that other processes on the machine took meanwhile
(on a small machine they make the figures noisy: rerun when it is quiet). ``--profile`` adds a
pass of cases 2 and 3 with the server under cProfile and prints where its event-loop thread
spends its time.

Targets are printed beside the figures; nothing here asserts on timing. The exit status is
non-zero only when a measurement is invalid (a failed or unexpected answer, a missing record, a
dead server).

    python tests/bench/bench_receivers.py [--n N] [--rounds R] [--quick] [--concurrency C] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import secrets
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

import aiohttp
import harness
from harness import BenchError

CONCURRENCY = 64
#: Distinct keys replayed in case 3.
KEYS = 100
NOTE = "x" * 80
#: How long case 3 waits for its pre-warmed keys to read as completed (should a completion be
#: recorded after the answer leaves, a repeat that overtook that write would find it in progress).
SETTLE_SECONDS = 5.0
REPLAYED = "Idempotent-Replayed"
#: What a server child prints once uvicorn.run returned, with its lingering non-daemon threads.
LOOP_RETURNED = "bench: uvicorn.run returned; non-daemon threads still alive:"
#: The middleware's default table (``SqliteRecordStore(table=...)``).
TABLE = "idempotency_records"


# -- the receiver (its own process) ------------------------------------------------------------


def minimal_app() -> Callable[..., Any]:
    """A pure ASGI app: 201 and a small JSON body (with a per-process sequence number, so that a
    replay can be told from a fresh run) to any POST; 200 to ``GET /healthz``; 404 otherwise; and
    the lifespan protocol, as a deployed app would speak it."""
    seq = count(1)
    json_type = (b"content-type", b"application/json")

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":  # what lets the middleware close its store on shutdown
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        more = True
        while more:  # read the whole body, as a real receiver would
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            more = message.get("more_body", False)
        if scope["method"] == "POST":
            status, body = 201, b'{"accepted":true,"seq":%d}' % next(seq)
        elif scope["path"] == "/healthz":
            status, body = 200, b'{"ok":true}'
        else:
            status, body = 404, b'{"ok":false}'
        headers = [json_type, (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def serve(mode: str, port: int, db_path: str, profile_out: str | None) -> None:
    """uvicorn (uvloop, httptools, no access log, one process) serving the minimal app, bare or
    behind ``IdempotencyMiddleware`` over a SQLite record store at ``db_path``."""
    import uvicorn

    app: Any = minimal_app()
    if mode == "idem":
        from receivers import IdempotencyMiddleware, SqliteRecordStore

        app = IdempotencyMiddleware(app, store=SqliteRecordStore(db_path))
    elif mode != "bare":
        raise SystemExit(f"unknown server mode {mode!r}")
    # uvicorn re-raises the SIGTERM it caught once it has shut down, and by default that kills
    # the process before anything below runs: let it return instead (the profile gets written).
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    profiler = None
    if profile_out:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    try:
        uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools",
                    access_log=False, log_level="warning", lifespan="on")
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(profile_out)
    # Whatever would keep the interpreter from exiting now (a non-daemon thread) is reported to
    # the parent, which tells it apart from a slow shutdown; then the process ends regardless.
    import threading

    lingering = [t.name for t in threading.enumerate() if t.is_alive() and not t.daemon
                 and t is not threading.main_thread()]
    print(f"{LOOP_RETURNED} {json.dumps(lingering)}", flush=True)
    os._exit(0)


# -- server subprocesses -----------------------------------------------------------------------


def machine_busy() -> tuple[float, float] | None:
    """(busy, total) CPU ticks of the whole machine since boot (Linux /proc/stat), else None."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    return total - idle, total


class Server:
    """A server subprocess, always stopped: SIGTERM, then SIGKILL after a timeout."""

    def __init__(self, mode: str, workdir: Path, *, profile_out: Path | None = None) -> None:
        self.mode = mode
        self.port = harness.free_port()
        self.db_path = workdir / "records.db"
        self.log = workdir / f"server-{mode}.log"
        self.base = f"http://127.0.0.1:{self.port}"
        self.profile_out = profile_out
        self.proc: subprocess.Popen[bytes] | None = None
        self.stop_seconds = 0.0
        self.killed = False
        self.loop_returned = False
        self.lingering: list[str] = []

    def start(self) -> None:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--serve", self.mode, str(self.port),
               str(self.db_path)]
        if self.profile_out is not None:
            cmd += ["--serve-profile", str(self.profile_out)]
        self.proc = harness.spawn(cmd, cwd=self.log.parent, log=self.log)

    def stop(self) -> None:
        proc = self.proc
        if proc is None:
            return
        began = time.perf_counter()
        self.killed = harness.stop_process(proc) or self.killed
        self.stop_seconds = time.perf_counter() - began
        for line in harness.log_tail(self.log, 200).splitlines():
            if line.startswith(LOOP_RETURNED):
                self.loop_returned = True
                self.lingering = json.loads(line[len(LOOP_RETURNED):])

    def alive(self) -> None:
        harness.check_alive(self.proc, self.log, f"the {self.mode} server")

    def cpu(self) -> float | None:
        return None if self.proc is None else harness.process_cpu(self.proc.pid)

    async def __aenter__(self) -> Server:
        self.start()
        try:
            await harness.wait_ready(f"{self.base}/healthz", self.alive, self.log)
        except BaseException:
            self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop()


# -- the load ----------------------------------------------------------------------------------


def body_for(i: int) -> bytes:
    return json.dumps({"order": i, "note": NOTE}, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Plan:
    """What to send: request ``i`` uses key ``keys[i % len(keys)]`` and that key's body."""

    keys: list[str]
    bodies: list[bytes]
    headers: list[dict[str, str]]

    @classmethod
    def fresh(cls, prefix: str, n: int) -> Plan:
        salt = secrets.token_hex(4)
        keys = [f"{prefix}-{salt}-{i:08d}" for i in range(n)]
        bodies = [body_for(i) for i in range(n)]
        headers = [{"Content-Type": "application/json", "Idempotency-Key": key} for key in keys]
        return cls(keys, bodies, headers)


@dataclass
class Load:
    """What one case saw: timed successes and replays, failures (any phase) by kind, CPU use."""

    requests: int = 0  # sent in all, every phase
    ok: int = 0  # expected answers among the timed requests
    replayed: int = 0  # timed answers carrying Idempotent-Replayed: true
    warm_ok: int = 0  # expected answers in the untimed phases that ran the handler
    seconds: float = 0.0  # wall time of the timed requests
    server_cpu: float | None = None  # CPU seconds of the server process during the timed requests
    client_cpu: float = 0.0  # CPU seconds of this process during the timed requests
    machine: float | None = None  # busy share of all the machine's CPUs during the timed requests
    settle_busy: int = 0  # 409 answers while waiting for the pre-warmed keys to complete
    failures: Counter[str] = field(default_factory=Counter)
    samples: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what makes the measurement invalid
    observed: list[str] = field(default_factory=list)  # worth reporting, but no failure

    @property
    def rate(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    @property
    def others(self) -> float | None:
        """Cores that neither the client nor the server used while the machine was busy: other
        processes competing for the CPUs (kernel threads, anything else running) make figures noisy."""
        if self.machine is None or self.server_cpu is None or not self.seconds:
            return None
        used = (self.server_cpu + self.client_cpu) / self.seconds
        return max(0.0, self.machine * (os.cpu_count() or 1) - used)

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    def fail(self, kind: str, detail: str) -> None:
        self.failures[kind] += 1
        if len(self.samples) < 3 and detail not in self.samples:
            self.samples.append(detail)


async def post(
    session: aiohttp.ClientSession, url: str, plan: Plan, i: int, load: Load, *,
    replay: bool, originals: dict[str, bytes] | None = None,
) -> tuple[int, bool, bytes] | None:
    """One POST; checks the answer (201, replayed or not as ``replay`` says, and for a replay
    the original's body). Returns (status, replayed, body) when it was as expected, else None."""
    j = i % len(plan.keys)
    load.requests += 1
    try:
        async with session.post(url, data=plan.bodies[j], headers=plan.headers[j]) as response:
            text = await response.read()
            status = response.status
            replayed = response.headers.get(REPLAYED) == "true"
    except (TimeoutError, aiohttp.ClientError) as exc:
        load.fail(type(exc).__name__, repr(exc))
        return None
    if status != 201:
        load.fail(f"HTTP {status}", f"HTTP {status} {text[:300].decode(errors='replace')}")
    elif replayed != replay:
        load.fail("replayed" if replayed else "not replayed",
                  f"{plan.keys[j]}: {REPLAYED} {'present' if replayed else 'absent'}: {text[:200]!r}")
    elif originals is not None and originals.get(plan.keys[j]) != text:
        load.fail("replayed body differs",
                  f"{plan.keys[j]}: replayed {text[:200]!r}, first answer {originals.get(plan.keys[j])!r}")
    else:
        return status, replayed, text
    return None


async def fire(
    session: aiohttp.ClientSession, url: str, plan: Plan, first: int, stop: int, load: Load, *,
    replay: bool, originals: dict[str, bytes] | None = None, timed: bool = False,
    server: Server | None = None,
) -> int:
    """Requests ``first`` .. ``stop - 1`` of ``plan`` from CONCURRENCY workers; returns how many
    answered as expected. ``timed``: records wall time and both sides' CPU in ``load``."""
    replayed = 0

    async def one(i: int) -> bool:
        nonlocal replayed
        got = await post(session, url, plan, i, load, replay=replay, originals=originals)
        if got is not None:
            replayed += got[1]
        return got is not None

    server_before = server.cpu() if server else None
    machine_before = machine_busy()
    client_before = time.process_time()
    ok, elapsed = await harness.fan_out(CONCURRENCY, first, stop, one)
    if timed:
        load.seconds = elapsed
        load.ok = ok
        load.replayed = replayed
        load.client_cpu = time.process_time() - client_before
        server_after = server.cpu() if server else None
        machine_after = machine_busy()
        if machine_before is not None and machine_after is not None and machine_after[1] > machine_before[1]:
            load.machine = (machine_after[0] - machine_before[0]) / (machine_after[1] - machine_before[1])
        if server_before is not None and server_after is not None:
            load.server_cpu = server_after - server_before
    return ok


def record_states(db_path: Path) -> Counter[str]:
    if not db_path.exists():
        return Counter()
    with sqlite3.connect(db_path) as db:
        return Counter(dict(db.execute(f"SELECT state, count(*) FROM {TABLE} GROUP BY state").fetchall()))


def check_stopped(server: Server, load: Load) -> None:
    if server.lingering:
        load.observed.append(f"the {server.mode} server's process would not have exited after uvicorn.run "
                             f"returned (lifespan on, shutdown complete): non-daemon thread(s) "
                             f"{', '.join(server.lingering)} still alive")
    if server.killed:
        load.notes.append(f"{server.mode} server ignored SIGTERM for {harness.SERVER_STOP_SECONDS:.0f} s and was "
                          f"killed (uvicorn.run {'had' if server.loop_returned else 'had not'} returned)")


def expect_records(db_path: Path, expected: Counter[str], load: Load) -> None:
    found = record_states(db_path)
    if +found != +expected:
        load.fail("records", f"{db_path.name}: records by state {dict(found)}, expected {dict(expected)}")


# -- the cases ---------------------------------------------------------------------------------


async def fresh_keys(prefix: str, mode: str, workdir: Path, n: int,
                     server_profile: Path | None = None) -> tuple[Server, Load]:
    """Warm-up, then n timed requests, every one with a key not sent before, to a ``mode`` server."""
    plan = Plan.fresh(prefix, 4 * CONCURRENCY + n)
    load = Load()
    server = Server(mode, workdir, profile_out=server_profile)
    async with server, harness.client_session(CONCURRENCY) as session:
        url = f"{server.base}/hook"
        load.warm_ok = await fire(session, url, plan, 0, 4 * CONCURRENCY, load, replay=False)
        await fire(session, url, plan, 4 * CONCURRENCY, len(plan.keys), load, replay=False,
                   timed=True, server=server)
        server.alive()
    check_stopped(server, load)
    return server, load


async def bare_case(workdir: Path, n: int) -> Load:
    """Case 1: the bare app; the Idempotency-Key header is sent and ignored."""
    return (await fresh_keys("bare", "bare", workdir, n))[1]


async def first_time_case(workdir: Path, n: int, server_profile: Path | None = None) -> Load:
    """Case 2: every request a new key: a durable claim and a durable completion each."""
    server, load = await fresh_keys("new", "idem", workdir, n, server_profile)
    if server.loop_returned:  # else it was killed and may not have recorded its last completions
        expect_records(server.db_path, Counter(completed=load.warm_ok + load.ok), load)
    return load


async def settled(
    session: aiohttp.ClientSession, url: str, plan: Plan, i: int, load: Load, deadline: float
) -> bool:
    """Whether key ``i`` replays now (False: it is still in progress, ask again); a failure past
    ``deadline`` or of another kind is recorded in ``load`` and counts as settled."""
    load.requests += 1
    try:
        async with session.post(url, data=plan.bodies[i], headers=plan.headers[i]) as response:
            text = await response.read()
            status, replayed = response.status, response.headers.get(REPLAYED) == "true"
    except (TimeoutError, aiohttp.ClientError) as exc:
        load.fail(f"settle {type(exc).__name__}", repr(exc))
        return True
    if status == 201 and replayed:
        return True
    if status != 409 or time.monotonic() > deadline:
        load.fail(f"settle HTTP {status}", text[:300].decode(errors="replace"))
        return True
    load.settle_busy += 1
    return False


async def replay_case(workdir: Path, n: int, server_profile: Path | None = None) -> Load:
    """Case 3: KEYS keys sent once each, then n requests cycling over them: all replays."""
    plan = Plan.fresh("replay", KEYS)
    load = Load()
    originals: dict[str, bytes] = {}
    server = Server("idem", workdir, profile_out=server_profile)
    async with server, harness.client_session(CONCURRENCY) as session:
        url = f"{server.base}/hook"
        # pre-warm: each key once, its first answer kept to compare the replays with
        tickets = count()

        async def prewarm() -> None:
            while (i := next(tickets)) < KEYS:
                got = await post(session, url, plan, i, load, replay=False)
                if got is not None:
                    originals[plan.keys[i]] = got[2]

        await asyncio.gather(*(prewarm() for _ in range(CONCURRENCY)))
        load.warm_ok = len(originals)
        # settle: wait until every key reads as completed (409 "in progress" meanwhile) before
        # counting on replays, in case a completion is recorded after its answer went out
        deadline = time.monotonic() + SETTLE_SECONDS
        for i, key in enumerate(plan.keys):
            while key in originals and not await settled(session, url, plan, i, load, deadline):
                await asyncio.sleep(0.01)
        await fire(session, url, plan, 0, 4 * CONCURRENCY, load, replay=True, originals=originals)
        await fire(session, url, plan, 0, n, load, replay=True, originals=originals, timed=True,
                   server=server)
        server.alive()
    check_stopped(server, load)
    if server.loop_returned:
        expect_records(server.db_path, Counter(completed=len(originals)), load)
    if load.replayed != load.ok:
        load.fail("not replayed", f"{load.ok - load.replayed} timed 201s were not replays")
    return load


@dataclass(frozen=True)
class Case:
    key: str
    label: str
    run: Callable[..., Any]
    target: float | None = None  # minimum ratio to the bare app


CASES = [
    Case("bare", "bare app, POST (key ignored)", bare_case),
    Case("first", "middleware, first-time keys", first_time_case, 0.4),
    Case("replay", f"middleware, replays ({KEYS} keys)", replay_case, 0.8),
]


# -- running and reporting ---------------------------------------------------------------------


@dataclass
class Row:
    label: str
    rate: float
    ratios: list[float]
    target: str = ""
    met: bool | None = None
    server_cpu: str = ""
    client_cpu: str = ""
    server_us: str = ""
    others: str = ""
    note: str = ""


def render(rows: list[Row]) -> str:
    header = ("case", "req/s", "vs bare", "spread", "target", "", "server CPU", "client CPU",
              "server us/req", "others CPU")
    lines = [header]
    for row in rows:
        median, spread = harness.fmt_ratio(row.ratios, places=3)  # three places: a verdict at 0.40x is readable
        verdict = "" if row.met is None else ("met" if row.met else "NOT MET")
        rate = f"{row.rate:,.0f}" if row.rate else "-"
        lines.append((row.label, rate, median, spread, row.target, verdict + row.note,
                      row.server_cpu, row.client_cpu, row.server_us, row.others))
    return harness.render_table(lines, right={1, 2, 6, 7, 8, 9})


def progress(stage: str, label: str, load: Load) -> None:
    cpu = f"server {load.server_cpu / load.seconds:4.0%}" if load.server_cpu is not None else ""
    extra = f", {load.replayed:,} replayed" if load.replayed else ""
    machine = f", others {load.others:4.0%}" if load.others is not None else ""
    print(f"{stage + ':':<9} {label:<32} {load.rate:>9,.0f} req/s  ({cpu}, client "
          f"{load.client_cpu / load.seconds:4.0%} of a core{machine}{extra})", flush=True)


def median_of(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def rows_for(loads: dict[str, list[Load | None]]) -> list[Row]:
    baseline = loads["bare"]
    rows = []
    for case in CASES:
        got = [load for load in loads[case.key] if load is not None and load.rate]
        if not got:
            rows.append(Row(case.label, 0.0, [], note="failed"))
            continue
        if case.key == "bare":
            ratios = [1.0]
        else:
            ratios = [load.rate / base.rate for load, base in zip(loads[case.key], baseline, strict=True)
                      if load is not None and base is not None and load.rate and base.rate]
        ratio = statistics.median(ratios) if ratios else None
        server = median_of([g.server_cpu / g.seconds for g in got if g.server_cpu is not None])
        server_us = median_of([g.server_cpu / g.ok * 1e6 for g in got if g.server_cpu is not None])
        client = median_of([g.client_cpu / g.seconds for g in got])
        others = median_of([g.others for g in got if g.others is not None])
        rows.append(Row(
            case.label, statistics.median(g.rate for g in got), ratios,
            f">= {case.target}x" if case.target else "",
            None if case.target is None or ratio is None else ratio >= case.target,
            "" if server is None else f"{server:.0%}", "" if client is None else f"{client:.0%}",
            "" if server_us is None else f"{server_us:,.0f}",
            "" if others is None else f"{others:.0%}",
        ))
    return rows


def report_problems(label: str, load: Load, problems: list[str]) -> None:
    if load.failed:
        problems.append(f"{label}: {load.failed} of {load.requests} requests failed: "
                        f"{dict(load.failures)}; e.g. {load.samples}")
    problems.extend(f"{label}: {note}" for note in load.notes)


async def profile_pass(root: Path, n: int, top: int) -> None:
    """Cases 2 and 3 once more with the server's event-loop thread under cProfile."""
    import pstats

    for case in CASES[1:]:
        workdir = harness.fresh_dir(root, f"profile-{case.key}")
        out = workdir / "server.prof"
        try:
            load = await case.run(workdir, n, out)
        except BenchError as exc:
            print(f"\n-- profile: {case.label}: FAILED: {exc}")
            continue
        print(f"\n-- profile: {case.label}, {load.rate:,.0f} req/s under cProfile, "
              f"{load.failed} failures; server event-loop thread, top {top} by own time --")
        if not out.exists():
            print("(no profile written: the server did not stop cleanly)")
            continue
        stream = io.StringIO()
        stats = pstats.Stats(str(out), stream=stream)
        stats.strip_dirs().sort_stats("tottime").print_stats(top)
        print("\n".join(line for line in stream.getvalue().splitlines()
                        if line.strip() and not line.startswith(("   Ordered", "         "))))
        stream = io.StringIO()
        stats.stream = stream
        stats.sort_stats("cumulative").print_stats(r"receivers|keys|rfc8785|aiosqlite", top)
        print("-- same, receivers/outbox/aiosqlite functions by cumulative time --")
        print("\n".join(line for line in stream.getvalue().splitlines()
                        if line.strip() and not line.startswith(("   Ordered", "         "))))


def describe_load_generator(loads: dict[str, list[Load | None]]) -> None:
    """Say who was the bottleneck: the client's and the server's share of a core in each case."""
    def share(key: str, side: str) -> float | None:
        got = [load for load in loads[key] if load is not None and load.seconds]
        if side == "client":
            return median_of([load.client_cpu / load.seconds for load in got])
        return median_of([load.server_cpu / load.seconds for load in got if load.server_cpu is not None])

    bare = [load for load in loads["bare"] if load is not None and load.ok]
    client, server = share("bare", "client"), share("bare", "server")
    if not bare or client is None:
        return
    rate = statistics.median(load.rate for load in bare)
    line = f"load generator: {rate:,.0f} req/s against the bare app using {client:.0%} of a core"
    per_request = median_of([load.server_cpu / load.ok for load in bare if load.server_cpu is not None])
    if per_request:
        line += (f" while the bare server used {server:.0%} ({per_request * 1e6:,.0f} us CPU per request, "
                 f"room for ~{1 / per_request:,.0f} req/s on one core)")
    print(line)
    if client >= 0.85:
        print("  so case 1 is bound by the load generator (one Python process), not by the server: the ratios "
              "compare the middleware with what this client can drive, and understate its cost against the "
              "bare server's own capacity (see server us/req)")
    others = [(case.label, share(case.key, "client")) for case in CASES if case.key != "bare"]
    if all(value is not None and value < 0.85 for _, value in others):
        shown = ", ".join(f"{label} {value:.0%}" for label, value in others if value is not None)
        print(f"  with the middleware the same client used less than a core ({shown}): there it waited for "
              "the server, which was the bottleneck")


async def run(args: argparse.Namespace) -> int:
    global CONCURRENCY
    CONCURRENCY = args.concurrency
    n = args.n if args.n is not None else (2_000 if args.quick else 10_000)
    rounds = f"{args.rounds} round{'s' if args.rounds > 1 else ''}"
    problems: list[str] = []
    began = time.perf_counter()
    print(f"receiver benchmark (N={n:,} requests per case, {rounds}, {CONCURRENCY} in flight on one "
          f"aiohttp session; IdempotencyMiddleware over SqliteRecordStore, WAL, synchronous=FULL)")
    print(f"{harness.machine_summary()}, client on {'uvloop' if args.client_loop == 'uvloop' else 'asyncio'}, servers "
          f"uvicorn+uvloop+httptools in their own process, files under "
          f"{args.dir or tempfile.gettempdir()}\n", flush=True)

    loads: dict[str, list[Load | None]] = {case.key: [] for case in CASES}
    busy = 0
    with tempfile.TemporaryDirectory(prefix="bench-receivers-", dir=args.dir) as tmp:
        root = Path(tmp)
        for round_ in range(1, args.rounds + 1):
            for case in CASES:
                workdir = harness.fresh_dir(root, case.key)
                load: Load | None
                try:
                    load = await case.run(workdir, n)
                except BenchError as exc:
                    load = None
                    problems.append(f"round {round_}, {case.label}: {exc}")
                    print(f"round {round_}: {case.label:<32} FAILED: {exc}", flush=True)
                finally:
                    shutil.rmtree(workdir, ignore_errors=True)
                if load is not None:
                    report_problems(f"round {round_}, {case.label}", load, problems)
                    busy += load.settle_busy
                    if load.failed:  # a rate over failed answers is no measurement
                        print(f"round {round_}: {case.label:<32} INVALID: {dict(load.failures)}", flush=True)
                        loads[case.key].append(None)
                        continue
                    progress(f"round {round_}", case.label, load)
                loads[case.key].append(load)
        if args.profile:
            await profile_pass(root, n, args.profile_top)

    rows = rows_for(loads)
    print(f"\nreceiver benchmark (N={n:,}, {CONCURRENCY} in flight; median of {rounds}, "
          "ratios per round against the bare app)")
    print(render(rows))
    replays = [load for load in loads["replay"] if load is not None]
    if replays:
        print(f"replays: {sum(load.replayed for load in replays):,} of {sum(load.ok for load in replays):,} timed "
              f"answers in case 3 carried {REPLAYED}: true with the first answer's body")
    if busy:
        print(f"note: {busy} repeat(s) of pre-warmed keys answered 409 (in progress) before they replayed")
    all_loads = [load for per in loads.values() for load in per if load is not None]
    print(f"failures: {sum(load.failed for load in all_loads)} of {sum(load.requests for load in all_loads):,} "
          "requests (warm-up included)")
    describe_load_generator(loads)
    busiest = max((load.others for load in all_loads if load.others is not None), default=None)
    if busiest is not None and busiest > 0.25:
        print(f"warning: other processes took up to {busiest:.0%} of a core during timed runs (others CPU): "
              "on this machine that makes the figures noisy; rerun when it is quiet")
    for seen in dict.fromkeys(note for load in all_loads for note in load.observed):
        print(f"observed: {seen}")
    return harness.finish(began, problems)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = harness.new_parser(__doc__)
    add = parser.add_argument
    add("--n", type=int, help="requests per case (10,000; 2,000 with --quick)")
    add("--rounds", type=int, default=3, help="interleaved rounds of the three cases (3)")
    add("--quick", action="store_true", help="2,000 requests per case: seconds rather than a minute")
    add("--concurrency", type=int, default=CONCURRENCY, help=f"requests in flight ({CONCURRENCY})")
    add("--client-loop", choices=("uvloop", "asyncio"), default="uvloop",
        help="the load generator's event loop (uvloop)")
    add("--profile", action="store_true", help="then run cases 2 and 3 with the server under cProfile")
    add("--profile-top", type=int, default=25, help="functions shown per profile (25)")
    add("--dir", help="where the databases go (the fsync cost depends on the filesystem)")
    add("--serve", nargs=3, metavar=("MODE", "PORT", "DBPATH"), help=argparse.SUPPRESS)
    add("--serve-profile", metavar="FILE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if (args.n is not None and args.n < 1) or args.rounds < 1 or args.concurrency < 1:
        parser.error("--n, --rounds and --concurrency must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve is not None:
        mode, port, db_path = args.serve
        serve(mode, int(port), db_path, args.serve_profile)
        return 0
    return harness.run_main(run(args), uvloop=args.client_loop == "uvloop")


if __name__ == "__main__":
    sys.exit(main())
