"""An enqueue inside the application's own transaction, against the application's own insert of a
row of the same size in the same kind of transaction, side by side in the same run.

What an application pays for the outbox is what ``Producer.enqueue`` adds to the transaction it
already has: the intent's checks and digest and the outbox's statements on its connection. The
like-for-like baseline is the application inserting one more row of its own there, of the same
size as the intent's row (its payload, a unique key and the rest of the intent's bytes as text),
with the same driver. Each pair is timed on the same database in the same round, in the order
that alternates between rounds, and the ratio is the median of the per-round ratios:

1. sqlite3 (synchronous): ``Producer.enqueue`` against ``conn.execute(INSERT ...)``, inside
   ``BEGIN IMMEDIATE`` ... ``COMMIT`` of CHUNK operations (only the operations are timed);
2. psycopg 3 (synchronous) on PostgreSQL, the same inside ``with conn.transaction()``;
3. asynchronous: aiosqlite, psycopg's ``AsyncConnection`` and asyncpg with ``AsyncProducer``;
4. the enqueue's SQL alone (sqlite3 and psycopg): its statements, built beforehand, run on the
   connection without the library around them, against the same app insert: what the database
   and the driver spend, the floor under the enqueue's ratio;
5. a transaction each, commit included (sqlite3 and psycopg): the application's insert and
   commit, against its insert, the enqueue and the commit; what an application's request sees.

The target (at most 2x the application's own insert, synchronous) is printed beside the figures;
nothing here asserts on timing. The exit status is non-zero only when a measurement is invalid
(a row or an intent missing).

    python tests/bench/bench_producer.py [--n N] [--rounds R] [--quick] [--no-postgres]
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness
from bench_postgres import ADMIN_DSN, fresh_database

from outbox import AsyncProducer, DestinationSpec, Outbox, Producer, Settings
from outbox.grants import GrantSpec

DESTINATION = "billing"
SCOPE = "acme"
NOTE = "x" * 100
SPEC = DestinationSpec(url="http://127.0.0.1:9/hook", secret="whsec_" + "A" * 44, allow_private_network=True)
#: Operations per timed transaction (the commit between two is not timed).
CHUNK = 100
#: Untimed operations of each kind before a round's timed ones (statement caches, first pages).
WARMUP = 50
TARGET = 2.0
#: The text of an intent's row besides its payload and key (ids, digest, status, times, as stored),
#: given to the application's row so the two are of the same size (measured: about 200 bytes).
PAD = "p" * 200

APP_TABLE = {
    "sqlite": "CREATE TABLE orders (id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, payload TEXT NOT NULL, "
              "pad TEXT NOT NULL, created_at INTEGER NOT NULL)",
    "postgres": "CREATE TABLE orders (id bigserial PRIMARY KEY, key text NOT NULL UNIQUE, payload jsonb NOT NULL, "
                "pad text NOT NULL, created_at timestamptz NOT NULL)",
}
APP_INSERT = {
    "sqlite": "INSERT INTO orders (key, payload, pad, created_at) VALUES (?, ?, ?, ?)",
    "psycopg": "INSERT INTO orders (key, payload, pad, created_at) VALUES (%s, %s, %s, now())",
    "asyncpg": "INSERT INTO orders (key, payload, pad, created_at) VALUES ($1, $2::jsonb, $3, now())",
}


def payload(i: int) -> dict[str, Any]:
    return {"order": i, "note": NOTE}


def app_row(run: str, i: int) -> tuple[Any, ...]:
    """The application's row for operation ``i``: its own key, the payload as JSON, the pad."""
    return f"{run}-{i}", json.dumps(payload(i), separators=(",", ":")), PAD


def intent(run: str, i: int) -> dict[str, Any]:
    return {"destination": DESTINATION, "scope": SCOPE, "action_id": f"{run}-{i}", "payload": payload(i)}


# -- databases ---------------------------------------------------------------------------------


