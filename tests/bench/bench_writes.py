"""What one delivery writes on PostgreSQL: row versions, index entries, WAL bytes and transactions.

The store alone (bench_postgres's ``bookkeeping``: enqueue_many in batches, then pipelined
``apply`` cycles of starts, outcomes and a claim, nothing sent) on a fresh database; the WAL the
run wrote is read back with ``pg_waldump`` (segments copied with ``pg_read_binary_file``, so
the benchmark needs a superuser, as the tests' server gives) and every record of this
database's relations is counted by relation and kind: heap INSERT, UPDATE, HOT_UPDATE, DELETE
and LOCK (a row lock is a WAL record and a page write too), btree INSERT_LEAF (one index entry),
and the bytes of each. Enqueue and bookkeeping are counted apart; the write transactions are the
distinct transaction ids of this database's records.

``--against DIR`` measures a second checkout of the code as well (``git archive main | tar -x -C DIR``)
in the same run: each round measures both, in turns,
each in a subprocess whose ``PYTHONPATH`` is its checkout, and prints both columns and their
ratio. Counts do not depend on the machine's load; the CPU and time columns do.

    python tests/bench/bench_writes.py [--n N] [--rounds R] [--batch B] [--against DIR] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import asyncpg
import harness
from bench_delivery import fill
from bench_postgres import ADMIN_DSN, bookkeeping, first_claim, fresh_database, open_outbox, postgres_cpu
from harness import BenchError

#: The repository this script belongs to (its code is the "this" column).
HERE = Path(__file__).resolve().parents[2]
#: A WAL record as pg_waldump prints it: its rmgr, total length, transaction, what it does, the first block it names.
RECORD = re.compile(r"rmgr: (\w+)\s+len \(rec/tot\):\s+\d+/\s*(\d+), tx:\s+(\d+), .*?desc: (\w+)"
                    r"(?:.*?blkref #0: rel (\d+)/(\d+)/(\d+))?")
#: The kinds of records counted by name; the rest of a relation's are counted as "other".
KINDS = {("Heap", "INSERT"): "insert", ("Heap", "UPDATE"): "update", ("Heap", "HOT_UPDATE"): "hot update",
         ("Heap", "DELETE"): "delete", ("Heap", "LOCK"): "lock", ("Heap2", "MULTI_INSERT"): "insert",
         ("Btree", "INSERT_LEAF"): "index entry", ("Btree", "INSERT_POST"): "index entry"}


async def wal_position(conn: asyncpg.Connection) -> str:
    """Where the WAL is flushed to now."""
    return str(await conn.fetchval("SELECT pg_current_wal_flush_lsn()::text"))


async def wal_records(conn: asyncpg.Connection, start: str, end: str) -> dict[str, Counter[str]]:
    """This database's WAL records between two positions, by relation name then kind (and the
    kind's bytes as "<kind> bytes"), with "transactions" under "(all)"."""
    names = {str(node): name for node, name in await conn.fetch(
        "SELECT pg_relation_filenode(oid), relname FROM pg_class WHERE pg_relation_filenode(oid) IS NOT NULL")}
    database = str(await conn.fetchval("SELECT oid FROM pg_database WHERE datname = current_database()"))
    segments = await conn.fetch(
        "SELECT name FROM pg_ls_waldir() WHERE name >= pg_walfile_name($1::text::pg_lsn) "
        "AND name <= pg_walfile_name($2::text::pg_lsn) ORDER BY name", start, end)
    with tempfile.TemporaryDirectory(prefix="bench-wal-") as tmp:
        for (name,) in segments:
            Path(tmp, name).write_bytes(await conn.fetchval("SELECT pg_read_binary_file('pg_wal/' || $1)", name))
        dumped = subprocess.run([waldump(), "-p", tmp, "-s", start, "-e", end], capture_output=True, text=True)
    if dumped.returncode != 0:  # (a segment recycled before it was copied, say)
        raise BenchError(f"pg_waldump could not read {start}..{end}: {dumped.stderr.strip()[-500:]}")
    counts: dict[str, Counter[str]] = {}
    transactions: set[str] = set()
    for line in dumped.stdout.splitlines():
        found = RECORD.match(line)
        if found is None or found.group(6) != database:
            continue
        rmgr, size, tx, desc, _, _, node = found.groups()
        kind = KINDS.get((rmgr, desc), "other")
        per = counts.setdefault(names.get(node, str(node)), Counter())
        per[kind] += 1
        per[f"{kind} bytes"] += int(size)
        if tx != "0":
            transactions.add(tx)
    counts["(all)"] = Counter(transactions=len(transactions))
    return counts


