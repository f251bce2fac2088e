"""Enqueue throughput with full durability, as ratios to a raw SQLite baseline from the same run.

An acknowledged enqueue must survive power loss, so it costs at least one SQLite commit in WAL
mode with ``synchronous=FULL``, and that cost is mostly the disk's fsync. Absolute rates say
more about the machine than about the library, so this script also measures a bare aiosqlite
insert-and-commit loop with the same pragmas, in the same run, and reports each library path
as a ratio to it:

1. raw aiosqlite insert loop: one row, one commit (the baseline);
2. ``Outbox.enqueue`` one at a time: one intent per transaction;
3. ``Outbox.enqueue_many`` in batches of 500: one transaction per batch;
4. ``Outbox.enqueue`` from 64 concurrent tasks: the store group-commits them;
5. ``POST /v1/intents`` to ``outbox serve`` in a subprocess from 16 concurrent aiohttp clients,
   beside the same client against a trivial aiohttp server and against the service's
   ``/healthz``, which show how much of that figure the load generator and the HTTP stack take;
6. ``POST /v1/intents:batch`` to the same server in the same run: batches of 500 from 4
   concurrent clients (bodies built before timing), counted in intents/s, every item checked 201.

Cases 1-4 run in interleaved rounds, each in a fresh directory with a fresh database, and a
ratio is the median of the per-round ratios, so that a noisy machine's drift mostly cancels.
Targets are printed beside the figures; nothing here asserts on timing. The exit status is
non-zero only when a measurement is invalid (a failed request, a missing row, a dead server).

    python tests/bench/bench_enqueue.py [--n N] [--rounds R] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import aiosqlite
import harness
from aiohttp import web
from harness import BenchError

from outbox import DestinationSpec, Outbox, Role

DESTINATION = "bench"
SCOPE = "acme"
NOTE = "x" * 100
SPEC = DestinationSpec(
    url="http://127.0.0.1:9/hook", secret="whsec_" + "A" * 44, allow_private_network=True
)
#: Untimed operations before each timed loop (first WAL growth, connection set-up).
WARMUP = 20
BATCH = 500
TASKS = 64
CLIENTS = 16
BATCH_CLIENTS = 4

RAW_PRAGMAS = "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
RAW_TABLE = """
CREATE TABLE rows (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    key     TEXT NOT NULL UNIQUE,
    payload TEXT NOT NULL
)
"""
RAW_INSERT = "INSERT INTO rows (key, payload) VALUES (?, ?)"


# -- workload --------------------------------------------------------------------------------


def payload(i: int) -> dict[str, Any]:
    return {"order": i, "note": NOTE}


def intent(i: int) -> dict[str, Any]:
    return {"destination": DESTINATION, "scope": SCOPE, "payload": payload(i)}


def count_rows(db_path: Path, table: str) -> int:
    with sqlite3.connect(db_path) as db:
        return int(db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def expect_rows(db_path: Path, table: str, expected: int) -> None:
    found = count_rows(db_path, table)
    if found != expected:
        raise BenchError(f"{db_path.name}: {found} rows in {table}, expected {expected}")


def check_created(created: bool, i: int) -> None:
    if not created:
        raise BenchError(f"enqueue #{i} returned created=False for a fresh action_id")


# -- cases 1-4: in process ---------------------------------------------------------------------


async def raw_insert_loop(db_path: Path, n: int) -> float:
    """Rows/s of a bare insert-and-commit loop (parameters prepared before timing)."""
    rows = [
        (f"{i:010d}-{secrets.token_hex(13)}", json.dumps(payload(i), separators=(",", ":")))
        for i in range(WARMUP + n)
    ]
    async with aiosqlite.connect(db_path) as db:  # default isolation level: implicit BEGIN
        await db.executescript(RAW_PRAGMAS)
        await db.execute(RAW_TABLE)
        await db.commit()
        for params in rows[:WARMUP]:
            await db.execute(RAW_INSERT, params)
            await db.commit()
        start = time.perf_counter()
        for params in rows[WARMUP:]:
            await db.execute(RAW_INSERT, params)
            await db.commit()
        elapsed = time.perf_counter() - start
    expect_rows(db_path, "rows", WARMUP + n)
    return n / elapsed


async def open_box(db_path: Path) -> Outbox:
    box = await Outbox.open(f"sqlite:///{db_path}")
    try:
        await box.put_destination(DESTINATION, SPEC)
    except BaseException:
        await box.close()
        raise
    return box


async def library_single(db_path: Path, n: int) -> float:
    """Intents/s of sequential ``enqueue`` calls, one transaction each."""
    async with await open_box(db_path) as box:
        for i in range(WARMUP):
            check_created((await box.enqueue(**intent(i))).created, i)
        start = time.perf_counter()
        for i in range(WARMUP, WARMUP + n):
            check_created((await box.enqueue(**intent(i))).created, i)
        elapsed = time.perf_counter() - start
    expect_rows(db_path, "intents", WARMUP + n)
    return n / elapsed


async def library_batched(db_path: Path, n: int) -> float:
    """Intents/s of ``enqueue_many`` in batches of BATCH (input dicts built before timing)."""
    batches = [[intent(i) for i in range(lo, min(lo + BATCH, n))] for lo in range(0, n, BATCH)]
    async with await open_box(db_path) as box:
        for i in range(WARMUP):
            check_created((await box.enqueue(**intent(n + i))).created, n + i)
        start = time.perf_counter()
        for batch in batches:
            results = await box.enqueue_many(batch)
            if len(results) != len(batch) or not all(r.created for r in results):
                raise BenchError("enqueue_many did not create every intent of a fresh batch")
        elapsed = time.perf_counter() - start
    expect_rows(db_path, "intents", WARMUP + n)
    return n / elapsed


async def library_concurrent(db_path: Path, n: int) -> float:
    """Intents/s of TASKS tasks each calling ``enqueue`` in a loop (n in all)."""
    async with await open_box(db_path) as box:

        async def producer(first: int, stop: int) -> None:
            for i in range(first, stop):
                check_created((await box.enqueue(**intent(i))).created, i)

        await producer(0, WARMUP)
        shares = [n // TASKS + (1 if t < n % TASKS else 0) for t in range(TASKS)]
        bounds = [WARMUP + sum(shares[:t]) for t in range(TASKS + 1)]
        start = time.perf_counter()
        await asyncio.gather(*(producer(bounds[t], bounds[t + 1]) for t in range(TASKS)))
        elapsed = time.perf_counter() - start
    expect_rows(db_path, "intents", WARMUP + n)
    return n / elapsed


# -- case 5: over HTTP -------------------------------------------------------------------------


@dataclass
class Load:
    """What one target saw: timed successes, and failures (warm-up included) by kind."""

    requests: int  # sent in all, warm-up included
    per_request: int = 1  # intents each successful request carried
    ok: int = 0  # expected answers among the timed requests
    warm_ok: int = 0  # expected answers among the untimed warm-up requests
    seconds: float = 0.0  # wall time of the timed requests
    failures: Counter[str] = field(default_factory=Counter)
    samples: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.ok * self.per_request / self.seconds if self.seconds else 0.0

    @property
    def failed(self) -> int:
        return sum(self.failures.values())


@dataclass
class HttpFigures:
    intents: Load
    batches: Load
    healthz: Load
    ceiling: Load


def progress(stage: str, label: str, rate: float, unit: str) -> None:
    print(f"{stage + ':':<9} {label:<34} {rate:>9,.0f} {unit}", flush=True)


async def server_ready(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    """Wait until ``url`` answers 200, failing if the server exits first."""
    await harness.wait_ready(url, lambda: harness.check_alive(proc, log, "server"), log)


async def drive(
    url: str,
    n: int,
    *,
    expect: int,
    body: Callable[[int], bytes] | None = None,
    headers: dict[str, str] | None = None,
    warmup: int = 4 * CLIENTS,
    clients: int = CLIENTS,
    per_request: int = 1,
    check: Callable[[bytes], bool] | None = None,
) -> Load:
    """``n`` timed requests from ``clients`` workers on one session, after ``warmup`` untimed ones.

    Any answer but ``expect`` (or one ``check`` refuses) counts as a failure; the run goes on so
    that all are counted.
    """
    load = Load(requests=warmup + n, per_request=per_request)
    async with harness.client_session(clients) as session:

        async def one(i: int) -> bool:
            try:
                if body is None:
                    request = session.get(url, headers=headers)
                else:
                    request = session.post(url, data=body(i), headers=headers)
                async with request as response:
                    text = await response.read()
                    if response.status == expect and (check is None or check(text)):
                        return True
                    load.failures[f"HTTP {response.status}" if response.status != expect else "item refused"] += 1
                    detail = text[:300].decode(errors="replace")
            except (TimeoutError, aiohttp.ClientError) as exc:
                load.failures[type(exc).__name__] += 1
                detail = repr(exc)
            if len(load.samples) < 3 and detail not in load.samples:
                load.samples.append(detail)
            return False

        load.warm_ok, _ = await harness.fan_out(clients, 0, warmup, one)
        load.ok, load.seconds = await harness.fan_out(clients, warmup, warmup + n, one)
    return load


def outbox_command(port: int) -> list[str]:
    """``outbox serve`` on ``port``, at log level warning: no access-log line per request."""
    script = Path(sys.executable).parent / "outbox"
    prefix = [str(script)] if script.exists() else [sys.executable, "-m", "outbox.app.cli"]
    return [*prefix, "serve", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-worker"]


def intent_body(i: int) -> bytes:
    return json.dumps({"scope": SCOPE, "destination": DESTINATION, "payload": payload(i)}).encode()


def batch_bodies(batches: int) -> list[bytes]:
    """``batches`` batch bodies of BATCH fresh intents each, with their action ids, as the
    client sends them."""
    return [json.dumps({"intents": [{"action_id": f"b{b}-{i}", **intent(b * BATCH + i)} for i in range(BATCH)]},
                       separators=(",", ":")).encode() for b in range(batches)]


def all_created(text: bytes) -> bool:
    """Whether every item of a batch answer is a 201 (without parsing it on the load side)."""
    return text.count(b'{"status":201,"intent":') == BATCH


async def http_case(workdir: Path, n: int, n_batches: int) -> HttpFigures:
    """The service over HTTP, plus the client against a trivial server, for comparison."""
    post_headers = {"Content-Type": "application/json"}

    port = harness.free_port()
    log = workdir / "trivial.log"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--serve-trivial", str(port)]
    with harness.serving(cmd, env=harness.clean_env(), cwd=workdir, log=log) as proc:
        await server_ready(proc, f"http://127.0.0.1:{port}/healthz", log)
        ceiling = await drive(
            f"http://127.0.0.1:{port}/v1/intents", n, expect=201, body=intent_body, headers=post_headers
        )
    progress("HTTP", "trivial aiohttp server, POST", ceiling.rate, "req/s")

    db_path = workdir / "http.db"
    async with await open_box(db_path) as box:
        token, _ = await box.create_token(Role.ADMIN, label="bench")
    port = harness.free_port()
    log = workdir / "outbox.log"
    env = harness.clean_env(OUTBOX_DATABASE_URL=f"sqlite:///{db_path}")
    with harness.serving(outbox_command(port), env=env, cwd=workdir, log=log) as proc:
        base = f"http://127.0.0.1:{port}"
        await server_ready(proc, f"{base}/healthz", log)
        healthz = await drive(f"{base}/healthz", n, expect=200)
        progress("HTTP", "outbox serve, GET /healthz", healthz.rate, "req/s")
        auth = {**post_headers, "Authorization": f"Bearer {token}"}
        intents = await drive(f"{base}/v1/intents", n, expect=201, body=intent_body, headers=auth)
        progress("HTTP", "outbox serve, POST /v1/intents", intents.rate, "req/s")
        warm_batches = 2 * BATCH_CLIENTS
        bodies = batch_bodies(warm_batches + n_batches)
        batches = await drive(f"{base}/v1/intents:batch", n_batches, expect=200, body=bodies.__getitem__,
                              headers=auth, warmup=warm_batches, clients=BATCH_CLIENTS, per_request=BATCH,
                              check=all_created)
        progress("HTTP", f"outbox serve, POST /v1/intents:batch ({BATCH})", batches.rate, "/s")
        if proc.poll() is not None:
            raise BenchError(f"outbox serve died during the run:\n{harness.log_tail(log)}")
    expect_rows(db_path, "intents", intents.warm_ok + intents.ok + (batches.warm_ok + batches.ok) * BATCH)
    return HttpFigures(intents=intents, batches=batches, healthz=healthz, ceiling=ceiling)


def serve_trivial(port: int) -> None:
    """A server doing no work: parse the JSON body, answer 201 with a similar-sized body."""

    async def post(request: web.Request) -> web.Response:
        sent = await request.json()
        reply = {"action_id": secrets.token_hex(18), "status": "pending", "scope": sent["scope"],
                 "destination": sent["destination"], "payload": sent["payload"], "filler": "-" * 350}
        return web.json_response(reply, status=201)

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.add_routes([web.post("/v1/intents", post), web.get("/healthz", healthz)])
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


# -- running and reporting ---------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    key: str
    label: str
    unit: str
    n: int
    run: Callable[[Path, int], Awaitable[float]]
    target: str = ""
    met: Callable[[float, float], bool] | None = None  # (rate, ratio) -> whether the target is met


@dataclass
class Row:
    label: str
    rate: float
    unit: str
    ratios: list[float]
    target: str = ""
    met: bool | None = None
    note: str = ""


def render(rows: list[Row]) -> str:
    header = ("case", "rate", "unit", "vs raw", "spread", "target", "")
    lines = [header]
    for row in rows:
        median, spread = harness.fmt_ratio(row.ratios)
        verdict = "" if row.met is None else ("met" if row.met else "NOT MET")
        rate = f"{row.rate:,.0f}" if row.rate else "-"
        lines.append((row.label, rate, row.unit, median, spread, row.target, verdict + row.note))
    return harness.render_table(lines, right={1, 3})


def in_process_cases(n: int, n_batched: int) -> list[Case]:
    return [
        Case("raw", "raw aiosqlite insert loop", "rows/s", n, raw_insert_loop),
        Case("single", "library enqueue, sequential", "/s", n, library_single,
             ">= 0.5x", lambda rate, ratio: ratio >= 0.5),
        Case("batched", f"library enqueue_many ({BATCH}/batch)", "/s", n_batched, library_batched,
             ">= 20,000/s", lambda rate, ratio: rate >= 20_000),
        Case("concurrent", f"library enqueue, {TASKS} tasks", "/s", n, library_concurrent),
    ]


async def run_rounds(
    cases: list[Case], rounds: int, root: Path, problems: list[str]
) -> dict[str, list[float | None]]:
    """Every case once per round, each in a fresh directory; None marks an invalid run."""
    rates: dict[str, list[float | None]] = {case.key: [] for case in cases}
    for round_ in range(1, rounds + 1):
        for case in cases:
            workdir = harness.fresh_dir(root, case.key)
            try:
                rate: float | None = await case.run(workdir / "bench.db", case.n)
            except BenchError as exc:
                rate = None
                problems.append(f"{case.label}: {exc}")
                print(f"round {round_}:  {case.label:<34} FAILED: {exc}", flush=True)
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
            rates[case.key].append(rate)
            if rate is not None:
                progress(f"round {round_}", case.label, rate, case.unit)
    return rates


def case_rows(cases: list[Case], rates: dict[str, list[float | None]]) -> list[Row]:
    """A row per case: median rate, and the ratios of each round to that round's baseline."""
    baseline = rates["raw"]
    rows: list[Row] = []
    for case in cases:
        got = [rate for rate in rates[case.key] if rate is not None]
        if not got:
            rows.append(Row(case.label, 0.0, case.unit, [], case.target, None, "failed"))
            continue
        if case.key == "raw":
            ratios = [1.0]  # by definition; its spread shows in the per-round lines
        else:
            ratios = [r / b for r, b in zip(rates[case.key], baseline, strict=True) if r and b]
        rate = statistics.median(got)
        met = case.met(rate, statistics.median(ratios) if ratios else 0.0) if case.met else None
        rows.append(Row(case.label, rate, case.unit, ratios, case.target, met))
    return rows


