"""The outbox on PostgreSQL: delivery throughput against a bare HTTP client loop and against pgqueuer.

With PostgreSQL the outbox's workers may run as several processes on one database, and a
PostgreSQL job queue (pgqueuer) is what a team would otherwise reach for, so this script
measures, in one run and against one receiver, how fast ``outbox worker`` drains a backlog with
one process and with two, and how fast pgqueuer drains the same backlog doing the same job.
Absolute rates say more about the machine than the library, so every drain rate is also given
as a ratio to a bare aiohttp client loop measured in the same round:

1. a receiver in its own process (bench_delivery's: uvicorn, uvloop, httptools, 200 to every
   POST, counting them per path; each case of each round POSTs to a path of its own, so the
   receiver's count for it must be exactly N);
2. baseline: bench_delivery's bare aiohttp client, CONCURRENCY requests in flight, N POSTs;
3. the outbox: a fresh database per case and round (``CREATE DATABASE``, dropped at the end),
   migrated, one webhook destination, N intents enqueued with ``enqueue_many`` (untimed); then
   ``outbox worker`` subprocesses (``OUTBOX_DATABASE_URL``, ``authority=allow-all``,
   ``worker_concurrency=CONCURRENCY``, every write of the full bookkeeping: the claim, the
   attempt started, the outcome), one process and then two. Process start-up is not timed: the
   benchmark holds ``LOCK TABLE intents IN EXCLUSIVE MODE`` until every worker's first claim
   waits on it (``pg_stat_activity``), then lets go, and the drain is timed from that moment to
   the last delivery recorded (its ``updated_at``); the database is polled for the delivered
   count. Afterwards the store must hold exactly N delivered intents and N attempts;
4. pgqueuer doing the same job: ``pgqueuer_job.py`` beside this file, run with the Python of a
   virtualenv of the benchmark's own (made once with ``python -m venv`` and ``pip install
   pgqueuer aiohttp asyncpg`` under ~/.cache/outbox-bench; pgqueuer is no dependency of the
   project). Its schema is installed and N jobs enqueued (untimed), then one consumer process
   (``max_concurrent_tasks=CONCURRENCY``, aiohttp with CONCURRENCY connections, on uvloop as
   ``pgq run`` runs it) POSTs each payload and finishes a job only on a 2xx; held and released
   by a table lock as above, timed to the last ``successful`` row of its log. Once with its
   default ``batch_size=10``, once with ``batch_size=32``.

The cases run in interleaved rounds (their order rotating), each ratio is that of one round, and
the figures are medians. The targets: the outbox at least as fast as pgqueuer's best rate of the
same round, and two worker processes at least 1.1 times as fast as one; per delivery, PostgreSQL
CPU at most twice pgqueuer's best case's, at most 0.1 write transactions, fewer intents row
versions than the 3.0 of the design before set-based moves, and the HOT share of each table said. Beside the rates, per
delivery: CPU time of the worker process(es) and of PostgreSQL's processes (every ``postgres``
process's user and system time from /proc, with the children the postmaster reaped), the
server's write transactions (transaction ids used) and WAL bytes; the outbox's updates of
intents rows and how many were HOT; each worker process's peak RSS (VmHWM). The server-wide
figures count whatever another client does meanwhile, so a drain during which another
database's connections were active says so.

Then, on PostgreSQL, as in bench_enqueue.py and bench_delivery.py for SQLite:

5. enqueue rates: ``Outbox.enqueue`` one at a time (one intent per transaction) and
   ``enqueue_many`` in batches of 500, each as a ratio to a bare asyncpg loop inserting one row
   per transaction into a plain table of the same database;
6. ``store.claim(limit=CONCURRENCY)`` latency with 10,000 and with 1,000,000 pending intents
   (the million are copies of enqueued ones, inserted with ``generate_series``, then ``VACUUM
   ANALYZE`` as autovacuum would), plus the claim statement alone in a rolled-back
   transaction, which leaves out the commit's WAL flush;
7. the store alone, as a pipelined worker calls it: N intents driven through their bookkeeping
   by ``store.apply`` on one connection, each cycle one call with the starts of the batch claimed
   the cycle before, the outcomes of the batch started the cycle before and a claim of
   ``--store-batch`` more, nothing sent: PostgreSQL CPU, statements sent, write transactions, WAL
   bytes and row versions per delivery (``--store-only`` runs this alone).

Targets are printed beside the figures; nothing here asserts on timing. The exit status is
non-zero only when a measurement is invalid (an undelivered intent, a wrong count at the
receiver or in the store, a failed request, a dead process).

    python tests/bench/bench_postgres.py [--n N] [--rounds R] [--concurrency C] [--big-n M] [--quick]
                                         [--store-only] [--store-batch B]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import bench_delivery
import harness
from bench_delivery import (
    BATCH,
    CLAIM_CHUNK,
    CLAIMS,
    DESTINATION,
    NOTE,
    POLL_SECONDS,
    SECRET,
    SMALL_PENDING,
    Receiver,
    Row,
    claim_rows,
    fill,
    intent,
    mib,
    progress,
    render,
    running_receiver,
)
from harness import BenchError

#: An administrative connection to the server the databases are made on (as the tests').
ADMIN_DSN = os.environ.get("OUTBOX_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
#: Every database this script makes is named so, then the Unix time it was made.
PREFIX = "outbox_bench_"
#: A benchmark database older than this was left behind by a killed run, and is dropped.
STALE_SECONDS = 3 * 3600
PGQUEUER_VENV = Path.home() / ".cache" / "outbox-bench" / "pgqueuer-venv"
PGQUEUER_PACKAGES = ("pgqueuer", "aiohttp", "asyncpg")
PGQUEUER_JOB = Path(__file__).resolve().with_name("pgqueuer_job.py")
PIP_TIMEOUT_SECONDS = 900.0
SETUP_TIMEOUT_SECONDS = 300.0
#: How long worker processes may take to start and reach their first claim.
START_SECONDS = 60.0
DRAIN_TIMEOUT_SECONDS = 600.0
#: Untimed operations before each timed enqueue loop.
ENQUEUE_WARMUP = 20
ENQUEUE_BATCH = 500
#: What "a second worker adds throughput" asks of two processes against one: a gain beyond the
#: few per cent that rounds differ by anyway.
SECOND_WORKER_GAIN = 1.10
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


# -- databases, processes and CPU --------------------------------------------------------------


def with_database(dsn: str, name: str, application: str | None = None) -> str:
    """``dsn`` naming database ``name`` instead (asyncpg passes ``application_name`` on)."""
    parts = urlsplit(dsn)._replace(path="/" + name)
    return urlunsplit(parts._replace(query=f"application_name={application}" if application else ""))


async def drop_stale_databases(admin_dsn: str) -> None:
    """Drop the databases a killed run of this script left behind (older than STALE_SECONDS)."""
    admin = await asyncpg.connect(admin_dsn)
    try:
        for (name,) in await admin.fetch("SELECT datname FROM pg_database WHERE starts_with(datname, $1)", PREFIX):
            made = re.fullmatch(re.escape(PREFIX) + r"(\d+)_[0-9a-f]+", name)
            if made and time.time() - int(made.group(1)) > STALE_SECONDS:
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@asynccontextmanager
async def fresh_database(admin_dsn: str) -> AsyncIterator[str]:
    """A new empty database (its DSN), dropped when the block ends, whoever is connected."""
    name = f"{PREFIX}{int(time.time())}_{secrets.token_hex(6)}"
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    finally:
        await admin.close()
    try:
        yield with_database(admin_dsn, name)
    finally:
        admin = await asyncpg.connect(admin_dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


def postgres_cpu() -> float | None:
    """CPU seconds, user and system, of every process named ``postgres`` (the postmaster, its
    backends and background processes), with those of its children that have exited (the
    postmaster's cutime and cstime: an autovacuum worker or a closed connection's backend that
    ends during a measurement still counts); None where /proc cannot tell."""
    total, found = 0, False
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if Path(entry.path, "comm").read_text().strip() != "postgres":
                continue
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
        found = True
    return total / CLOCK_TICKS if found else None


def vm_hwm_kib(pid: int) -> int | None:
    """A running process's peak resident set (VmHWM), in KiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def worker_command() -> list[str]:
    """``outbox worker``, as installed beside this Python."""
    script = Path(sys.executable).parent / "outbox"
    prefix = [str(script)] if script.exists() else [sys.executable, "-m", "outbox.app.cli"]
    return [*prefix, "worker"]