def waldump() -> str:
    """The server's pg_waldump."""
    found = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True)
    return str(Path(found.stdout.strip(), "pg_waldump")) if found.returncode == 0 else "pg_waldump"


async def measure(admin_dsn: str, n: int, batch: int) -> dict[str, Any]:
    """One run of this checkout's store: the enqueue's and the bookkeeping's WAL records by
    relation and kind, and the bookkeeping's PostgreSQL CPU (the server's, and its one backend's), and time."""
    from outbox.store.postgres import PostgresStore

    async with fresh_database(admin_dsn) as dsn:
        watch = await asyncpg.connect(dsn)
        try:
            box = await open_outbox(dsn, "http://127.0.0.1:9/hook", batch)
            try:
                before = await wal_position(watch)
                await fill(box, 0, n)
            finally:
                await box.close()
            filled = await wal_position(watch)
            enqueued = await wal_records(watch, before, filled)  # (read at once: a checkpoint may recycle it)
            store = PostgresStore(dsn, pool_size=1)
            await store.open()
            try:
                async with store._connections.pool.acquire() as conn:  # the one backend the store's work runs in
                    backend = conn.get_server_pid()
                pg_before, began = postgres_cpu(), time.perf_counter()
                backend_before = harness.process_cpu(backend)
                await bookkeeping(store, await first_claim(store), n, batch)
                seconds, pg_after = time.perf_counter() - began, postgres_cpu()
                backend_after = harness.process_cpu(backend)
            finally:
                await store.close()
            done = await wal_position(watch)
            statuses = dict(await watch.fetch("SELECT status, count(*) FROM intents GROUP BY status"))
            if statuses != {"delivered": n}:
                raise BenchError(f"intents by status after the run: {statuses}, expected {{'delivered': {n}}}")
            return {"enqueue": enqueued,
                    "delivery": await wal_records(watch, filled, done), "seconds": seconds,
                    "postgres_cpu": None if pg_before is None or pg_after is None else pg_after - pg_before,
                    "backend_cpu": None if backend_before is None or backend_after is None
                    else backend_after - backend_before}
        finally:
            await watch.close()


