"""Record stores: in memory (tests, one process), SQLite (aiosqlite) and PostgreSQL (asyncpg).

A single claim, completion, release or probe reads the current record and writes back what
``receivers.records`` decides, atomically: SQLite inside a group-committed transaction (durable
before the handler runs), PostgreSQL under ``SELECT … FOR UPDATE``, memory under a lock.

A batch (the Kafka consumer's ``claim_many``, ``complete_many``, ``release_many``) runs as one
statement over the whole batch in the SQL stores, whatever its size: the same rules spelled in
SQL (``INSERT … ON CONFLICT DO UPDATE … WHERE`` for claims, ``UPDATE … FROM`` for the rest, over
``unnest`` arrays or ``json_each``), each row guarded on its own, and the refused claims read back
to say why; the conformance suite checks the batch rules against ``decide_claim``. A store
imports its driver when it is opened.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ._sql import Queries
from ._sqlite import SQLITE, GroupCommitter, from_us, to_us
from .records import (
    Claimed,
    ClaimRequest,
    ClaimResult,
    ProbeResult,
    Record,
    Replay,
    State,
    StoredResponse,
    StoreUnavailable,
    decide_claim,
    decide_complete,
    decide_probe,
    decide_release,
    distinct_runs,
    refusal,
)

if TYPE_CHECKING:
    import sqlite3

    import aiosqlite

T = TypeVar("T")
_QUERIES = Queries(__package__)
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
#: Expired records a SQLite store deletes per transaction when purging.
PURGE_BATCH = 5_000


def _table(name: str) -> str:
    if not _IDENTIFIER.match(name):
        raise ValueError(f"table name {name!r} is not a plain SQL identifier")
    return name


def _response(status: int | None, headers: str | None, body: bytes | None, stored: Any) -> StoredResponse | None:
    if status is None:
        return None
    pairs = tuple((k, v) for k, v in json.loads(headers or "[]"))
    return StoredResponse(status, pairs, bytes(body) if stored and body is not None else None)


def _columns(r: Record) -> tuple[Any, ...]:
    """The record's columns after ``identity``, in table order (times as the dialect wants)."""
    response = r.response
    return (
        r.fingerprint, r.state.value, r.epoch, r.min_fence, r.lease_expires_at, r.expires_at,
        response.status if response else None,
        json.dumps([list(pair) for pair in response.headers]) if response else None,
        response.body if response else None,
        bool(response and response.body is not None),
    )


def _row(record: Record) -> tuple[Any, ...]:
    """The record as SQLite's ``put`` takes it (times as integer microseconds)."""
    columns = list(_columns(record))
    columns[4], columns[5] = to_us(columns[4]), to_us(columns[5])
    return (record.identity, *columns)


async def _keep_session(conn: Any) -> None:
    """How the PostgreSQL store's pool resets a connection given back: asyncpg still rolls back a
    transaction left open, and nothing else needs undoing (the store sets no session state), so
    the default reset's round trip per call is saved."""


#: The store's sessions never scan the table: every statement names its rows by key. A batch's
#: completions and releases join it to the table, and while the table's statistics lag behind its
#: growth (a new or fast-filling table) the planner would hash the whole table for each batch.
_SESSION = {"enable_seqscan": "off"}


def _unhex(text: str | None) -> bytes | None:
    return None if text is None else bytes.fromhex(text)


def _identity(request: ClaimRequest) -> str:
    return request.identity


def _first(item: tuple[Any, ...]) -> str:
    identity: str = item[0]
    return identity


#: A record as the memory store keeps it (after its identity): plain values only, so that the
#: garbage collector stops tracking it and a store of many records does not slow every collection.
_Packed = tuple[str | None, str, int, int, datetime | None, datetime, int | None, tuple[tuple[str, str], ...],
                bytes | None]
_STATES = {state.value: state for state in State}
_VALUES = {state: state.value for state in State}