def log_counts(logs: list[Path]) -> Counter[str]:
    """Warning and error lines of the workers' logs, by their first words."""
    counts: Counter[str] = Counter()
    for log in logs:
        try:
            lines = log.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if line.startswith(("WARNING", "ERROR", "CRITICAL")):
                counts[" ".join(line.split(":", 1)[-1].split()[:4])] += 1
    return counts


# -- one timed drain, whoever does it ----------------------------------------------------------


@dataclass
class Drain:
    """A backlog of n drained by worker processes, timed from the lock's release."""

    n: int
    seconds: float  # release to the last delivery recorded
    observed_seconds: float  # release to the poll that saw the last one
    worker_cpu: float  # CPU seconds of the worker processes, all together
    postgres_cpu: float | None
    receiver_cpu: float | None
    peak_rss_kib: list[int]  # each worker process's VmHWM at the end
    transactions: int  # write transactions (transaction ids) on the server, release to stop
    wal_bytes: float  # WAL written on the server, the same span
    others_busy: int  # most client connections of other databases seen active at once
    warnings: Counter[str] = field(default_factory=Counter)
    claims: int | None = None  # the outbox's claim statements (from its "leased" events)
    updates: tuple[int, int] | None = None  # the outbox's updates of intents rows, and how many were HOT
    attempt_updates: tuple[int, int] | None = None  # the same of attempts rows

    @property
    def rate(self) -> float:
        return self.n / self.seconds

    def per_delivery_us(self, seconds: float | None) -> float | None:
        return None if seconds is None else seconds / self.n * 1e6


@dataclass
class Gate:
    """What a drain needs to know about the table its workers claim from."""

    table: str  # locked until every worker waits on it
    done_sql: str  # how many are delivered
    failed_sql: str  # how many can no longer be (any at all makes the run invalid)
    last_sql: str  # Unix time of the last delivery recorded


OUTBOX_GATE = Gate(
    "intents",
    "SELECT count(*) FROM intents WHERE status = 'delivered'",
    "SELECT count(*) FROM intents WHERE status NOT IN ('pending', 'leased', 'delivered')",
    "SELECT extract(epoch FROM max(updated_at))::float8 FROM intents WHERE status = 'delivered'",
)
PGQUEUER_GATE = Gate(
    "pgqueuer",
    "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'",
    "SELECT count(*) FROM pgqueuer_log WHERE status NOT IN ('queued', 'picked', 'successful')",
    "SELECT extract(epoch FROM max(created))::float8 FROM pgqueuer_log WHERE status = 'successful'",
)


#: The next transaction id, and where the WAL is: write transactions and WAL bytes since, on the
#: whole server (what another client writes meanwhile counts too; ``busy`` says if one was active).
SERVER_MARK = "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint, pg_current_wal_lsn()::text"
SERVER_SINCE = ("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint - $1::bigint, "
                "pg_wal_lsn_diff(pg_current_wal_lsn(), $2::text::pg_lsn)::float8")
#: Client connections of other databases in the middle of a statement.
OTHERS_BUSY = ("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
               "AND datname <> current_database() AND state = 'active'")


async def drain(dsn: str, gate: Gate, commands: list[tuple[list[str], dict[str, str], str]], workdir: Path,
                receiver: Receiver, n: int) -> Drain:
    """Start the worker processes (command, environment, application_name each) with the gate's
    table locked, release it once each one waits on the lock, and time them until the database
    says n are delivered; then stop them."""
    locker = await asyncpg.connect(dsn)
    watch = await asyncpg.connect(dsn)
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    names = [name for _, _, name in commands]
    busy = 0
    try:
        hold = locker.transaction()
        await hold.start()
        await locker.execute(f"LOCK TABLE {gate.table} IN EXCLUSIVE MODE")
        for i, (cmd, env, _) in enumerate(commands):
            log = workdir / f"worker-{i + 1}.log"
            procs.append((harness.spawn(cmd, cwd=workdir, log=log, env=env), log))

        def alive() -> None:
            for i, (proc, log) in enumerate(procs):
                harness.check_alive(proc, log, f"worker process {i + 1}")

        deadline = time.monotonic() + START_SECONDS
        while True:  # every process's first claim waits on the lock: start-up is over
            alive()
            waiting = await watch.fetchval(
                "SELECT count(DISTINCT application_name) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND application_name = ANY($1::text[])", names)
            if waiting == len(commands):
                break
            if time.monotonic() > deadline:
                raise BenchError(f"{len(commands) - waiting} worker process(es) did not reach their first claim in "
                                 f"{START_SECONDS:.0f} s:\n{harness.log_tail(procs[0][1])}")
            await asyncio.sleep(0.05)

        mark = await watch.fetchrow(SERVER_MARK)
        cpu_before = [harness.process_cpu(proc.pid) or 0.0 for proc, _ in procs]
        pg_before = postgres_cpu()
        receiver_before = harness.process_cpu(receiver.proc.pid)
        released = time.time()
        began = time.perf_counter()
        await hold.commit()
        deadline = began + DRAIN_TIMEOUT_SECONDS
        poll = f"SELECT ({gate.done_sql}), ({gate.failed_sql}), ({OTHERS_BUSY})"
        while True:
            await asyncio.sleep(POLL_SECONDS / 2)
            alive()
            done, failed, others = await watch.fetchrow(poll)
            busy = max(busy, others)
            if done >= n:
                observed = time.perf_counter() - began
                break
            if failed:
                raise BenchError(f"{failed} of {n} can no longer be delivered:\n{harness.log_tail(procs[0][1])}")
            if time.perf_counter() > deadline:
                raise BenchError(f"only {done} of {n} delivered in {DRAIN_TIMEOUT_SECONDS:.0f} s")
            receiver.alive()
        cpu_after = [harness.process_cpu(proc.pid) or 0.0 for proc, _ in procs]
        pg_after = postgres_cpu()
        receiver_after = harness.process_cpu(receiver.proc.pid)
        rss = [vm_hwm_kib(proc.pid) or 0 for proc, _ in procs]
        last = await watch.fetchval(gate.last_sql)
        for proc, _ in procs:
            harness.stop_process(proc)  # a worker may still write (a batch of outcomes, its log) while it stops
        ours = [locker.get_server_pid(), watch.get_server_pid()]
        deadline = time.monotonic() + harness.SERVER_STOP_SECONDS
        while time.monotonic() < deadline and await watch.fetchval(  # their backends' statistics are in once gone
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> ALL($1::int[])",
                ours):
            await asyncio.sleep(0.02)
        transactions, wal = await watch.fetchrow(SERVER_SINCE, *mark)
    finally:
        for proc, _ in procs:
            harness.stop_process(proc)
        await locker.close()
        await watch.close()
    if done > n:
        raise BenchError(f"{done} delivered, expected {n}")
    return Drain(
        n, last - released, observed, sum(cpu_after) - sum(cpu_before),
        None if pg_before is None or pg_after is None else pg_after - pg_before,
        None if receiver_before is None or receiver_after is None else receiver_after - receiver_before,
        rss, transactions, wal, busy, log_counts([log for _, log in procs]),
    )