def in_checkout(checkout: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``measure`` run in a subprocess on the code of ``checkout``."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    done = subprocess.run([sys.executable, __file__, "--child", "--n", str(args.n), "--batch", str(args.batch),
                           "--pg", args.pg], capture_output=True, text=True, env=env, cwd=checkout)
    if done.returncode != 0:
        raise BenchError(f"the run on {checkout} failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.splitlines()[-1]))


def figures(run: dict[str, Any], n: int) -> dict[str, float]:
    """One run's figures per delivery, by row label: each relation's counted kinds and WAL
    bytes, then the sums over relations."""
    got: dict[str, float] = {}
    for phase in ("enqueue", "delivery"):
        total = Counter[str]()
        for relation, counts in run[phase].items():
            total.update(counts)
            for kind, value in counts.items():
                if kind != "other" and not kind.endswith(" bytes"):
                    got[f"{phase}: {relation} {kind}"] = value / n
            got[f"{phase}: {relation} WAL bytes"] = sum(v for k, v in counts.items() if k.endswith(" bytes")) / n
        for kind in ("insert", "update", "hot update", "delete", "lock", "index entry"):
            got[f"{phase}: all {kind}"] = total[kind] / n
        got[f"{phase}: all WAL bytes"] = sum(v for k, v in total.items() if k.endswith(" bytes")) / n
    if run["postgres_cpu"] is not None:
        got["delivery: PostgreSQL CPU, us (machine-wide)"] = run["postgres_cpu"] / n * 1e6
    if run.get("backend_cpu") is not None:
        got["delivery: CPU of the store's backend, us"] = run["backend_cpu"] / n * 1e6
    got["delivery: bookkeeping seconds (all n)"] = run["seconds"]
    return got


def report(runs: dict[str, list[dict[str, Any]]], n: int) -> str:
    """Medians of the rounds per delivery, a column per checkout, and their ratio for two."""
    columns = list(runs)
    medians: dict[str, dict[str, float]] = {name: {} for name in columns}
    for name, measured in runs.items():
        labels = sorted({label for run in measured for label in figures(run, n)})
        for label in labels:
            medians[name][label] = statistics.median(figures(run, n).get(label, 0.0) for run in measured)
    labels = sorted({label for m in medians.values() for label in m},
                    key=lambda label: (label.split(":")[0] != "enqueue", ": all " not in label, label))
    header = ["per delivery (median of rounds)", *columns, *(["ratio"] if len(columns) == 2 else [])]
    lines = [header]
    for label in labels:
        values = [medians[name].get(label, 0.0) for name in columns]
        if max(values) < 0.01:  # a catalog's or a sequence's now and then
            continue
        ratio = [f"{values[0] / values[1]:.2f}x" if values[1] else "-"] if len(columns) == 2 else []
        lines.append([label, *(f"{v:,.2f}" for v in values), *ratio])
    return harness.render_table(lines, right=set(range(1, len(header))))


async def child(args: argparse.Namespace) -> int:
    print(json.dumps(await measure(args.pg, args.n, args.batch)))
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = harness.new_parser(__doc__)
    add = parser.add_argument
    add("--n", type=int, help="intents enqueued and delivered per run (2,000; --quick 200)")
    add("--rounds", type=int, help="runs of each checkout (3; --quick 1)")
    add("--quick", action="store_true", help="--n 200 --rounds 1: a check that it runs, not a measurement")
    add("--batch", type=int, default=32, help="starts, outcomes and claim per apply (32)")
    add("--against", help="a second checkout to measure beside this one (e.g. main's)")
    add("--pg", default=ADMIN_DSN, help=f"the server's administrative DSN ({ADMIN_DSN}; env OUTBOX_TEST_PG_DSN)")
    add("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.n = args.n or (200 if args.quick else 2_000)
    args.rounds = args.rounds or (1 if args.quick else 3)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return harness.run_main(child(args), uvloop=False)
    began = time.perf_counter()
    checkouts = {"this": HERE, **({"against": Path(args.against).resolve()} if args.against else {})}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in checkouts}
    problems: list[str] = []
    for round_ in range(args.rounds):
        names = list(checkouts)[round_ % len(checkouts):] + list(checkouts)[:round_ % len(checkouts)]
        for name in names:
            try:
                runs[name].append(in_checkout(checkouts[name], args))
            except BenchError as exc:
                problems.append(f"round {round_ + 1}, {name}: {exc}")
                continue
            print(f"round {round_ + 1}: {name} measured", flush=True)
    print(f"\nWrites per delivery on PostgreSQL (N={args.n:,}, batch {args.batch}, {args.rounds} rounds; "
          f"{', '.join(f'{k} = {v}' for k, v in checkouts.items())})")
    if all(runs.values()):
        print(report(runs, args.n))
    return harness.finish(began, problems)


if __name__ == "__main__":
    sys.exit(main())