async def prepare(url: str) -> None:
    """Migrate the outbox at ``url``, register DESTINATION with a grant, and make the app's table."""
    settings = Settings(database_url=url, secrets_key_file=harness.key_file()) if url.startswith("postgres") else None
    async with await Outbox.open(url, settings=settings) as box:
        await box.put_destination(DESTINATION, SPEC)
        await box.put_grant("acme-billing", GrantSpec(scope=SCOPE, destination=DESTINATION))
        if url.startswith("sqlite"):
            async with box.transaction() as tx:
                await tx.execute(APP_TABLE["sqlite"])
    if url.startswith("postgres"):
        import asyncpg

        conn = await asyncpg.connect(url)
        try:
            await conn.execute(APP_TABLE["postgres"])
        finally:
            await conn.close()


def count(url: str, table: str) -> int:
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
            return int(db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    import psycopg

    with psycopg.connect(url) as conn:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])  # type: ignore[index]


def row_sizes(path: Path) -> tuple[float, float]:
    """The mean stored text of an intent's row (with its first event's) and of an app's row."""
    with sqlite3.connect(path) as db:
        intents = [r[1] for r in db.execute("PRAGMA table_info(intents)")]
        events = [r[1] for r in db.execute("PRAGMA table_info(events)")]
        total = " + ".join(f"coalesce(length(CAST({c} AS BLOB)), 0)" for c in intents)
        event_total = " + ".join(f"coalesce(length(CAST(e.{c} AS BLOB)), 0)" for c in events)
        outbox = db.execute(f"SELECT avg({total}) FROM intents").fetchone()[0]
        logged = db.execute(f"SELECT avg({event_total}) FROM events e").fetchone()[0]
        orders = [r[1] for r in db.execute("PRAGMA table_info(orders)")]
        app_total = " + ".join(f"coalesce(length(CAST({c} AS BLOB)), 0)" for c in orders)
        app = db.execute(f"SELECT avg({app_total}) FROM orders").fetchone()[0]
    return float(outbox) + float(logged), float(app)


def chunks(n: int) -> list[tuple[int, int]]:
    """The transactions of a side: WARMUP untimed operations (negative numbers), then ``n`` timed,
    CHUNK a transaction."""
    return [(-WARMUP, 0), *((lo, min(lo + CHUNK, n)) for lo in range(0, n, CHUNK))]


# -- one side of a pair: operations per second on one driver -----------------------------------


@dataclass
class Side:
    """A case's timed operations: seconds for ``n`` of them, and how many rows they made."""

    seconds: float = 0.0
    n: int = 0

    @property
    def us(self) -> float:
        return self.seconds / self.n * 1e6


def sqlite3_side(path: Path, run: str, n: int, enqueue: bool, producer: Producer) -> Side:
    """``n`` operations (app inserts or enqueues) on one sqlite3 connection, CHUNK a transaction."""
    conn = sqlite3.connect(path, timeout=30)
    side = Side()
    try:
        for lo, hi in chunks(n):
            conn.execute("BEGIN IMMEDIATE")
            began = time.perf_counter()
            if enqueue:
                for i in range(lo, hi):
                    producer.enqueue(conn, **intent(run, i))
            else:
                for i in range(lo, hi):
                    conn.execute(APP_INSERT["sqlite"], (*app_row(run, i), i))
            took = time.perf_counter() - began
            conn.commit()
            if lo >= 0:
                side.seconds += took
                side.n += hi - lo
    finally:
        conn.close()
    return side


def psycopg_side(url: str, run: str, n: int, enqueue: bool, producer: Producer) -> Side:
    import psycopg

    side = Side()
    with psycopg.connect(url) as conn:
        for lo, hi in chunks(n):
            with conn.transaction():
                began = time.perf_counter()
                if enqueue:
                    for i in range(lo, hi):
                        producer.enqueue(conn, **intent(run, i))
                else:
                    for i in range(lo, hi):
                        conn.execute(APP_INSERT["psycopg"], app_row(run, i))
                took = time.perf_counter() - began
            if lo >= 0:
                side.seconds += took
                side.n += hi - lo
    return side


async def aiosqlite_side(path: Path, run: str, n: int, enqueue: bool, producer: AsyncProducer) -> Side:
    import aiosqlite

    side = Side()
    async with aiosqlite.connect(path, timeout=30) as conn:
        for lo, hi in chunks(n):
            await conn.execute("BEGIN IMMEDIATE")
            began = time.perf_counter()
            if enqueue:
                for i in range(lo, hi):
                    await producer.enqueue(conn, **intent(run, i))
            else:
                for i in range(lo, hi):
                    await conn.execute(APP_INSERT["sqlite"], (*app_row(run, i), i))
            took = time.perf_counter() - began
            await conn.commit()
            if lo >= 0:
                side.seconds += took
                side.n += hi - lo
    return side