async def check_received(receiver: Receiver, path: str, n: int) -> None:
    got = (await receiver.counts())[path]
    if got != n:
        raise BenchError(f"the receiver counted {got} requests at {path}, expected exactly {n}")


# -- the outbox ----------------------------------------------------------------------------------


#: Updates of the outbox's intents and attempts rows, and how many of each were HOT.
ROW_UPDATES = ("SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
               "WHERE relname IN ('intents', 'attempts')")


#: Whether the attempts keep their events (migration 0019), "leased" facts among them.
ATTEMPTS_KEEP_EVENTS = ("SELECT EXISTS (SELECT 1 FROM information_schema.columns "
                        "WHERE table_name = 'attempts' AND column_name = 'events')")
#: The claims made (a claim's leases share its owner and time), from the "leased" facts wherever they are kept.
CLAIMS_MADE = ("SELECT count(DISTINCT (actor, at)) FROM ("
               "SELECT actor, at FROM events WHERE kind = 'leased' UNION ALL "
               "SELECT e ->> 2, (e ->> 1)::timestamptz FROM attempts, jsonb_array_elements(attempts.events) AS g, "
               "jsonb_array_elements(g -> 1) AS e WHERE e ->> 0 = 'leased') AS leases")


async def row_updates(conn: asyncpg.Connection) -> tuple[tuple[int, int], tuple[int, int]]:
    """(updates, HOT updates) of intents rows, then of attempts rows, as the server counted them
    (a backend's counts are in once its transaction ends and it reports, or it has ended)."""
    found = {name: (updated, hot) for name, updated, hot in await conn.fetch(ROW_UPDATES)}
    return found["intents"], found["attempts"]


def hot_share(updates: tuple[int, int] | None) -> str:
    return "-" if not updates else "0 updates" if not updates[0] else f"{updates[1] / updates[0]:.0%} HOT"


def outbox_settings(concurrency: int) -> Any:
    from outbox import Settings

    return Settings(authority="allow-all", worker_concurrency=concurrency, secrets_key_file=harness.key_file())


async def open_outbox(dsn: str, hook: str, concurrency: int, **limits: Any) -> Any:
    """The outbox at ``dsn`` (migrated), with the benchmark's destination pointing at ``hook``
    (with ``limits``: its flow control, bench_limits.py)."""
    from outbox import DestinationSpec, Outbox

    box = await Outbox.open(dsn, settings=outbox_settings(concurrency))
    try:
        await box.put_destination(DESTINATION, DestinationSpec(url=hook, secret=SECRET, allow_private_network=True,
                                                               **limits))
    except BaseException:
        await box.close()
        raise
    return box


async def outbox_drain(admin_dsn: str, receiver: Receiver, n: int, concurrency: int, processes: int,
                       workdir: Path, path: str, **limits: Any) -> Drain:
    """N intents enqueued (untimed), drained by ``processes`` ``outbox worker`` processes (to a
    destination with ``limits``)."""
    async with fresh_database(admin_dsn) as dsn:
        box = await open_outbox(dsn, receiver.base + path, concurrency, **limits)
        try:
            await fill(box, 0, n)
        finally:
            await box.close()
        name = urlsplit(dsn).path.lstrip("/")
        commands = []
        for i in range(processes):
            application = f"bench-outbox-worker-{i + 1}"
            env = harness.clean_env(
                OUTBOX_DATABASE_URL=with_database(admin_dsn, name, application), OUTBOX_AUTHORITY="allow-all",
                OUTBOX_WORKER_CONCURRENCY=str(concurrency), OUTBOX_LOG_LEVEL="warning")
            commands.append((worker_command(), env, application))
        got = await drain(dsn, OUTBOX_GATE, commands, workdir, receiver, n)
        conn = await asyncpg.connect(dsn)
        try:
            statuses = dict(await conn.fetch("SELECT status, count(*) FROM intents GROUP BY status"))
            attempts = await conn.fetchval("SELECT count(*) FROM attempts")
            got.claims = await conn.fetchval(CLAIMS_MADE if await conn.fetchval(ATTEMPTS_KEEP_EVENTS) else
                                             "SELECT count(DISTINCT (actor, at)) FROM events WHERE kind = 'leased'")
            got.updates, got.attempt_updates = await row_updates(conn)  # the workers' backends have ended
        finally:
            await conn.close()
    if statuses != {"delivered": n}:
        raise BenchError(f"intents by status after the run: {statuses}, expected {{'delivered': {n}}}")
    if attempts != n:
        raise BenchError(f"{attempts} attempts recorded for {n} intents (expected one each)")
    await check_received(receiver, path, n)
    return got


# -- pgqueuer, in a virtualenv of its own ---------------------------------------------------------