class MemoryRecordStore:
    """Records in a dict: for tests and single-process experiments (nothing survives a restart)."""

    def __init__(self) -> None:
        self._records: dict[str, _Packed] = {}
        self._lock = asyncio.Lock()
        self.available = True  # tests turn it off to see the middleware answer 503

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def _read(self, identity: str) -> Record | None:
        packed = self._records.get(identity)
        if packed is None:
            return None
        fingerprint, state, epoch, min_fence, lease_expires_at, expires_at, status, headers, body = packed
        return Record(identity, fingerprint, _STATES[state], epoch, min_fence, lease_expires_at, expires_at,
                      None if status is None else StoredResponse(status, headers, body))

    def _keep(self, record: Record) -> None:
        response = record.response
        self._records[record.identity] = (
            record.fingerprint, _VALUES[record.state], record.epoch, record.min_fence, record.lease_expires_at,
            record.expires_at, *((response.status, response.headers, response.body) if response else (None, (), None)))

    def _check(self) -> None:
        if not self.available:
            raise StoreUnavailable("the in-memory record store is switched off")

    async def claim(self, identity: str, fingerprint: str, *, fence: int | None, now: datetime,
                    lease_until: datetime, expires_at: datetime) -> ClaimResult:
        async with self._lock:
            self._check()
            result, new = decide_claim(self._read(identity), identity, fingerprint, fence=fence,
                                       now=now, lease_until=lease_until, expires_at=expires_at)
            if new is not None:
                self._keep(new)
            return result

    async def complete(self, identity: str, epoch: int, response: StoredResponse, *,
                       expires_at: datetime) -> bool:
        async with self._lock:
            self._check()
            new = decide_complete(self._read(identity), epoch, response, expires_at)
            if new is not None:
                self._keep(new)
            return new is not None

    async def release(self, identity: str, epoch: int) -> bool:
        async with self._lock:
            self._check()
            new = decide_release(self._read(identity), epoch)
            if new is not None:
                self._keep(new)
            return new is not None

    async def claim_many(self, requests: Sequence[ClaimRequest], *, now: datetime, lease_until: datetime,
                         expires_at: datetime) -> list[ClaimResult]:
        async with self._lock:
            self._check()
            return self._claim_all(requests, now, lease_until, expires_at)

    async def complete_many(self, done: Sequence[tuple[str, int, StoredResponse]], *,
                            expires_at: datetime) -> list[bool]:
        async with self._lock:
            self._check()
            return self._complete_all(done, expires_at)

    async def complete_and_claim(self, done: Sequence[tuple[str, int, StoredResponse]],
                                 requests: Sequence[ClaimRequest], *, now: datetime, lease_until: datetime,
                                 expires_at: datetime) -> tuple[list[bool], list[ClaimResult]]:
        async with self._lock:
            self._check()
            return self._complete_all(done, expires_at), self._claim_all(requests, now, lease_until, expires_at)

    def _claim_all(self, requests: Sequence[ClaimRequest], now: datetime, lease_until: datetime,
                   expires_at: datetime) -> list[ClaimResult]:
        answers = []
        for request in requests:
            result, new = decide_claim(self._read(request.identity), request.identity, request.fingerprint,
                                       fence=request.fence, now=now, lease_until=lease_until, expires_at=expires_at)
            if new is not None:
                self._keep(new)
            answers.append(result)
        return answers

    def _complete_all(self, done: Sequence[tuple[str, int, StoredResponse]], expires_at: datetime) -> list[bool]:
        answers = []
        for identity, epoch, response in done:
            new = decide_complete(self._read(identity), epoch, response, expires_at)
            if new is not None:
                self._keep(new)
            answers.append(new is not None)
        return answers

    async def release_many(self, held: Sequence[tuple[str, int]]) -> list[bool]:
        async with self._lock:
            self._check()
            answers = []
            for identity, epoch in held:
                new = decide_release(self._read(identity), epoch)
                if new is not None:
                    self._keep(new)
                answers.append(new is not None)
            return answers

    async def probe(self, identity: str, fence: int, *, now: datetime, expires_at: datetime) -> ProbeResult:
        async with self._lock:
            self._check()
            result, new = decide_probe(self._read(identity), identity, fence, now=now,
                                       expires_at=expires_at)
            self._keep(new)
            return result

    async def get(self, identity: str) -> Record | None:
        return self._read(identity)

    async def purge(self, now: datetime) -> int:
        async with self._lock:
            gone = [k for k, packed in self._records.items() if packed[5] <= now]
            for key in gone:
                del self._records[key]
            return len(gone)


