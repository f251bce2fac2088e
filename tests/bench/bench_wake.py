"""How soon the service's worker sees an intent an application committed on its own connection,
against an intent enqueued through the service's own API, in the same run; and what the SQLite
store's watch of its file (``PRAGMA data_version`` every WATCH_SECONDS) costs, idle and under load.

1. Latency. ``outbox serve`` (the API and its worker, in a subprocess) delivers to a receiver in
   this process, which notes when each request arrives. Samples alternate between an intent
   the application commits on its own connection (sqlite3 or psycopg 3, ``Producer.enqueue``
   beside a row of its own; timed from the commit's return) and one enqueued by ``POST
   /v1/intents`` (timed from its answer: the service wakes its worker in the process at once),
   each after an idle pause of random length, so a sample starts anywhere in the watch's period.
   The worker hears of the first through the store: SQLite's watch, PostgreSQL's ``NOTIFY``.
   Reported per store: the medians (and 90th percentiles) of commit-to-request, and their ratio.
2. The watch (SQLite). ``outbox worker`` with WATCH_SECONDS set to each of WATCHES and with the
   watch off (the worker then finds the application's intents by polling, every poll_seconds):
   its CPU over IDLE_SECONDS with nothing to do, the median commit-to-request of idle samples,
   and its CPU per delivery while an application thread commits RATE intents a second.

Nothing here asserts on timing; the exit status is non-zero only when a measurement is invalid
(a request that never came, a service that died).

    python tests/bench/bench_wake.py [--samples N] [--rounds R] [--quick] [--no-postgres] [--skip-watch]
"""

from __future__ import annotations

import asyncio
import functools
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
import httpx
from aiohttp import web
from bench_postgres import ADMIN_DSN, fresh_database
from harness import BenchError

from outbox import DestinationSpec, Outbox, Producer, Role, Settings
from outbox.grants import GrantSpec

SCOPE = "acme"
DESTINATION = "hook"
SECRET = "whsec_" + "A" * 44
#: The watch's periods compared (seconds); None: no watch.
WATCHES: tuple[float | None, ...] = (None, 0.01, 0.025, 0.05, 0.1)
IDLE_SECONDS = 10.0
#: How long a worker is left after its start before its idle CPU is measured.
SETTLE_SECONDS = 3.0
#: Intents a second the application commits while the worker's CPU per delivery is measured.
RATE = 100
LOAD_SECONDS = 5.0
#: The pause before each latency sample: long enough that the worker is idle again.
PAUSE = (0.1, 0.3)
ARRIVAL_TIMEOUT = 10.0
APP_TABLE = "CREATE TABLE orders (id TEXT PRIMARY KEY, note TEXT NOT NULL)"


# -- the receiver: on its own thread, noting when each key first arrives ----------------------