def pgqueuer_python(venv: Path) -> tuple[Path, str]:
    """The Python of a virtualenv holding pgqueuer (made once, then reused), and what it holds."""
    python = venv / "bin" / "python"
    ready = venv / "bench-ready"
    if not ready.exists():
        print(f"making {venv} (once): python -m venv, pip install {' '.join(PGQUEUER_PACKAGES)}", flush=True)
        try:
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, capture_output=True,
                           timeout=SETUP_TIMEOUT_SECONDS)
            subprocess.run([str(python), "-m", "pip", "install", "-q", *PGQUEUER_PACKAGES], check=True,
                           capture_output=True, timeout=PIP_TIMEOUT_SECONDS)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            said = getattr(exc, "stderr", b"") or b""
            raise BenchError(f"cannot make pgqueuer's virtualenv at {venv}: {exc}\n{said.decode()[-2000:]}") from exc
        ready.write_text("made by tests/bench/bench_postgres.py\n")
    versions = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; "
         f"print(', '.join(f'{{p}} {{m.version(p)}}' for p in {PGQUEUER_PACKAGES!r}))"],
        capture_output=True, text=True, timeout=SETUP_TIMEOUT_SECONDS)
    if versions.returncode != 0:
        raise BenchError(f"pgqueuer's virtualenv at {venv} is broken (delete it to remake it):\n{versions.stderr}")
    return python, versions.stdout.strip()


def pgqueuer_job(python: Path, *args: str) -> None:
    """Run pgqueuer_job.py to its end (schema, enqueue: untimed setup)."""
    done = subprocess.run([str(python), str(PGQUEUER_JOB), *args], capture_output=True, text=True,
                          timeout=SETUP_TIMEOUT_SECONDS, env=harness.clean_env())
    if done.returncode != 0:
        raise BenchError(f"pgqueuer_job.py {args[0]} failed ({done.returncode}):\n{done.stderr[-3000:]}")


async def pgqueuer_drain(admin_dsn: str, python: Path, loop: str, receiver: Receiver, n: int, concurrency: int,
                         batch_size: int, workdir: Path, path: str) -> Drain:
    """N jobs enqueued (untimed), drained by one pgqueuer consumer process."""
    async with fresh_database(admin_dsn) as dsn:
        pgqueuer_job(python, "install", dsn)
        pgqueuer_job(python, "enqueue", dsn, "--n", str(n), "--note", NOTE)
        application = "bench-pgqueuer"
        name = urlsplit(dsn).path.lstrip("/")
        cmd = [str(python), str(PGQUEUER_JOB), "consume", with_database(admin_dsn, name, application),
               "--url", receiver.base + path, "--batch-size", str(batch_size), "--concurrency", str(concurrency),
               "--loop", loop]
        got = await drain(dsn, PGQUEUER_GATE, [(cmd, harness.clean_env(), application)], workdir, receiver, n)
        conn = await asyncpg.connect(dsn)
        try:
            left = await conn.fetchval("SELECT count(*) FROM pgqueuer")
            logged = dict(await conn.fetch("SELECT status::text, count(*) FROM pgqueuer_log GROUP BY status"))
        finally:
            await conn.close()
    if left or logged.get("successful") != n:
        raise BenchError(f"pgqueuer left {left} jobs queued; its log by status: {logged}, expected {n} successful")
    await check_received(receiver, path, n)
    return got


# -- enqueue rates ----------------------------------------------------------------------------------


@dataclass
class Enqueues:
    raw: float  # rows/s, one INSERT per transaction, bare asyncpg
    single: float  # intents/s, Outbox.enqueue one at a time
    batched: float  # intents/s, enqueue_many of ENQUEUE_BATCH


async def enqueue_rates(admin_dsn: str, n_single: int, n_batched: int) -> Enqueues:
    """The three loops on one fresh database, each after ENQUEUE_WARMUP untimed operations."""
    async with fresh_database(admin_dsn) as dsn:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("CREATE TABLE rows (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
                               "k text NOT NULL UNIQUE, body text NOT NULL)")
            rows = [(f"{i:010d}-{secrets.token_hex(13)}", json.dumps(bench_delivery.payload(i), separators=(",", ":")))
                    for i in range(ENQUEUE_WARMUP + n_single)]
            insert = "INSERT INTO rows (k, body) VALUES ($1, $2)"
            for params in rows[:ENQUEUE_WARMUP]:
                await conn.execute(insert, *params)
            began = time.perf_counter()
            for params in rows[ENQUEUE_WARMUP:]:
                await conn.execute(insert, *params)
            raw = n_single / (time.perf_counter() - began)
            if await conn.fetchval("SELECT count(*) FROM rows") != ENQUEUE_WARMUP + n_single:
                raise BenchError("the raw insert loop is missing rows")
        finally:
            await conn.close()

        box = await open_outbox(dsn, "http://127.0.0.1:9/hook", bench_delivery.CONCURRENCY)
        try:
            for i in range(ENQUEUE_WARMUP):
                await box.enqueue(**intent(i))
            began = time.perf_counter()
            for i in range(ENQUEUE_WARMUP, ENQUEUE_WARMUP + n_single):
                if not (await box.enqueue(**intent(i))).created:
                    raise BenchError(f"enqueue {i} did not create an intent")
            single = n_single / (time.perf_counter() - began)
            first = ENQUEUE_WARMUP + n_single
            batches = [[intent(i) for i in range(lo, min(lo + ENQUEUE_BATCH, first + n_batched))]
                       for lo in range(first, first + n_batched, ENQUEUE_BATCH)]
            began = time.perf_counter()
            for batch in batches:
                results = await box.enqueue_many(batch)
                if len(results) != len(batch) or not all(r.created for r in results):
                    raise BenchError("enqueue_many did not create every intent of a fresh batch")
            batched = n_batched / (time.perf_counter() - began)
        finally:
            await box.close()
        conn = await asyncpg.connect(dsn)
        try:
            if (found := await conn.fetchval("SELECT count(*) FROM intents")) != first + n_batched:
                raise BenchError(f"{found} intents stored, expected {first + n_batched}")
        finally:
            await conn.close()
    return Enqueues(raw, single, batched)


# -- claim latency at 10k and 1M pending ------------------------------------------------------------


async def build_pending(dsn: str, n: int) -> float:
    """An outbox holding n pending intents: BATCH enqueued by the library, the rest copies of the
    first one with their own keys and due times (no events rows for the copies), inserted with
    generate_series in one statement; then VACUUM ANALYZE. Returns seconds taken."""
    began = time.perf_counter()
    seed = min(n, BATCH)
    box = await open_outbox(dsn, "http://127.0.0.1:9/hook", bench_delivery.CONCURRENCY)
    try:
        await fill(box, 0, seed)
    finally:
        await box.close()
    conn = await asyncpg.connect(dsn)
    try:
        if n > seed:
            await conn.execute("""
                INSERT INTO intents (intent_key, action_id, scope, destination, channel, payload, payload_digest,
                                     status, max_attempts, next_attempt_at, created_at, updated_at)
                SELECT t.scope || '/' || format('bench-%s', lpad(k::text, 9, '0')),
                       format('bench-%s', lpad(k::text, 9, '0')), t.scope, t.destination, t.channel, t.payload,
                       t.payload_digest, 'pending', t.max_attempts, t.next_attempt_at + k * interval '1 microsecond',
                       t.created_at, t.updated_at
                FROM generate_series($1::bigint, $2::bigint) AS k, (SELECT * FROM intents ORDER BY seq LIMIT 1) AS t
            """, seed, n - 1)
        await conn.execute("VACUUM ANALYZE intents")
        found = await conn.fetchval("SELECT count(*) FROM intents WHERE status = 'pending'")
    finally:
        await conn.close()
    if found != n:
        raise BenchError(f"{found} pending intents, expected {n}")
    return time.perf_counter() - began