class SqliteRecordStore:
    """Records in a SQLite file (WAL, ``synchronous=FULL``): a claim is durable before the
    handler runs. Concurrent requests share commits (group commit)."""

    def __init__(self, path: str | Path, *, table: str = "idempotency_records", busy_timeout_ms: int = 5000):
        self.path = Path(path).absolute()  # where it was named, whatever the cwd at first request
        self.table = _table(table)
        self._sql = {k: v.format(table=self.table) for k, v in _QUERIES.load("sqlite").items()}
        self._busy_timeout_ms = busy_timeout_ms
        self._committer: GroupCommitter | None = None
        self._reader: aiosqlite.Connection | None = None
        #: Identities seen completed here: their duplicates are answered from the reader.
        self._completed: dict[str, None] = {}

    async def open(self) -> None:
        if self._committer is not None:
            return
        writer = await SQLITE.connect(self.path, busy_timeout_ms=self._busy_timeout_ms, script=self._sql["create"])
        try:
            self._reader = await SQLITE.connect(self.path, busy_timeout_ms=self._busy_timeout_ms,
                                                script="PRAGMA query_only = ON;")
        except StoreUnavailable:
            await writer.close()
            raise
        # A batch's bodies travel as hex inside its JSON: SQLite before 3.41 has no unhex().
        await SQLITE.on_thread(writer, lambda conn: conn.create_function("unhex_blob", 1, _unhex, deterministic=True))
        self._committer = GroupCommitter(writer)

    async def close(self) -> None:
        if self._committer is not None:
            await self._committer.idle()
            await self._committer.db.close()
            self._committer = None
        if self._reader is not None:
            await self._reader.close()
            self._reader = None

    def _write(self, job: Callable[[sqlite3.Connection], T]) -> Any:
        if self._committer is None:
            raise StoreUnavailable("the record store is not open")
        return self._committer.write(job)

    def _read(self, conn: sqlite3.Connection, identity: str) -> Record | None:
        row = conn.execute(self._sql["get"], (identity,)).fetchone()
        return None if row is None else self._record(row)

    @staticmethod
    def _record(row: sqlite3.Row) -> Record:
        return Record(
            identity=row["identity"], fingerprint=row["fingerprint"], state=State(row["state"]),
            epoch=row["epoch"], min_fence=row["min_fence"], lease_expires_at=from_us(row["lease_expires_at"]),
            expires_at=from_us(row["expires_at"]),
            response=_response(row["status"], row["headers"], row["body"], row["body_stored"]),
        )

    def _put(self, conn: sqlite3.Connection, record: Record) -> None:
        conn.execute(self._sql["put"], _row(record))

    async def claim(self, identity: str, fingerprint: str, *, fence: int | None, now: datetime,
                    lease_until: datetime, expires_at: datetime) -> ClaimResult:
        def decide(conn: sqlite3.Connection) -> tuple[ClaimResult, Record | None]:
            return decide_claim(self._read(conn, identity), identity, fingerprint, fence=fence,
                                now=now, lease_until=lease_until, expires_at=expires_at)

        # A duplicate of a completed request changes nothing: answer it from the reader instead
        # of queueing behind durable writes. Keys not known to be completed go straight to a write.
        if identity in self._completed and self._reader is not None:
            result, new = await SQLITE.on_thread(self._reader, decide)
            if new is None:
                return result

        def run(conn: sqlite3.Connection) -> ClaimResult:
            result, new = decide(conn)
            if new is not None:
                self._put(conn, new)
            return result

        result = await self._write(run)
        if isinstance(result, Replay):
            self._remember(identity)
        return result

    def _remember(self, identity: str) -> None:
        if len(self._completed) >= 100_000:
            self._completed.pop(next(iter(self._completed)))
        self._completed[identity] = None

    async def complete(self, identity: str, epoch: int, response: StoredResponse, *,
                       expires_at: datetime) -> bool:
        def run(conn: sqlite3.Connection) -> bool:
            new = decide_complete(self._read(conn, identity), epoch, response, expires_at)
            if new is not None:
                self._put(conn, new)
            return new is not None

        done = await self._write(run)
        if done:
            self._remember(identity)
        return done

    async def release(self, identity: str, epoch: int) -> bool:
        def run(conn: sqlite3.Connection) -> bool:
            new = decide_release(self._read(conn, identity), epoch)
            if new is not None:
                self._put(conn, new)
            return new is not None

        return await self._write(run)

    async def claim_many(self, requests: Sequence[ClaimRequest], *, now: datetime, lease_until: datetime,
                         expires_at: datetime) -> list[ClaimResult]:
        answers: list[ClaimResult] = await self._write(
            lambda conn: self._claim_rows(conn, requests, now, lease_until, expires_at))
        self._remember_replays(requests, answers)
        return answers

    async def complete_many(self, done: Sequence[tuple[str, int, StoredResponse]], *,
                            expires_at: datetime) -> list[bool]:
        answers: list[bool] = await self._write(lambda conn: self._complete_rows(conn, done, expires_at))
        self._remember_completed(done, answers)
        return answers

    async def complete_and_claim(self, done: Sequence[tuple[str, int, StoredResponse]],
                                 requests: Sequence[ClaimRequest], *, now: datetime, lease_until: datetime,
                                 expires_at: datetime) -> tuple[list[bool], list[ClaimResult]]:
        def run(conn: sqlite3.Connection) -> tuple[list[bool], list[ClaimResult]]:
            return (self._complete_rows(conn, done, expires_at),
                    self._claim_rows(conn, requests, now, lease_until, expires_at))

        completed, answers = await self._write(run)
        self._remember_completed(done, completed)
        self._remember_replays(requests, answers)
        return completed, answers

    def _claim_rows(self, conn: sqlite3.Connection, requests: Sequence[ClaimRequest], now: datetime,
                    lease_until: datetime, expires_at: datetime) -> list[ClaimResult]:
        times = {"now": to_us(now), "lease_until": to_us(lease_until), "expires_at": to_us(expires_at)}
        answers: list[ClaimResult] = []
        for batch in distinct_runs(requests, _identity):
            params = {"requests": json.dumps(batch),  # each request a [identity, fingerprint, fence] array
                      "unfenced": json.dumps([r.identity for r in batch if r.fence is None]), **times}
            epochs = dict(conn.execute(self._sql["claim_many"], params).fetchall())
            refused = json.dumps([r.identity for r in batch if r.identity not in epochs])
            found = {} if refused == "[]" else {
                row["identity"]: self._record(row) for row in conn.execute(self._sql["get_many"], (refused,))}
            answers += [Claimed(epochs[r.identity]) if r.identity in epochs else
                        refusal(found.get(r.identity), r, now=now, lease_until=lease_until, expires_at=expires_at)
                        for r in batch]
        return answers

    def _complete_rows(self, conn: sqlite3.Connection, done: Sequence[tuple[str, int, StoredResponse]],
                       expires_at: datetime) -> list[bool]:
        answers: list[bool] = []
        for batch in distinct_runs(done, _first):
            rows = json.dumps([(ident, epoch, r.status, r.headers, None if r.body is None else r.body.hex())
                               for ident, epoch, r in batch])
            completed = {row[0] for row in conn.execute(self._sql["complete_many"],
                                                        {"done": rows, "expires_at": to_us(expires_at)})}
            answers += [ident in completed for ident, _, _ in batch]
        return answers

    def _remember_replays(self, requests: Sequence[ClaimRequest], answers: Sequence[ClaimResult]) -> None:
        for request, answer in zip(requests, answers, strict=True):
            if isinstance(answer, Replay):
                self._remember(request.identity)

    def _remember_completed(self, done: Sequence[tuple[str, int, StoredResponse]], answers: Sequence[bool]) -> None:
        for (identity, _, _), completed in zip(done, answers, strict=True):
            if completed:
                self._remember(identity)

    async def release_many(self, held: Sequence[tuple[str, int]]) -> list[bool]:
        def run(conn: sqlite3.Connection) -> list[bool]:
            answers: list[bool] = []
            for batch in distinct_runs(held, _first):
                released = {row[0] for row in conn.execute(self._sql["release_many"], (json.dumps(batch),))}
                answers += [ident in released for ident, _ in batch]
            return answers

        answers: list[bool] = await self._write(run)
        return answers

    async def probe(self, identity: str, fence: int, *, now: datetime, expires_at: datetime) -> ProbeResult:
        def run(conn: sqlite3.Connection) -> ProbeResult:
            result, new = decide_probe(self._read(conn, identity), identity, fence, now=now,
                                       expires_at=expires_at)
            self._put(conn, new)
            return result

        return await self._write(run)

    async def get(self, identity: str) -> Record | None:
        if self._committer is None:
            raise StoreUnavailable("the record store is not open")
        return await SQLITE.on_thread(self._committer.db, self._read, identity)

    async def purge(self, now: datetime) -> int:
        """In batches of PURGE_BATCH, each its own transaction, so claims that arrive meanwhile
        commit between them instead of waiting for the whole purge."""
        params = (to_us(now), PURGE_BATCH)
        purged = 0
        while True:
            gone: int = await self._write(lambda conn: conn.execute(self._sql["purge"], params).rowcount)
            purged += gone
            if gone < PURGE_BATCH:
                return purged


