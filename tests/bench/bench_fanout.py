"""One batch of events fanned out to 21 subscribers, with each event's payload stored once (its
intents send it from the event's row, migration 0018) against a copy of it in every intent (the
design before), on SQLite and PostgreSQL, as ratios measured in the same round.

The case is issue 35's: 21 webhook destinations subscribed to ``*``, a grant to ``*``, and one
``publish_each`` of 500 events (what ``POST /v1/events:batch`` makes) with about 2 KB of payload
each, 0.99 MB in all: 10,500 intents in one commit. Each design runs in a child process of its
own on a fresh database:

- ``shared``: this tree as it is;
- ``copied``: this tree with every intent of an event made without ``payload_event``, so each
  stores its own copy of the payload, as every release before migration 0018 stored it (the
  baseline; the rows are the old design's, read by today's statements);
- ``main`` (with ``--main-tree PATH``, a checkout of the branch to compare with): that tree's
  code, as it is.

Measured in each: the publish's seconds and what it added to storage (SQLite: the database file
and its WAL; PostgreSQL: ``pg_database_size``), the bytes it wrote (SQLite: the child's
``write()`` bytes, WAL frames and checkpoints; PostgreSQL: WAL generated, cluster-wide, so any
other client of the server adds to it), then the delivery of the 10,500 intents by one
``sender.Worker`` whose channel sends nothing (``bench_delivery.NoopChannel``: claims, attempt
starts and outcomes, the store's part of delivery, without HTTP), as deliveries/s, bytes written
and CPU per delivery (the child's, every thread; on PostgreSQL also the backends serving its
database, read from /proc: load on the machine moves CPU less than it moves rates); and then, in
the same database, the delivery of as many intents enqueued directly with the same payloads
(which keep theirs inline in every design: the claim's reading of what an intent sends must not
cost them anything). The payloads are base64 of seeded random bytes, which PostgreSQL's
compression cannot shrink (a run of one letter would be compressed into nothing and hide the
copies).

Reported: medians of the rounds, and each design against ``copied`` (and ``shared`` against
``main``) as the median of the per-round ratios. Nothing here asserts on timing; the exit status
is non-zero only when a measurement is invalid (an intent missing or not delivered).

    python tests/bench/bench_fanout.py [--rounds R] [--quick] [--only sqlite|postgres] [--main-tree PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import harness
from harness import BenchError

SUBSCRIBERS = 21
EVENTS = 500
SCOPE = "acme"
#: Bytes of random data per payload, as base64: about 1,990 bytes of canonical JSON an event.
NOISE = 1470
TREE = Path(__file__).resolve().parents[2]
DELIVERY_TIMEOUT_SECONDS = 600.0
CHILD_TIMEOUT_SECONDS = 1200.0
#: The batch's intents in all: above the default ``max_batch_fanout`` (10,000), so the case raises it.
FANOUT = EVENTS * SUBSCRIBERS


def payloads() -> list[dict[str, Any]]:
    """The batch's payloads: the same in every child (seeded), none compressible."""
    noise = random.Random(35)
    return [{"event": n, "data": base64.b64encode(noise.randbytes(NOISE)).decode()} for n in range(EVENTS)]


# -- the child: one design, one dialect, one fresh database --------------------------------------


def written_bytes() -> int:
    """Bytes this process has passed to ``write()`` (Linux /proc), 0 where it cannot tell."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("wchar:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def own_cpu() -> float:
    """CPU seconds of this process so far, user and system, every thread's."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