@dataclass
class ClaimTimes:
    claims: list[float] = field(default_factory=list)  # seconds per store.claim (committed)
    statements: list[float] = field(default_factory=list)  # seconds per claim statement, rolled back


async def claim_latency(small: str, big: str, concurrency: int) -> tuple[ClaimTimes, ClaimTimes]:
    """CLAIMS ``store.claim(limit=concurrency)`` per database, interleaved in chunks of
    CLAIM_CHUNK; then the claim statement alone on a plain connection, rolled back each time."""
    from outbox.store.postgres import SQL, cycle_arguments
    from outbox.store.protocol import Claim

    times = {small: ClaimTimes(), big: ClaimTimes()}
    boxes = {dsn: await open_outbox(dsn, "http://127.0.0.1:9/hook", concurrency) for dsn in (small, big)}
    try:
        for box in boxes.values():  # warm-up: the first pages into shared buffers, statements prepared
            now = box.clock.now()
            await box.store.claim("warmup", now=now, lease_until=now + timedelta(seconds=60), limit=concurrency)
        for chunk in range(CLAIMS // CLAIM_CHUNK):
            for dsn, box in boxes.items():
                for _ in range(CLAIM_CHUNK):
                    now = box.clock.now()
                    began = time.perf_counter()
                    got = await box.store.claim(f"bench-{chunk}", now=now, lease_until=now + timedelta(seconds=60),
                                                limit=concurrency)
                    times[dsn].claims.append(time.perf_counter() - began)
                    if len(got) != concurrency:
                        raise BenchError(f"a claim returned {len(got)} intents, expected {concurrency}")
        conns = {dsn: await asyncpg.connect(dsn) for dsn in (small, big)}
        try:
            for _ in range(CLAIMS // CLAIM_CHUNK):
                for dsn, conn in conns.items():
                    for _ in range(CLAIM_CHUNK):
                        now = boxes[dsn].clock.now()
                        began = time.perf_counter()
                        tx = conn.transaction()
                        await tx.start()
                        rows = await conn.fetch(SQL["cycle"], *cycle_arguments(
                            [], [], Claim("stmt", now, now + timedelta(seconds=60), concurrency)))
                        await tx.rollback()
                        times[dsn].statements.append(time.perf_counter() - began)
                        if len(rows) != concurrency:
                            raise BenchError(f"the claim statement picked {len(rows)} rows")
        finally:
            for conn in conns.values():
                await conn.close()
    finally:
        for box in boxes.values():
            await box.close()
    return times[small], times[big]


# -- the store alone, as the pipelined worker calls it ---------------------------------------------


@dataclass
class StoreRun:
    """N deliveries' bookkeeping made through ``store.apply`` alone, nothing sent."""

    n: int
    seconds: float
    client_cpu: float  # this process's CPU seconds
    postgres_cpu: float | None
    statements: int  # what the store's connection sent, transaction commands included
    transactions: int
    wal_bytes: float
    updates: tuple[int, int]  # intents rows updated, HOT
    attempt_updates: tuple[int, int]  # attempts rows updated, HOT

    def per_delivery(self, value: float) -> float:
        return value / self.n


async def first_claim(store: Any) -> list[Any]:
    """One intent claimed, the first of the store's cycles."""
    from datetime import UTC, datetime

    from outbox.store.protocol import Claim

    now = datetime.now(UTC)
    return list((await store.apply([], claim=Claim("bench", now, now + timedelta(minutes=5), 1))).claimed)


async def bookkeeping(store: Any, claimed: list[Any], n: int, batch: int) -> None:
    """N deliveries' bookkeeping, ``claimed`` the first cycle's claim, as a pipelined worker
    makes it: each cycle one ``apply`` with the starts of the batch claimed the cycle before,
    the outcomes (delivered) of the batch started the cycle before, and a claim of ``batch``."""
    from datetime import UTC, datetime

    from outbox.model import Attempt, Event, EventKind, Outcome, Settle, Start, Status, Submission
    from outbox.store.protocol import Claim

    started: list[tuple[str, Attempt]] = []  # (intent key, its attempt)
    done, left = 0, n - len(claimed)
    while done < n:
        now = datetime.now(UTC)
        attempts = [Attempt(f"{i.key}-1", 1, i.fence, "bench", now, None, None, None, None, None, None,
                            None, None) for i in claimed]
        changes: list[Any] = [Start(i.key, i.fence, a, Event(EventKind.ATTEMPT_STARTED, now, "bench", None, {
            "attempt_id": a.attempt_id, "number": 1, "fence": a.fence, "authority": "allow-all",
            "authority_revision": None, "authority_checked_at": None, "target": "http://127.0.0.1:9/hook"}))
            for i, a in zip(claimed, attempts, strict=True)]  # the events' data as a worker's
        for key, a in started:
            finished = Attempt(a.attempt_id, 1, a.fence, "bench", a.started_at, now, Submission.SUBMITTED,
                               Outcome.DELIVERED, 200, None, None, None, 1.0)
            changes.append(Settle(key, a.fence, Status.DELIVERED, (
                Event(EventKind.ATTEMPT_FINISHED, now, "bench", None, {
                    "attempt_id": a.attempt_id, "submission": "submitted", "outcome": "delivered", "status_code": 200}),
                Event(EventKind.DELIVERED, now, "bench", "receiver answered 200")),
                attempts=1, attempt=finished))
        take = min(batch, left)
        applied = await store.apply(changes, claim=Claim("bench", now, now + timedelta(minutes=5), take)
                                    if take else None)
        if any(result is not None for result in applied.results):
            raise BenchError(f"apply refused a change: {next(r for r in applied.results if r is not None)}")
        done += len(started)
        left -= len(applied.claimed)
        started, claimed = [(i.key, a) for i, a in zip(claimed, attempts, strict=True)], applied.claimed


async def store_alone(admin_dsn: str, n: int, batch: int) -> StoreRun:
    """N intents enqueued (untimed), then driven through their bookkeeping as a pipelined worker
    would: each cycle is one ``apply`` with the starts of the batch claimed the cycle before, the
    outcomes (delivered) of the batch started the cycle before, and a claim of ``batch`` more.
    The store has one pooled connection, whose statements are counted as asyncpg sends them."""
    from outbox.store.postgres import PostgresStore

    async with fresh_database(admin_dsn) as dsn:
        box = await open_outbox(dsn, "http://127.0.0.1:9/hook", batch)
        try:
            await fill(box, 0, n)
        finally:
            await box.close()
        store = PostgresStore(dsn, pool_size=1)
        await store.open()
        sent: list[str] = []
        async with store._connections.pool.acquire() as conn:
            conn._con.add_query_logger(lambda record: sent.append(record.query))
        watch = await asyncpg.connect(dsn)
        try:
            claimed = await first_claim(store)  # warm-up: the statements prepared, the driver's types introspected
            sent.clear()
            mark = await watch.fetchrow(SERVER_MARK)
            pg_before, cpu_before, began = postgres_cpu(), time.process_time(), time.perf_counter()
            await bookkeeping(store, claimed, n, batch)
            seconds = time.perf_counter() - began
            client_cpu, pg_after = time.process_time() - cpu_before, postgres_cpu()
            statements = len(sent)
            await store.close()  # its backend's statistics are in once it has gone
            deadline = time.monotonic() + harness.SERVER_STOP_SECONDS
            while time.monotonic() < deadline and await watch.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> $1",
                    watch.get_server_pid()):
                await asyncio.sleep(0.02)
            transactions, wal = await watch.fetchrow(SERVER_SINCE, *mark)
            updates, attempt_updates = await row_updates(watch)
            statuses = dict(await watch.fetch("SELECT status, count(*) FROM intents GROUP BY status"))
        finally:
            await store.close()
            await watch.close()
    if statuses != {"delivered": n}:
        raise BenchError(f"intents by status after the store's run: {statuses}, expected {{'delivered': {n}}}")
    return StoreRun(n, seconds, client_cpu, None if pg_before is None or pg_after is None else pg_after - pg_before,
                    statements, transactions, wal, updates, attempt_updates)


def store_table(runs: list[StoreRun], batch: int) -> str:
    """The store's runs, per delivery, median of the rounds."""
    def median(value: Callable[[StoreRun], float | None]) -> float | None:
        return median_of([value(run) for run in runs])

    pg = median(lambda r: None if r.postgres_cpu is None else r.per_delivery(r.postgres_cpu) * 1e6)
    lines = [("per delivery (median of rounds)", "value"),
             ("deliveries/s (bookkeeping only)", us(median(lambda r: r.n / r.seconds))),
             ("PostgreSQL CPU, us", us(pg)),
             ("client CPU, us", us(median(lambda r: r.per_delivery(r.client_cpu) * 1e6))),
             ("statements sent (BEGIN, COMMIT included)", f"{median(lambda r: r.per_delivery(r.statements)):.3f}"),
             ("write transactions", f"{median(lambda r: r.per_delivery(r.transactions)):.3f}"),
             ("WAL bytes", us(median(lambda r: r.per_delivery(r.wal_bytes)))),
             ("intents row versions (updates)", f"{median(lambda r: r.per_delivery(r.updates[0])):.2f}"),
             ("attempts row versions (updates)", f"{median(lambda r: r.per_delivery(r.attempt_updates[0])):.2f}")]
    hot = "; ".join(f"{name} {hot_share(updates)}" for name, updates in (
        ("intents", runs[-1].updates), ("attempts", runs[-1].attempt_updates)))
    return (f"The store alone: apply with {batch} starts, {batch} outcomes and a claim of {batch} per cycle "
            f"(last round: {hot})\n" + harness.render_table(lines, right={1}))


# -- running and reporting ------------------------------------------------------------------------


@dataclass
class Case:
    key: str
    short: str  # the label without its settings
    label: str
    run: Callable[[Path, str], Awaitable[Drain]]  # (workdir, receiver path) -> the drain
    drains: list[Drain] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)  # to the bare client of the same round