class PostgresRecordStore:
    """Records in PostgreSQL (asyncpg): many receiver processes on many hosts share one table."""

    def __init__(self, dsn: str, *, table: str = "idempotency_records", pool_size: int = 10):
        self.dsn = dsn
        self.table = _table(table)
        self._sql = {k: v.format(table=self.table) for k, v in _QUERIES.load("postgres").items()}
        self._pool_size = pool_size
        self._pool: Any = None

    async def open(self) -> None:
        import asyncpg  # only receivers on PostgreSQL need it

        if self._pool is not None:
            return
        pool = None
        try:
            pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=self._pool_size, reset=_keep_session,
                                             server_settings=_SESSION)
            async with pool.acquire() as conn, conn.transaction():
                # CREATE … IF NOT EXISTS races with itself across processes: take turns.
                await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"outbox-records:{self.table}")
                await conn.execute(self._sql["create"])
        except (OSError, asyncpg.PostgresError) as exc:
            if pool is not None:
                await pool.close()
            raise StoreUnavailable(f"cannot reach the PostgreSQL record store: {exc}") from exc
        self._pool = pool

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    @staticmethod
    def _record(row: Any) -> Record | None:
        if row is None:
            return None
        return Record(
            identity=row["identity"], fingerprint=row["fingerprint"], state=State(row["state"]),
            epoch=row["epoch"], min_fence=row["min_fence"], lease_expires_at=row["lease_expires_at"],
            expires_at=row["expires_at"],
            response=_response(row["status"], row["headers"], row["body"], row["body_stored"]),
        )

    @asynccontextmanager
    async def _transaction(self, *, atomic: bool = True) -> AsyncIterator[Any]:
        """A pooled connection, inside a transaction unless it runs a single statement (atomic on
        its own, without BEGIN and COMMIT's round trips); a lost connection raises StoreUnavailable."""
        import asyncpg

        if self._pool is None:
            raise StoreUnavailable("the record store is not open")
        try:
            async with self._pool.acquire() as conn:
                if atomic:
                    async with conn.transaction():
                        yield conn
                else:
                    yield conn
        except (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError) as exc:
            raise StoreUnavailable(f"the PostgreSQL record store is unavailable: {exc}") from exc

    async def _locked(self, identity: str, decide: Callable[[Record | None], tuple[T, Record | None]]) -> T:
        """Run ``decide`` on the locked record and write its answer, in one transaction."""
        async with self._transaction() as conn:
            found = self._record(await conn.fetchrow(self._sql["lock"], identity))
            result, new = decide(found)
            if new is None:
                return result
            if found is None:
                if await conn.fetchval(self._sql["insert"], new.identity, *_columns(new)) is None:
                    # another request created it meanwhile: decide again on what it wrote
                    found = self._record(await conn.fetchrow(self._sql["lock"], identity))
                    result, new = decide(found)
                    if new is not None:
                        await conn.execute(self._sql["update"], new.identity, *_columns(new))
                return result
            await conn.execute(self._sql["update"], new.identity, *_columns(new))
            return result

    async def claim(self, identity: str, fingerprint: str, *, fence: int | None, now: datetime,
                    lease_until: datetime, expires_at: datetime) -> ClaimResult:
        return await self._locked(identity, lambda found: decide_claim(
            found, identity, fingerprint, fence=fence, now=now, lease_until=lease_until, expires_at=expires_at))

    async def complete(self, identity: str, epoch: int, response: StoredResponse, *,
                       expires_at: datetime) -> bool:
        def decide(found: Record | None) -> tuple[bool, Record | None]:
            new = decide_complete(found, epoch, response, expires_at)
            return new is not None, new

        return await self._locked(identity, decide)

    async def release(self, identity: str, epoch: int) -> bool:
        def decide(found: Record | None) -> tuple[bool, Record | None]:
            new = decide_release(found, epoch)
            return new is not None, new

        return await self._locked(identity, decide)

    async def claim_many(self, requests: Sequence[ClaimRequest], *, now: datetime, lease_until: datetime,
                         expires_at: datetime) -> list[ClaimResult]:
        if not requests:
            return []
        async with self._transaction() as conn:
            return await self._claim_rows(conn, requests, now, lease_until, expires_at)

    async def complete_many(self, done: Sequence[tuple[str, int, StoredResponse]], *,
                            expires_at: datetime) -> list[bool]:
        if not done:
            return []
        async with self._transaction(atomic=len(distinct_runs(done, _first)) > 1) as conn:
            return await self._complete_rows(conn, done, expires_at)

    async def complete_and_claim(self, done: Sequence[tuple[str, int, StoredResponse]],
                                 requests: Sequence[ClaimRequest], *, now: datetime, lease_until: datetime,
                                 expires_at: datetime) -> tuple[list[bool], list[ClaimResult]]:
        if not done or not requests:
            return (await self.complete_many(done, expires_at=expires_at),
                    await self.claim_many(requests, now=now, lease_until=lease_until, expires_at=expires_at))
        async with self._transaction() as conn:
            return (await self._complete_rows(conn, done, expires_at),
                    await self._claim_rows(conn, requests, now, lease_until, expires_at))

    async def _claim_rows(self, conn: Any, requests: Sequence[ClaimRequest], now: datetime, lease_until: datetime,
                          expires_at: datetime) -> list[ClaimResult]:
        answers: list[ClaimResult] = []
        for batch in distinct_runs(requests, _identity):
            rows = await conn.fetch(self._sql["claim_many"], [r.identity for r in batch],
                                    [r.fingerprint for r in batch], [r.fence for r in batch], now, lease_until,
                                    expires_at, [r.identity for r in batch if r.fence is None])
            epochs = dict(rows)
            refused = [r.identity for r in batch if r.identity not in epochs]
            found = {} if not refused else {
                row["identity"]: self._record(row) for row in await conn.fetch(self._sql["get_many"], refused)}
            answers += [Claimed(epochs[r.identity]) if r.identity in epochs else
                        refusal(found.get(r.identity), r, now=now, lease_until=lease_until, expires_at=expires_at)
                        for r in batch]
        return answers

    async def _complete_rows(self, conn: Any, done: Sequence[tuple[str, int, StoredResponse]],
                             expires_at: datetime) -> list[bool]:
        answers: list[bool] = []
        for batch in distinct_runs(done, _first):
            rows = await conn.fetch(self._sql["complete_many"], [ident for ident, _, _ in batch],
                                    [epoch for _, epoch, _ in batch], [r.status for _, _, r in batch],
                                    [json.dumps(r.headers) for _, _, r in batch], [r.body for _, _, r in batch],
                                    expires_at)
            completed = {row[0] for row in rows}
            answers += [ident in completed for ident, _, _ in batch]
        return answers

    async def release_many(self, held: Sequence[tuple[str, int]]) -> list[bool]:
        answers: list[bool] = []
        if not held:
            return answers
        runs = distinct_runs(held, _first)
        async with self._transaction(atomic=len(runs) > 1) as conn:
            for batch in runs:
                rows = await conn.fetch(self._sql["release_many"], [ident for ident, _ in batch],
                                        [epoch for _, epoch in batch])
                released = {row[0] for row in rows}
                answers += [ident in released for ident, _ in batch]
        return answers

    async def probe(self, identity: str, fence: int, *, now: datetime, expires_at: datetime) -> ProbeResult:
        return await self._locked(identity, lambda found: decide_probe(
            found, identity, fence, now=now, expires_at=expires_at))

    async def get(self, identity: str) -> Record | None:
        if self._pool is None:
            raise StoreUnavailable("the record store is not open")
        async with self._pool.acquire() as conn:
            return self._record(await conn.fetchrow(self._sql["get"], identity))

    async def purge(self, now: datetime) -> int:
        if self._pool is None:
            raise StoreUnavailable("the record store is not open")
        async with self._pool.acquire() as conn:
            status = await conn.execute(self._sql["purge"], now)
        return int(status.split()[-1])