def http_rows(http: HttpFigures, baseline: float, problems: list[str]) -> list[Row]:
    rows: list[Row] = []
    for label, load, unit, floor in (  # a floor is the target a row must meet; 0 for the comparisons
        (f"HTTP POST /v1/intents ({CLIENTS} clients)", http.intents, "req/s", 2_000),
        (f"HTTP POST /v1/intents:batch ({BATCH}/batch, {BATCH_CLIENTS} clients)", http.batches, "/s", 20_000),
        ("  same client, GET /healthz", http.healthz, "req/s", 0),
        ("  same client, trivial aiohttp server", http.ceiling, "req/s", 0),
    ):
        ratios = [load.rate / baseline] if baseline and floor else []
        target = f">= {floor:,}/s" if floor else ""
        met = load.rate >= floor if floor else None
        rows.append(Row(label, load.rate, unit, ratios, target, met))
        if load.failed:
            problems.append(f"{label.strip()}: {load.failed} of {load.requests} requests failed: "
                            f"{dict(load.failures)}; e.g. {load.samples}")
    return rows


async def run(args: argparse.Namespace) -> int:
    scale = 5 if args.quick else 1
    n, n_batched, n_http, n_http_batched = (max(1, value // scale) for value in (
        args.n, args.batched_n, args.http_n, args.http_batched_n))
    n_batches = max(1, n_http_batched // BATCH)
    cases = in_process_cases(n, n_batched)
    rounds = f"{args.rounds} round{'s' if args.rounds > 1 else ''}"
    problems: list[str] = []
    began = time.perf_counter()
    print(f"enqueue benchmark (N={n:,} sequential and concurrent, {n_batched:,} batched, "
          f"{n_http:,} HTTP, {n_batches * BATCH:,} HTTP batched; {rounds}; WAL, synchronous=FULL)")
    print(f"{harness.machine_summary()}, files under {args.dir or tempfile.gettempdir()}\n", flush=True)

    http: HttpFigures | None = None
    with tempfile.TemporaryDirectory(prefix="bench-enqueue-", dir=args.dir) as tmp:
        root = Path(tmp)
        rates = await run_rounds(cases, args.rounds, root, problems)
        if not args.no_http:
            print(f"HTTP: {CLIENTS} clients, {n_http:,} requests per target ...", flush=True)
            try:
                http = await http_case(harness.fresh_dir(root, "http"), n_http, n_batches)
            except BenchError as exc:
                problems.append(f"HTTP: {exc}")

    rows = case_rows(cases, rates)
    if http is not None:
        measured = [rate for rate in rates["raw"] if rate is not None]
        rows += http_rows(http, statistics.median(measured) if measured else 0.0, problems)
    elif not args.no_http:
        label = f"HTTP POST /v1/intents ({CLIENTS} clients)"
        rows.append(Row(label, 0.0, "req/s", [], ">= 2,000/s", None, "failed"))

    print(f"\nenqueue benchmark (N={n:,}, synchronous=FULL; median of {rounds}, "
          "ratios per round against the raw loop)")
    print(render(rows))
    if http is not None:
        loads = (http.intents, http.batches, http.healthz, http.ceiling)
        print(f"HTTP failures: {sum(load.failed for load in loads)} of "
              f"{sum(load.requests for load in loads):,} requests (warm-up included)")
        if http.intents.rate:
            headroom = http.ceiling.rate / http.intents.rate
            print(f"load generator headroom: against the trivial server the same client ran "
                  f"{headroom:.1f}x the POST rate")
    return harness.finish(began, problems)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = harness.new_parser(__doc__)
    add = parser.add_argument
    add("--n", type=int, default=5_000, help="intents per sequential and concurrent case (5,000)")
    add("--batched-n", type=int, default=50_000, help="intents in the batched case (50,000)")
    add("--http-n", type=int, default=10_000, help="requests per HTTP target (10,000)")
    add("--http-batched-n", type=int, default=100_000,
        help=f"intents through POST /v1/intents:batch, {BATCH} a request (100,000)")
    add("--rounds", type=int, default=3, help="interleaved rounds of cases 1-4 (3)")
    add("--quick", action="store_true", help="divide every N by 5: seconds rather than a minute")
    add("--no-http", action="store_true", help="skip the HTTP case")
    add("--dir", help="where the databases go (the fsync cost depends on the filesystem)")
    add("--serve-trivial", type=int, metavar="PORT", help=argparse.SUPPRESS)  # the comparison server
    args = parser.parse_args(argv)
    if min(args.n, args.batched_n, args.http_n, args.http_batched_n, args.rounds) < 1:
        parser.error("--n, --batched-n, --http-n, --http-batched-n and --rounds must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve_trivial is not None:
        serve_trivial(args.serve_trivial)
        return 0
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