@asynccontextmanager
async def outbox(dialect: str) -> AsyncIterator[tuple[Any, Any, Any]]:
    """A fresh outbox with SUBSCRIBERS destinations subscribed to ``*`` and a grant for SCOPE to
    all, how to read its storage and how much CPU the database has spent for it: ``(box, sizes,
    database_cpu)``, ``sizes()`` giving (bytes stored, bytes written so far), ``database_cpu()``
    the CPU seconds so far of the PostgreSQL backends serving this database (0 on SQLite, whose
    work is this process's)."""
    from outbox import DestinationSpec, Outbox, Settings
    from outbox.grants import GrantSpec

    async def prepared(box: Any) -> Any:
        for n in range(SUBSCRIBERS):
            await box.put_destination(f"d{n:02}", DestinationSpec(
                url="http://127.0.0.1:9/hook", secret="whsec_" + "A" * 44, allow_private_network=True,
                subscriptions=[{"topic": "*"}]))
        await box.put_grant("all", GrantSpec(scope=SCOPE, destination="*"))
        return box

    if dialect == "sqlite":
        directory = Path(tempfile.mkdtemp(prefix="bench-fanout-"))
        db = directory / "o.db"

        async def sqlite_sizes() -> tuple[int, int]:
            files = (db, db.with_name(db.name + "-wal"))
            return sum(f.stat().st_size for f in files if f.exists()), written_bytes()

        async def no_server() -> float:
            return 0.0

        try:
            box = await Outbox.open(f"sqlite:///{db}",
                                    settings=Settings(worker_concurrency=64, max_batch_fanout=FANOUT))
            try:
                yield await prepared(box), sqlite_sizes, no_server
            finally:
                await box.close()
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        return
    import asyncpg
    from bench_postgres import ADMIN_DSN, fresh_database

    async with fresh_database(ADMIN_DSN) as dsn:
        reader = await asyncpg.connect(dsn)

        async def postgres_sizes() -> tuple[int, int]:
            row = await reader.fetchrow("SELECT pg_database_size(current_database()) AS size,"
                                        " pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0') AS wal")
            return int(row["size"]), int(row["wal"])

        async def backends_cpu() -> float:
            pids = [row[0] for row in await reader.fetch(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")]
            return sum(harness.process_cpu(pid) or 0.0 for pid in pids)

        try:
            box = await Outbox.open(dsn, settings=Settings(database_url=dsn, secrets_key_file=harness.key_file(),
                                                           worker_concurrency=64, max_batch_fanout=FANOUT))
            try:
                yield await prepared(box), postgres_sizes, backends_cpu
            finally:
                await box.close()
        finally:
            await reader.close()


async def delivered(box: Any) -> int:
    return sum(n for status, _, n in await box.store.count_by_status() if status == "delivered")


async def deliveries_per_second(box: Any, n: int, database_cpu: Any, *, before: int = 0) -> tuple[float, float, float]:
    """Deliveries/s of one Worker with a channel that sends nothing, until the ``n`` due intents
    are delivered (``before``: how many were delivered already), and the microseconds of CPU per
    delivery of this process and of the database's backends."""
    from bench_delivery import NoopChannel

    from sender import Worker

    worker = Worker(box, channels={"webhook": NoopChannel()})
    cpu, database = own_cpu(), await database_cpu()
    began = time.perf_counter()
    task = asyncio.create_task(worker.run())
    try:
        while await delivered(box) < before + n:
            if task.done():
                await task
                raise BenchError("the worker stopped by itself before delivering everything")
            if time.perf_counter() - began > DELIVERY_TIMEOUT_SECONDS:
                raise BenchError(f"{await delivered(box)} of {n} delivered in {DELIVERY_TIMEOUT_SECONDS:.0f} s")
            await asyncio.sleep(0.05)
        seconds = time.perf_counter() - began
        return n / seconds, (own_cpu() - cpu) / n * 1e6, (await database_cpu() - database) / n * 1e6
    finally:
        worker.stop()
        await task


async def child(design: str, dialect: str) -> dict[str, float]:
    """Publish the batch and deliver its intents with ``design``, then as many direct intents;
    the figures as a dict."""
    if design == "copied":  # every intent of an event keeps its own copy of the payload
        from outbox.events import NewEvent

        made = NewEvent.intent_for
        NewEvent.intent_for = lambda self, destination, seq=None: made(self, destination)  # type: ignore[method-assign]
    events = [{"scope": SCOPE, "topic": "order.shipped", "event_id": f"e{n}", "payload": payload}
              for n, payload in enumerate(payloads())]
    n = EVENTS * SUBSCRIBERS
    async with outbox(dialect) as (box, sizes, database_cpu):
        stored, written = await sizes()
        began = time.perf_counter()
        results = await box.publish_each(events)
        publish_seconds = time.perf_counter() - began
        stored_after, written_after = await sizes()
        made_intents = sum(len(r.event.fanout) for r in results if hasattr(r, "event"))
        if made_intents != n:
            raise BenchError(f"{design} {dialect}: {made_intents} intents made, not {n}")
        fanned_out, worker_us, database_us = await deliveries_per_second(box, n, database_cpu)
        _, written_delivered = await sizes()
        for lo in range(0, n, EVENTS):
            await box.enqueue_each([{"scope": SCOPE, "destination": f"d{i % SUBSCRIBERS:02}", "action_id": f"d-{i}",
                                     "payload": events[i // SUBSCRIBERS]["payload"]} for i in range(lo, lo + EVENTS)])
        direct, direct_worker_us, direct_database_us = await deliveries_per_second(box, n, database_cpu, before=n)
    return {"publish_seconds": publish_seconds, "stored": stored_after - stored, "written": written_after - written,
            "deliveries_per_second": fanned_out, "delivery_written": written_delivered - written_after,
            "worker_us": worker_us, "database_us": database_us, "direct_per_second": direct,
            "direct_worker_us": direct_worker_us, "direct_database_us": direct_database_us}


# -- the parent: rounds of every design, each in its own process ---------------------------------


def run_child(design: str, dialect: str, tree: Path) -> dict[str, float]:
    """``child(design, dialect)`` in a fresh process importing ``outbox`` and ``sender`` from ``tree``."""
    env = harness.clean_env(PYTHONPATH=os.pathsep.join([str(tree), str(Path(__file__).parent)]))
    done = subprocess.run([sys.executable, __file__, "--child", design, dialect], env=env, cwd=tree,
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT_SECONDS)
    if done.returncode != 0:
        raise BenchError(f"{design} on {dialect} ({tree}) failed:\n{done.stderr[-3000:]}")
    found: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def report(dialect: str, rounds: list[dict[str, dict[str, float]]]) -> None:
    designs = list(rounds[0])

    def median(design: str, figure: str) -> float:
        return statistics.median(r[design][figure] for r in rounds)

    def ratio(design: str, figure: str, to: str = "copied") -> str:
        ratios = [r[design][figure] / r[to][figure] for r in rounds if r[to][figure]]
        return f"{statistics.median(ratios):.2f}x" if ratios else "-"

    print(f"\n{dialect}: {EVENTS} events x {SUBSCRIBERS} subscribers in one publish_each "
          f"({EVENTS * SUBSCRIBERS:,} intents), medians of {len(rounds)} rounds; ratios to 'copied' in the same round")
    stored = "database + WAL grew" if dialect == "sqlite" else "database grew"
    wrote = "write() bytes" if dialect == "sqlite" else "WAL (cluster)"
    print(f"  {'design':<8} {'publish s':>10} {stored:>20} {wrote:>14} | {'deliveries/s':>13} {wrote:>14}"
          f" | {'direct/s':>9}")
    figures = ("publish_seconds", "stored", "written", "deliveries_per_second", "delivery_written", "direct_per_second")
    for design in designs:
        print(f"  {design:<8} {median(design, 'publish_seconds'):>7.2f} s {median(design, 'stored') / 1e6:>17.1f} MB"
              f" {median(design, 'written') / 1e6:>11.1f} MB | {median(design, 'deliveries_per_second'):>13,.0f}"
              f" {median(design, 'delivery_written') / 1e6:>11.1f} MB | {median(design, 'direct_per_second'):>9,.0f}")
        print(f"  {'':<8} CPU per delivery, us: fanned out {median(design, 'worker_us'):,.0f} worker"
              f" + {median(design, 'database_us'):,.0f} database; direct {median(design, 'direct_worker_us'):,.0f}"
              f" + {median(design, 'direct_database_us'):,.0f}")
        for to in ("copied", "main"):
            if design != to and to in designs and (to == "copied" or design == "shared"):
                a, b, c, d, e, f = (ratio(design, figure, to) for figure in figures)
                print(f"  {'vs ' + to:>8} {a:>10} {b:>20} {c:>14} | {d:>13} {e:>14} | {f:>9}"
                      f"   CPU: fanned out {ratio(design, 'worker_us', to)} + {ratio(design, 'database_us', to)},"
                      f" direct {ratio(design, 'direct_worker_us', to)} + {ratio(design, 'direct_database_us', to)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one round")
    parser.add_argument("--only", choices=("sqlite", "postgres"), help="one store only")
    parser.add_argument("--main-tree", type=Path, help="a checkout whose code runs as the design 'main'")
    parser.add_argument("--child", nargs=2, metavar=("DESIGN", "DIALECT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(child(*args.child))))
        return 0
    designs = [("shared", TREE), ("copied", TREE)] + ([("main", args.main_tree.resolve())] if args.main_tree else [])
    rounds = 1 if args.quick else args.rounds
    size = sum(len(json.dumps(p, separators=(",", ":"))) for p in payloads())
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; {size / 1e6:.2f} MB of payload in the batch")
    try:
        for dialect in (args.only,) if args.only else ("sqlite", "postgres"):
            measured: list[dict[str, dict[str, float]]] = []
            for r in range(rounds):
                order = designs if r % 2 == 0 else designs[::-1]  # (each goes first in turn)
                found = {design: run_child(design if design != "main" else "shared", dialect, tree)
                         for design, tree in order}
                measured.append({design: found[design] for design, _ in designs})
            report(dialect, measured)
    except BenchError as exc:
        print(f"invalid measurement: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