async def psycopg_async_side(url: str, run: str, n: int, enqueue: bool, producer: AsyncProducer) -> Side:
    import psycopg

    side = Side()
    async with await psycopg.AsyncConnection.connect(url) as conn:
        for lo, hi in chunks(n):
            async with conn.transaction():
                began = time.perf_counter()
                if enqueue:
                    for i in range(lo, hi):
                        await producer.enqueue(conn, **intent(run, i))
                else:
                    for i in range(lo, hi):
                        await conn.execute(APP_INSERT["psycopg"], app_row(run, i))
                took = time.perf_counter() - began
            if lo >= 0:
                side.seconds += took
                side.n += hi - lo
    return side


async def asyncpg_side(url: str, run: str, n: int, enqueue: bool, producer: AsyncProducer) -> Side:
    import asyncpg

    side = Side()
    conn = await asyncpg.connect(url)
    try:
        for lo, hi in chunks(n):
            async with conn.transaction():
                began = time.perf_counter()
                if enqueue:
                    for i in range(lo, hi):
                        await producer.enqueue(conn, **intent(run, i))
                else:
                    for i in range(lo, hi):
                        await conn.execute(APP_INSERT["asyncpg"], *app_row(run, i))
                took = time.perf_counter() - began
            if lo >= 0:
                side.seconds += took
                side.n += hi - lo
    finally:
        await conn.close()
    return side


def prepared_statements(dialect: str, run: str, n: int, producer: Producer) -> list[tuple[Any, Any]]:
    """Each operation's insert and first-event statements as the enqueue runs them (the intent
    validated and the statements built here, untimed), warm-up first."""
    from outbox import Status
    from outbox.store.intake import Intake
    from outbox.store.postgres.drivers import READ
    from outbox.store.postgres.intake import PostgresIntake
    from outbox.store.sqlite.intake import INTAKE

    statements: Intake = INTAKE if dialect == "sqlite" else PostgresIntake(READ)
    found = {"channel": "webhook", "requires_approval": False}
    made = []
    for i in range(-WARMUP, n):
        new, event = producer.intake.intent(**intent(run, i))
        made.append((statements.insert_intent((new, event, "webhook", Status.PENDING), found),
                     statements.first_events([(0, event)])))
    return made


def sqlite3_sql_side(path: Path, run: str, n: int, enqueue: bool, producer: Producer) -> Side:
    """``sqlite3_side`` with, for the enqueue, only its statements (the write lock's, the
    intent's insert, its first event's) run on the connection: what SQLite itself spends."""
    if not enqueue:
        return sqlite3_side(path, run, n, enqueue, producer)
    from outbox.store.sqlite.sql import SQL

    statements = prepared_statements("sqlite", run, n, producer)
    lock = SQL["take_write_lock"]
    conn = sqlite3.connect(path, timeout=30)
    side = Side()
    try:
        for lo, hi in chunks(n):
            conn.execute("BEGIN IMMEDIATE")
            began = time.perf_counter()
            for i in range(lo, hi):
                insert, logged = statements[i + WARMUP]
                conn.execute(lock)
                seq = conn.execute(insert.sql, insert.args).fetchone()[0]
                conn.execute(logged.sql, (seq, *logged.args[1:]))
            took = time.perf_counter() - began
            conn.commit()
            if lo >= 0:
                side.seconds += took
                side.n += hi - lo
    finally:
        conn.close()
    return side


def psycopg_sql_side(url: str, run: str, n: int, enqueue: bool, producer: Producer) -> Side:
    """``psycopg_side`` with, for the enqueue, only its statement (the intent's insert with its
    first event) run on the connection: what the round trip and PostgreSQL spend."""
    if not enqueue:
        return psycopg_side(url, run, n, enqueue, producer)
    import psycopg

    statements = prepared_statements("postgres", run, n, producer)
    side = Side()
    with psycopg.connect(url) as conn:
        cursor = psycopg.RawCursor(conn)
        for lo, hi in chunks(n):
            with conn.transaction():
                began = time.perf_counter()
                for i in range(lo, hi):
                    insert, _ = statements[i + WARMUP]
                    cursor.execute(insert.sql, insert.args).fetchone()
                took = time.perf_counter() - began
            if lo >= 0:
                side.seconds += took
                side.n += hi - lo
    return side