class Receiver:
    """An aiohttp receiver on its own thread and event loop that answers 200 and notes the time
    (``time.monotonic``) each idempotency key first arrives."""

    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        self._cond = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self.port = harness.free_port()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True, name="receiver")

    @property
    def hook(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def _handle(self, request: web.Request) -> web.Response:
        await request.read()
        at = time.monotonic()
        with self._cond:
            self.arrived.setdefault(request.headers["Idempotency-Key"], at)
            self._cond.notify_all()
        return web.Response(status=200)

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def __enter__(self) -> Receiver:
        self._thread.start()
        if not self._ready.wait(10):
            raise BenchError("the receiver did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def wait(self, key: str, timeout: float = ARRIVAL_TIMEOUT) -> float:
        """When ``key`` arrived; BenchError if it has not within ``timeout``."""
        with self._cond:
            if not self._cond.wait_for(lambda: key in self.arrived, timeout):
                raise BenchError(f"{key} did not arrive within {timeout:.0f} s")
            return self.arrived[key]

    def count(self, keys: list[str]) -> int:
        with self._cond:
            return sum(key in self.arrived for key in keys)


# -- the store and the application's connection -----------------------------------------------


@dataclass
class Store:
    """A fresh outbox database (its URL) with the receiver's destination, a grant and the
    application's table; ``connect`` opens the application's own connection to it."""

    dialect: str
    url: str
    token: str = ""

    def connect(self) -> Any:
        if self.dialect == "sqlite":
            return sqlite3.connect(self.url.removeprefix("sqlite:///"), timeout=30, isolation_level="IMMEDIATE",
                                   check_same_thread=False)  # (used from a worker thread)
        import psycopg

        return psycopg.connect(self.url)

    def env(self) -> dict[str, str]:
        return harness.clean_env(OUTBOX_DATABASE_URL=self.url)


async def prepare(store: Store, receiver: Receiver) -> None:
    settings = (Settings(database_url=store.url, secrets_key_file=harness.key_file()) if store.dialect == "postgres"
                else None)  # (on SQLite the key is the one beside the file, made on first start)
    async with await Outbox.open(store.url, settings=settings) as box:
        await box.put_destination(DESTINATION, DestinationSpec(url=receiver.hook, secret=SECRET,
                                                               allow_private_network=True))
        await box.put_grant("acme-hook", GrantSpec(scope=SCOPE, destination=DESTINATION))
        store.token, _ = await box.create_token(Role.PRODUCER, [SCOPE])
    conn = store.connect()
    try:
        conn.execute(APP_TABLE)
        conn.commit()
    finally:
        conn.close()


def commit_one(conn: Any, producer: Producer, order: str) -> float:
    """The application's transaction: its row and the intent; when its commit returned."""
    conn.execute("INSERT INTO orders (id, note) VALUES (%s, %s)" if not isinstance(conn, sqlite3.Connection)
                 else "INSERT INTO orders (id, note) VALUES (?, ?)", (order, "x" * 100))
    producer.enqueue(conn, destination=DESTINATION, scope=SCOPE, action_id=order, payload={"order": order})
    conn.commit()
    return time.monotonic()


def post_one(client: httpx.Client, base: str, token: str, order: str) -> float:
    """``POST /v1/intents``; when its answer came."""
    answer = client.post(f"{base}/v1/intents", headers={"Authorization": f"Bearer {token}"},
                         json={"destination": DESTINATION, "scope": SCOPE, "action_id": order,
                               "payload": {"order": order}})
    if answer.status_code != 201:
        raise BenchError(f"POST /v1/intents answered {answer.status_code}: {answer.text}")
    return time.monotonic()


# -- the service -------------------------------------------------------------------------------


@contextmanager
def service(store: Store, workdir: Path, *args: str, watch: float | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """``outbox ARGS`` in a subprocess (``serve`` answering /readyz first); with ``watch`` set
    (a worker on SQLite), the store's WATCH_SECONDS is that (0: no watch at all)."""
    log = workdir / f"{args[0]}-{time.monotonic_ns()}.log"
    if watch is None:
        cmd = [str(Path(sys.executable).parent / "outbox"), *args]
    else:
        cmd = [sys.executable, "-c", (
            "import sys, outbox.store.sqlite.store as s\n"
            f"s.WATCH_SECONDS = {watch or 86400.0!r}\n"
            "from outbox.app.cli import main\n"
            f"sys.argv = ['outbox', *{list(args)!r}]\n"
            "main()\n")]
    with harness.serving(cmd, cwd=workdir, log=log, env=store.env()) as proc:
        if args[0] == "serve":
            base = f"http://127.0.0.1:{args[args.index('--port') + 1]}"
            deadline = time.monotonic() + harness.SERVER_START_SECONDS
            while True:
                harness.check_alive(proc, log, "outbox serve")
                try:
                    if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise BenchError(f"outbox serve was not ready:\n{harness.log_tail(log)}")
                time.sleep(0.05)
        else:
            time.sleep(1.0)  # (its first claim; an intent committed before it would be found by it, not woken for)
            harness.check_alive(proc, log, "outbox worker")
        yield proc
        harness.check_alive(proc, log, args[0])


# -- measurements ------------------------------------------------------------------------------


@dataclass
class Latencies:
    """Commit-to-request samples in milliseconds, by path."""

    by_path: dict[str, list[float]] = field(default_factory=dict)

    def add(self, path: str, ms: float) -> None:
        self.by_path.setdefault(path, []).append(ms)


def latency_samples(store: Store, receiver: Receiver, samples: int, tag: str, paths: dict[str, Callable[[str], float]],
                    into: Latencies) -> None:
    """``samples`` of each path, alternating, each after an idle pause of random length."""
    for n in range(samples):
        order = list(paths.items()) if n % 2 == 0 else list(reversed(paths.items()))
        for path, enqueue in order:
            time.sleep(random.uniform(*PAUSE))
            key = f"{tag}-{path}-{n}"
            committed = enqueue(key)
            into.add(path, (receiver.wait(f"{SCOPE}/{key}") - committed) * 1000)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def latency_case(dialect: str, root: Path, receiver: Receiver, samples: int, rounds: int,
                       pg: str) -> Latencies:
    """Part 1 on one store: app's own connection against the API, ``rounds`` fresh databases."""
    found = Latencies()
    producer = Producer()
    for round_no in range(rounds):
        workdir = harness.fresh_dir(root, f"wake-{dialect}")
        async with (fresh_database(pg) if dialect == "postgres" else _sqlite(workdir)) as url:
            store = Store(dialect, url)
            await prepare(store, receiver)
            port = harness.free_port()
            with service(store, workdir, "serve", "--port", str(port)):
                conn = store.connect()
                try:
                    with httpx.Client(timeout=10) as client:
                        base = f"http://127.0.0.1:{port}"
                        paths = {"app": functools.partial(commit_one, conn, producer),
                                 "api": functools.partial(post_one, client, base, store.token)}
                        await asyncio.to_thread(latency_samples, store, receiver, samples, f"{dialect}{round_no}",
                                                paths, found)
                finally:
                    conn.close()
        print(f"{dialect} latency round {round_no + 1}/{rounds} done", file=sys.stderr)
    return found


@dataclass
class WatchFigures:
    """Part 2 for one watch period, over rounds."""

    idle_cpu_ms_per_s: list[float] = field(default_factory=list)
    idle_latency_ms: list[float] = field(default_factory=list)
    load_latency_ms: list[float] = field(default_factory=list)
    load_cpu_us_per_delivery: list[float] = field(default_factory=list)


def load(store: Store, receiver: Receiver, tag: str) -> tuple[list[str], list[float]]:
    """RATE commits a second for LOAD_SECONDS from one application thread; the keys and the
    commit-to-request of each (once all arrived)."""
    producer = Producer()
    conn = store.connect()
    committed: dict[str, float] = {}
    try:
        began = time.monotonic()
        for n in range(int(RATE * LOAD_SECONDS)):
            time.sleep(max(0.0, began + n / RATE - time.monotonic()))
            key = f"{tag}-{n}"
            committed[f"{SCOPE}/{key}"] = commit_one(conn, producer, key)
    finally:
        conn.close()
    return list(committed), [(receiver.wait(key) - at) * 1000 for key, at in committed.items()]


async def watch_case(root: Path, receiver: Receiver, samples: int, watch: float | None, round_no: int,
                     figures: WatchFigures) -> None:
    workdir = harness.fresh_dir(root, "watch")
    async with _sqlite(workdir) as url:
        store = Store("sqlite", url)
        await prepare(store, receiver)
        with service(store, workdir, "worker", watch=watch or 0.0) as proc:
            await asyncio.sleep(SETTLE_SECONDS)  # (its start: imports, migrations, a first claim)
            before = harness.process_cpu(proc.pid)
            await asyncio.sleep(IDLE_SECONDS)
            after = harness.process_cpu(proc.pid)
            if before is not None and after is not None:
                figures.idle_cpu_ms_per_s.append((after - before) / IDLE_SECONDS * 1000)
            producer = Producer()
            conn = store.connect()
            try:
                latencies = Latencies()
                await asyncio.to_thread(latency_samples, store, receiver, samples, f"w{watch}-{round_no}",
                                        {"app": functools.partial(commit_one, conn, producer)}, latencies)
                figures.idle_latency_ms.extend(latencies.by_path["app"])
            finally:
                conn.close()
            before = harness.process_cpu(proc.pid)
            keys, loaded = await asyncio.to_thread(load, store, receiver, f"l{watch}-{round_no}")
            after = harness.process_cpu(proc.pid)
            figures.load_latency_ms.extend(loaded)
            if before is not None and after is not None:
                figures.load_cpu_us_per_delivery.append((after - before) / len(keys) * 1e6)


class _sqlite:
    """A fresh SQLite URL in ``directory`` (the PostgreSQL side's ``fresh_database``)."""

    def __init__(self, directory: Path) -> None:
        self.url = f"sqlite:///{directory / 'outbox.db'}"

    async def __aenter__(self) -> str:
        return self.url

    async def __aexit__(self, *exc: object) -> None:
        return None


def ms(value: float) -> str:
    return f"{value:,.1f} ms"


async def main() -> int:
    parser = harness.new_parser(__doc__)
    parser.add_argument("--samples", type=int, default=40, help="latency samples per path per round (40)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (3)")
    parser.add_argument("--quick", action="store_true", help="--samples 10 --rounds 1, a shorter idle")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    parser.add_argument("--skip-watch", action="store_true", help="skip part 2 (the watch's periods)")
    parser.add_argument("--pg", default=ADMIN_DSN, help=f"the server's administrative DSN ({ADMIN_DSN})")
    args = parser.parse_args()
    harness.require_positive(parser, args, ["samples", "rounds"])
    global IDLE_SECONDS, LOAD_SECONDS
    samples, rounds = (10, 1) if args.quick else (args.samples, args.rounds)
    if args.quick:
        IDLE_SECONDS, LOAD_SECONDS = 3.0, 2.0
    began = time.perf_counter()
    problems: list[str] = []
    print(f"bench_wake: {samples} samples a path a round, {rounds} rounds")
    print(harness.machine_summary())
    root = Path(tempfile.mkdtemp(prefix="bench-wake-"))
    try:
        with Receiver() as receiver:
            lines = [["store", "app's connection", "p90", "API (in process)", "p90", "ratio"]]
            for dialect in ("sqlite",) if args.no_postgres else ("sqlite", "postgres"):
                try:
                    found = await latency_case(dialect, root, receiver, samples, rounds, args.pg)
                except BenchError as exc:
                    problems.append(f"{dialect}: {exc}")
                    continue
                app, api = found.by_path["app"], found.by_path["api"]
                lines.append([dialect, ms(statistics.median(app)), ms(pct(app, 0.9)), ms(statistics.median(api)),
                              ms(pct(api, 0.9)), f"{statistics.median(app) / statistics.median(api):.2f}x"])
            print("commit to the first request at the receiver (medians):")
            print(harness.render_table(lines, right={1, 2, 3, 4, 5}))
            if not args.skip_watch:
                figures = {watch: WatchFigures() for watch in WATCHES}
                for round_no in range(rounds):
                    for watch in WATCHES if round_no % 2 == 0 else tuple(reversed(WATCHES)):
                        try:
                            await watch_case(root, receiver, samples, watch, round_no, figures[watch])
                        except BenchError as exc:
                            problems.append(f"watch {watch}: {exc}")
                    print(f"watch round {round_no + 1}/{rounds} done", file=sys.stderr)
                lines = [["WATCH_SECONDS", "idle CPU", "idle: commit to request", "p90",
                          f"at {RATE}/s: commit to request", "p90", "CPU per delivery"]]
                for watch, f in figures.items():
                    if not f.idle_latency_ms:
                        continue
                    lines.append([
                        "off (polling)" if watch is None else f"{watch:g}",
                        f"{statistics.median(f.idle_cpu_ms_per_s):.1f} ms/s" if f.idle_cpu_ms_per_s else "",
                        ms(statistics.median(f.idle_latency_ms)), ms(pct(f.idle_latency_ms, 0.9)),
                        ms(statistics.median(f.load_latency_ms)), ms(pct(f.load_latency_ms, 0.9)),
                        f"{statistics.median(f.load_cpu_us_per_delivery):,.0f} µs"
                        if f.load_cpu_us_per_delivery else ""])
                print("the SQLite watch (outbox worker; CPU of the worker process):")
                print(harness.render_table(lines, right={1, 2, 3, 4, 5, 6}))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return harness.finish(began, problems)


if __name__ == "__main__":
    sys.exit(harness.run_main(main(), uvloop=False))