def us(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def median_of(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


#: The issue's targets per delivery, against pgqueuer's best case of the same run.
PG_CPU_TARGET = 2.0
WRITE_TX_TARGET = 0.1
ROW_VERSIONS_BEFORE = 3.0


def per_delivery_targets(cases: list[Case]) -> str:
    """Each outbox case's PostgreSQL CPU per delivery against pgqueuer's fastest case (medians of
    the rounds), its write transactions and intents row versions per delivery, and its HOT shares."""
    def median(case: Case, value: Callable[[Drain], float | None]) -> float | None:
        return median_of([value(d) for d in case.drains])

    peers = [c for c in cases if c.key.startswith("pgqueuer") and c.drains]
    best = max(peers, key=lambda c: median(c, lambda d: d.rate) or 0.0, default=None)
    theirs = None if best is None else median(best, lambda d: d.per_delivery_us(d.postgres_cpu))
    rows: list[Row] = []
    for case in cases:
        if not case.key.startswith("outbox") or not case.drains:
            continue
        ours = median(case, lambda d: d.per_delivery_us(d.postgres_cpu))
        if ours is not None and theirs:
            ratio = ours / theirs
            rows.append(Row(f"{case.short}: PostgreSQL CPU / {best.short if best else ''}'s", "", "",
                            f"{ratio:.2f}x", "", f"<= {PG_CPU_TARGET:.1f}x", "met" if ratio <= PG_CPU_TARGET else
                            "NOT MET"))
        tx = median(case, lambda d: d.transactions / d.n) or 0.0
        rows.append(Row(f"{case.short}: write transactions", f"{tx:.2f}", "per delivery", "", "",
                        f"<= {WRITE_TX_TARGET:.2f}", "met" if tx <= WRITE_TX_TARGET else "NOT MET"))
        versions = median(case, lambda d: d.updates[0] / d.n if d.updates else None)
        if versions is not None:
            rows.append(Row(f"{case.short}: intents row versions", f"{versions:.2f}", "per delivery", "", "",
                            f"< {ROW_VERSIONS_BEFORE:.1f}", "met" if versions < ROW_VERSIONS_BEFORE else "NOT MET"))
        last = case.drains[-1]
        rows.append(Row(f"{case.short}: HOT share (last round)",
                        f"intents {hot_share(last.updates)}, attempts {hot_share(last.attempt_updates)}", ""))
    if not rows:
        return ""
    return "\nPer delivery against the targets\n" + render(rows, ("case", "value", "unit", "ratio", "spread",
                                                                   "target", ""))


async def server_facts(admin_dsn: str) -> str:
    conn = await asyncpg.connect(admin_dsn)
    try:
        version = await conn.fetchval("SHOW server_version")
        sync = await conn.fetchval("SHOW synchronous_commit")
        fsync = await conn.fetchval("SHOW fsync")
        buffers = await conn.fetchval("SHOW shared_buffers")
    finally:
        await conn.close()
    return f"PostgreSQL {version} (synchronous_commit={sync}, fsync={fsync}, shared_buffers={buffers})"


async def run(args: argparse.Namespace) -> int:
    n = args.n or (1_000 if args.quick else 5_000)
    rounds = args.rounds or (1 if args.quick else 3)
    big_n = args.big_n or (100_000 if args.quick else 1_000_000)
    n_single = 500 if args.quick else 2_000
    n_batched = 5_000 if args.quick else 20_000
    c = args.concurrency
    bench_delivery.CONCURRENCY = c  # bench_delivery's loops (the bare client) read their concurrency here
    problems: list[str] = []
    rows: list[Row] = []
    began = time.perf_counter()
    admin_dsn = args.pg
    try:
        facts = await server_facts(admin_dsn)
        await drop_stale_databases(admin_dsn)
    except (OSError, asyncpg.PostgresError) as exc:
        print(f"INVALID: PostgreSQL at {admin_dsn} does not answer: {exc!r}", file=sys.stderr)
        return 1
    python: Path | None = None
    pgqueuer_versions = ""
    if not args.skip_pgqueuer:
        try:
            python, pgqueuer_versions = pgqueuer_python(Path(args.pgqueuer_venv))
        except BenchError as exc:
            problems.append(f"pgqueuer: {exc}")
            print(f"pgqueuer: FAILED: {exc}", flush=True)
    print(f"PostgreSQL benchmark (N={n:,} per drain, {rounds} round{'s' * (rounds > 1)}, concurrency {c}, "
          f"a fresh database per drain)")
    print(f"{harness.machine_summary()}; {facts}")
    pgqueuer_said = f"; pgqueuer consumer on {args.pgqueuer_loop} ({pgqueuer_versions})" if python else ""
    print("outbox worker processes and the bare client on the asyncio loop; receiver uvicorn+uvloop+httptools in "
          f"its own process{pgqueuer_said}\n", flush=True)

    cases = [
        Case("outbox-1", "outbox worker, 1 process", f"outbox worker, 1 process ({c} in flight)",
             lambda workdir, path: outbox_drain(admin_dsn, receiver, n, c, 1, workdir, path)),
        Case("outbox-2", "outbox worker, 2 processes", f"outbox worker, 2 processes ({c} in flight each)",
             lambda workdir, path: outbox_drain(admin_dsn, receiver, n, c, 2, workdir, path)),
    ]
    if python is not None:
        pgq = python
        for batch_size in (10, 32):
            cases.append(Case(
                f"pgqueuer-{batch_size}", f"pgqueuer, batch_size={batch_size}",
                f"pgqueuer, batch_size={batch_size}{' (its default)' if batch_size == 10 else ''}, "
                f"max_concurrent_tasks={max(c, 2 * batch_size)}",
                lambda workdir, path, b=batch_size: pgqueuer_drain(
                    admin_dsn, pgq, args.pgqueuer_loop, receiver, n, c, b, workdir, path)))
    by_key = {case.key: case for case in cases}
    base_rates: list[float] = []
    base_loads: list[bench_delivery.Load] = []
    vs_pgqueuer: dict[str, list[float]] = {"outbox-1": [], "outbox-2": []}
    second_worker: list[float] = []
    enqueues: list[Enqueues] = []
    claim_times: tuple[ClaimTimes, ClaimTimes] | None = None
    store_runs: list[StoreRun] = []
    with tempfile.TemporaryDirectory(prefix="bench-postgres-", dir=args.dir) as tmp:
        root = Path(tmp)
        async with running_receiver(root) as receiver:
            # 1-4: the bare client, then every drain, in rounds (the drains' order rotating)
            for round_ in range(1, 0 if args.store_only else rounds + 1):
                try:
                    load = await bench_delivery.baseline(receiver, n)
                except BenchError as exc:
                    problems.append(f"round {round_}, bare client: {exc}")
                    print(f"round {round_}: FAILED: {exc}", flush=True)
                    continue
                base_rates.append(load.rate)
                base_loads.append(load)
                progress(f"round {round_}", f"bare aiohttp client, {c} in flight", f"{load.rate:>9,.0f} req/s")
                shift = (round_ - 1) % len(cases)
                got: dict[str, Drain] = {}
                for case in cases[shift:] + cases[:shift]:
                    workdir = harness.fresh_dir(root, case.key)
                    try:
                        drained = await case.run(workdir, f"/{case.key}-r{round_}")
                    except BenchError as exc:
                        problems.append(f"round {round_}, {case.label}: {exc}")
                        print(f"round {round_}: {case.label}: FAILED: {exc}", flush=True)
                        continue
                    finally:
                        shutil.rmtree(workdir, ignore_errors=True)
                    got[case.key] = drained
                    case.drains.append(drained)
                    case.ratios.append(drained.rate / load.rate)
                    progress(f"round {round_}", case.label,
                             f"{drained.rate:>9,.0f} deliveries/s ({drained.rate / load.rate:.2f}x)")
                best = max((d.rate for k, d in got.items() if k.startswith("pgqueuer")), default=None)
                for key, ratios in vs_pgqueuer.items():
                    if best and key in got:
                        ratios.append(got[key].rate / best)
                if "outbox-1" in got and "outbox-2" in got:
                    second_worker.append(got["outbox-2"].rate / got["outbox-1"].rate)

            if base_rates:
                rows.append(Row(f"bare aiohttp client -> receiver ({c} in flight)",
                                f"{statistics.median(base_rates):,.0f}", "req/s", "1.00x"))
            for case in cases:
                if case.drains:
                    median, spread = harness.fmt_ratio(case.ratios)
                    rows.append(Row(case.label, f"{statistics.median(d.rate for d in case.drains):,.0f}",
                                    "deliveries/s", median, spread))
            target = "Target: ≥ pgqueuer's best drain rate in the same run; a second worker adds throughput"
            for key, ratios in vs_pgqueuer.items():
                if ratios:
                    median, spread = harness.fmt_ratio(ratios)
                    met = statistics.median(ratios) >= 1.0
                    rows.append(Row(f"  {by_key[key].short} / pgqueuer's best, same round", "", "",
                                    median, spread, ">= 1.00x", "met" if met else "NOT MET"))
            if second_worker:
                median, spread = harness.fmt_ratio(second_worker)
                met = statistics.median(second_worker) >= SECOND_WORKER_GAIN
                rows.append(Row("  outbox worker, 2 processes / 1 process, same round", "", "", median, spread,
                                f">= {SECOND_WORKER_GAIN:.2f}x", "met" if met else "NOT MET"))
            receiver.alive()

        # 5: enqueue rates
        if not args.skip_enqueue:
            for round_ in range(1, rounds + 1):
                try:
                    got_enqueues = await enqueue_rates(admin_dsn, n_single, n_batched)
                except BenchError as exc:
                    problems.append(f"enqueue round {round_}: {exc}")
                    print(f"enqueue round {round_}: FAILED: {exc}", flush=True)
                    continue
                enqueues.append(got_enqueues)
                progress(f"enqueue {round_}", "raw asyncpg INSERT, one per transaction",
                         f"{got_enqueues.raw:>9,.0f} rows/s")
                progress(f"enqueue {round_}", "Outbox.enqueue, sequential",
                         f"{got_enqueues.single:>9,.0f} /s ({got_enqueues.single / got_enqueues.raw:.2f}x)")
                progress(f"enqueue {round_}", f"Outbox.enqueue_many ({ENQUEUE_BATCH}/batch)",
                         f"{got_enqueues.batched:>9,.0f} /s ({got_enqueues.batched / got_enqueues.raw:.2f}x)")
        if enqueues:
            rows.append(Row("raw asyncpg INSERT loop, one row per transaction",
                            f"{statistics.median(e.raw for e in enqueues):,.0f}", "rows/s", "1.00x"))
            for label, rate in (("Outbox.enqueue, sequential (one per transaction)", lambda e: e.single),
                                (f"Outbox.enqueue_many, {ENQUEUE_BATCH}/batch", lambda e: e.batched)):
                median, spread = harness.fmt_ratio([rate(e) / e.raw for e in enqueues])
                rows.append(Row(label, f"{statistics.median(rate(e) for e in enqueues):,.0f}", "intents/s",
                                median, spread))

        # 6: claim latency
        if not args.skip_claims:
            try:
                async with fresh_database(admin_dsn) as small, fresh_database(admin_dsn) as big:
                    built_small = await build_pending(small, SMALL_PENDING)
                    built_big = await build_pending(big, big_n)
                    progress("claims", f"built {big_n:,} pending intents",
                             f"{built_big:>9.1f} s ({SMALL_PENDING:,} in {built_small:.1f} s)")
                    claim_times = await claim_latency(small, big, c)
            except BenchError as exc:
                problems.append(f"claim latency: {exc}")
                print(f"claims: FAILED: {exc}", flush=True)
        if claim_times is not None:
            rows += claim_rows(*claim_times, big_n, c, "claim statement alone")

        # 7: the store alone
        if not args.skip_store:
            for round_ in range(1, rounds + 1):
                try:
                    alone = await store_alone(admin_dsn, n, args.store_batch)
                except BenchError as exc:
                    problems.append(f"store alone, round {round_}: {exc}")
                    print(f"store {round_}: FAILED: {exc}", flush=True)
                    continue
                store_runs.append(alone)
                pg_us = None if alone.postgres_cpu is None else alone.per_delivery(alone.postgres_cpu) * 1e6
                progress(f"store {round_}", f"apply, {args.store_batch} starts + outcomes + claim a cycle",
                         f"{alone.n / alone.seconds:>9,.0f} deliveries/s, {us(pg_us)} us of PostgreSQL CPU each")

        for case in cases:
            if case.drains:
                peak = statistics.median(max(d.peak_rss_kib) for d in case.drains)
                rows.append(Row(f"peak RSS (VmHWM) of a process: {case.short}",
                                mib(int(peak)), "MiB"))

    print(f"\nPostgreSQL benchmark (N={n:,} per drain; median of {rounds} round{'s' * (rounds > 1)}, each ratio "
          f"against the same round's bare client or pgqueuer)")
    print(target)
    print(render(rows, ("case", "value", "unit", "ratio", "spread", "target", "")))
    if base_loads:
        client = median_of([load.cpu.own_us if load.cpu else None for load in base_loads])
        theirs = median_of([load.cpu.receiver_us if load.cpu else None for load in base_loads])
        print(f"\nPer delivery, median of the rounds: CPU time in us (bare client: {us(client)} in its process, "
              f"receiver {us(theirs)}); the server's write transactions and WAL bytes")
        lines = [("case", "worker process(es)", "postgres processes", "receiver", "write tx", "WAL bytes",
                  "claims", "per claim")]
        for case in cases:
            if not case.drains:
                continue
            claims = median_of([d.claims for d in case.drains])
            transactions = median_of([d.transactions / d.n for d in case.drains])
            wal = median_of([d.wal_bytes / d.n for d in case.drains])
            lines.append((
                case.short,
                us(median_of([d.per_delivery_us(d.worker_cpu) for d in case.drains])),
                us(median_of([d.per_delivery_us(d.postgres_cpu) for d in case.drains])),
                us(median_of([d.per_delivery_us(d.receiver_cpu) for d in case.drains])),
                "-" if transactions is None else f"{transactions:.2f}",
                us(wal),
                "" if claims is None else f"{claims:,.0f}",
                "" if claims is None else f"{n / claims:.1f}",
            ))
        print(harness.render_table(lines, right={1, 2, 3, 4, 5, 6, 7}))
        print(per_delivery_targets(cases))
    if store_runs:
        print("\n" + store_table(store_runs, args.store_batch))
    for case in cases:
        for round_, d in enumerate(case.drains, 1):
            if d.warnings:
                print(f"{case.label}, round {round_}: warnings {dict(d.warnings)}")
            if d.updates and d.attempt_updates:
                print(f"{case.label}, round {round_}: {d.updates[0]:,} updates of intents rows "
                      f"({d.updates[0] / d.n:.2f} per delivery, {hot_share(d.updates)}), "
                      f"{d.attempt_updates[0]:,} of attempts rows ({hot_share(d.attempt_updates)})")
            if d.others_busy:
                print(f"{case.label}, round {round_}: up to {d.others_busy} connection(s) to other databases were "
                      "active during the drain (their CPU, transactions and WAL count in its figures)")
        if case.drains:
            print(f"{case.label}: {', '.join(f'{d.seconds:.2f} s' for d in case.drains)} to the last recorded "
                  f"delivery; {', '.join(f'{d.observed_seconds:.2f} s' for d in case.drains)} to the poll that saw it")
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    if load is not None:
        print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} CPUs)")
    return harness.finish(began, problems)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = harness.new_parser(__doc__)
    add = parser.add_argument
    add("--n", type=int, help="intents (jobs, baseline requests) per drain (5,000; --quick 1,000)")
    add("--rounds", type=int, help="rounds of the bare client and every drain (3; --quick 1)")
    add("--concurrency", type=int, default=64, help="requests in flight: the client's, each worker's (64)")
    add("--big-n", type=int, help="pending intents for the large claim case (1,000,000; --quick 100,000)")
    add("--quick", action="store_true", help="a short run: N=1,000, one round, 100,000 for the claims")
    add("--pg", default=ADMIN_DSN, help=f"the server's administrative DSN ({ADMIN_DSN}; env OUTBOX_TEST_PG_DSN)")
    add("--pgqueuer-venv", default=str(PGQUEUER_VENV), help=f"pgqueuer's own virtualenv, made once ({PGQUEUER_VENV})")
    add("--pgqueuer-loop", choices=["uvloop", "asyncio"], default="uvloop",
        help="the pgqueuer consumer's event loop (uvloop, as `pgq run`)")
    add("--skip-pgqueuer", action="store_true", help="skip the pgqueuer drains")
    add("--skip-enqueue", action="store_true", help="skip the enqueue rates")
    add("--skip-claims", action="store_true", help="skip the claim latency case")
    add("--skip-store", action="store_true", help="skip the store alone (apply in pipelined cycles)")
    add("--store-only", action="store_true", help="only the store alone: no drains, enqueues or claims")
    add("--store-batch", type=int, default=32, help="starts, outcomes and claim per apply for the store alone (32)")
    add("--dir", help="where the logs go")
    args = parser.parse_args(argv)
    bench_delivery.check_sizes(parser, args, ("n", "rounds", "big_n", "concurrency", "store_batch"))
    if args.store_only:
        args.skip_enqueue = args.skip_claims = args.skip_pgqueuer = True
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return harness.run_main(run(args), uvloop=False)


if __name__ == "__main__":
    sys.exit(main())