def sqlite3_committed(path: Path, run: str, n: int, enqueue: bool, producer: Producer) -> Side:
    """``n`` transactions of the application's insert (and, with ``enqueue``, an enqueue), each
    committed: the commit (an fsync in WAL mode with synchronous=FULL) timed too."""
    conn = sqlite3.connect(path, timeout=30, isolation_level="IMMEDIATE")
    side = Side()
    try:
        for i in range(-WARMUP // 5, n):
            began = time.perf_counter()
            conn.execute(APP_INSERT["sqlite"], (*app_row(run, i), i))
            if enqueue:
                producer.enqueue(conn, **intent(run, i))
            conn.commit()
            if i >= 0:
                side.seconds += time.perf_counter() - began
                side.n += 1
    finally:
        conn.close()
    return side


def psycopg_committed(url: str, run: str, n: int, enqueue: bool, producer: Producer) -> Side:
    import psycopg

    side = Side()
    with psycopg.connect(url) as conn:
        for i in range(-WARMUP // 5, n):
            began = time.perf_counter()
            with conn.transaction():
                conn.execute(APP_INSERT["psycopg"], app_row(run, i))
                if enqueue:
                    producer.enqueue(conn, **intent(run, i))
            if i >= 0:
                side.seconds += time.perf_counter() - began
                side.n += 1
    return side


# -- pairs -------------------------------------------------------------------------------------

#: One side: (url or path, the round's unique prefix, n, whether it enqueues) -> its Side.
Runner = Callable[[Any, str, int, bool], Awaitable[Side]]


@dataclass(frozen=True)
class Pair:
    """A case: its name, the store it runs on, the two sides, and the share of ``n`` it runs."""

    name: str
    dialect: str
    run: Runner
    share: float = 1.0
    committed: bool = False  # a transaction each, commit included


def pairs(sync: Producer, aio: AsyncProducer) -> list[Pair]:
    async def on_thread(fn: Callable[..., Side], *args: Any) -> Side:
        return fn(*args)  # (the event loop has nothing else to do meanwhile)

    return [
        Pair("sqlite3", "sqlite", lambda where, r, n, e: on_thread(sqlite3_side, where, r, n, e, sync)),
        Pair("psycopg", "postgres", lambda where, r, n, e: on_thread(psycopg_side, where, r, n, e, sync)),
        Pair("aiosqlite", "sqlite", lambda where, r, n, e: aiosqlite_side(where, r, n, e, aio)),
        Pair("psycopg async", "postgres", lambda where, r, n, e: psycopg_async_side(where, r, n, e, aio)),
        Pair("asyncpg", "postgres", lambda where, r, n, e: asyncpg_side(where, r, n, e, aio)),
        Pair("sqlite3 SQL alone", "sqlite",
             lambda where, r, n, e: on_thread(sqlite3_sql_side, where, r, n, e, sync)),
        Pair("psycopg SQL alone", "postgres",
             lambda where, r, n, e: on_thread(psycopg_sql_side, where, r, n, e, sync)),
        Pair("sqlite3 commit each", "sqlite",
             lambda where, r, n, e: on_thread(sqlite3_committed, where, r, n, e, sync),
             share=0.1, committed=True),
        Pair("psycopg commit each", "postgres",
             lambda where, r, n, e: on_thread(psycopg_committed, where, r, n, e, sync), share=0.25, committed=True),
    ]


@dataclass
class Result:
    """Per-round figures of one pair."""

    app_us: list[float]
    enqueue_us: list[float]
    ratios: list[float]


def timed(pair: Pair, n: int) -> int:
    """The timed operations of a side of ``pair``."""
    return max(10, int(n * pair.share))


def ops(pair: Pair, n: int) -> int:
    """The operations of a side of ``pair``, its warm-up included."""
    return timed(pair, n) + (WARMUP // 5 if pair.committed else WARMUP)


async def measure(pair: Pair, url: str, n: int, round_no: int) -> tuple[float, float]:
    """Both sides of ``pair`` on the database at ``url``, in an order alternating with
    ``round_no``: (the app's µs per operation, the enqueue's)."""
    where: Any = Path(url.removeprefix("sqlite:///")) if pair.dialect == "sqlite" else url
    tag = f"{pair.name.replace(' ', '_').replace(',', '')}-{round_no}"
    sides: dict[bool, Side] = {}
    for enqueue in (False, True) if round_no % 2 == 0 else (True, False):
        sides[enqueue] = await pair.run(where, f"{tag}-{'e' if enqueue else 'a'}", timed(pair, n), enqueue)
    return sides[False].us, sides[True].us


async def fresh_sqlite(root: Path) -> str:
    url = f"sqlite:///{harness.fresh_dir(root, 'producer') / 'o.db'}"
    await prepare(url)
    return url


async def main() -> int:
    parser = harness.new_parser(__doc__)
    parser.add_argument("--n", type=int, default=2000, help="timed operations per side per round (2000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (5)")
    parser.add_argument("--quick", action="store_true", help="--n 300 --rounds 2")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    parser.add_argument("--cases", help="the cases to run, by name, comma-separated (default: all)")
    parser.add_argument("--pg", default=ADMIN_DSN, help=f"the server's administrative DSN ({ADMIN_DSN})")
    args = parser.parse_args()
    harness.require_positive(parser, args, ["n", "rounds"])
    n, rounds = (300, 2) if args.quick else (args.n, args.rounds)
    began = time.perf_counter()
    problems: list[str] = []
    chosen = [p for p in pairs(Producer(), AsyncProducer())
              if not (args.no_postgres and p.dialect == "postgres")
              and (args.cases is None or p.name in args.cases.split(","))]
    print(f"bench_producer: {n} operations a side a round, {rounds} rounds, CHUNK {CHUNK} a transaction")
    print(harness.machine_summary())
    results = {p.name: Result([], [], []) for p in chosen}
    root = Path(tempfile.mkdtemp(prefix="bench-producer-"))
    sizes: tuple[float, float] | None = None
    try:
        for round_no in range(rounds):
            sqlite_url = await fresh_sqlite(root)
            async with fresh_database(args.pg) if not args.no_postgres else _none() as pg_url:
                if pg_url is not None:
                    await prepare(pg_url)
                for pair in chosen:
                    url = sqlite_url if pair.dialect == "sqlite" else pg_url
                    assert url is not None
                    app, enq = await measure(pair, url, n, round_no)
                    result = results[pair.name]
                    result.app_us.append(app)
                    result.enqueue_us.append(enq)
                    result.ratios.append(enq / app)
                for dialect, url in (("sqlite", sqlite_url), ("postgres", pg_url)):
                    mine = [p for p in chosen if p.dialect == dialect]
                    if url is None or not mine:
                        continue
                    intents = sum(ops(p, n) for p in mine)
                    orders = sum(ops(p, n) * (2 if p.committed else 1) for p in mine)
                    for table, expected in (("intents", intents), ("orders", orders)):
                        if (made := count(url, table)) != expected:
                            problems.append(f"{dialect}: {made} rows in {table}, expected {expected}")
            if sizes is None and any(p.dialect == "sqlite" for p in chosen):
                sizes = row_sizes(Path(sqlite_url.removeprefix("sqlite:///")))
            print(f"round {round_no + 1}/{rounds} done", file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    lines = [["case", "app insert", "enqueue", "ratio", "spread", "target"]]
    for pair in chosen:
        result = results[pair.name]
        median, spread = harness.fmt_ratio(result.ratios)
        sync = pair.name in ("sqlite3", "psycopg")
        lines.append([pair.name, f"{statistics.median(result.app_us):,.0f} µs",
                      f"{statistics.median(result.enqueue_us):,.0f} µs", median, spread,
                      f"<= {TARGET:.0f}x" if sync else ""])
    print(harness.render_table(lines, right={1, 2, 3, 4}))
    if sizes is not None:
        print(f"stored text per operation (SQLite): intent and its first event {sizes[0]:.0f} bytes, "
              f"the application's row {sizes[1]:.0f} bytes")
    print("(commit each: the application's insert and commit, against its insert, the enqueue and the commit)")
    return harness.finish(began, problems)


class _none:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    sys.exit(harness.run_main(main(), uvloop=False))
