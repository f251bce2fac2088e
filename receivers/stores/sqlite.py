"""The SQLite record store (aiosqlite): records in a file, each claim durable before its handler runs."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..records import (
    ClaimRequest,
    ClaimResult,
    ProbeResult,
    Record,
    Replay,
    State,
    StoredResponse,
    StoreUnavailable,
    claimed,
    decide_claim,
    decide_complete,
    decide_probe,
    decide_release,
    distinct_runs,
    refusal,
)
from ..sqlite_writer import SQLITE, GroupCommitter, from_us, to_us
from .rows import QUERIES, columns, identity_of, stored_response, table_name

if TYPE_CHECKING:
    import sqlite3

    import aiosqlite

T = TypeVar("T")
#: Expired records a SQLite store deletes per transaction when purging.
PURGE_BATCH = 5_000


def _row(record: Record) -> tuple[Any, ...]:
    """The record as SQLite's ``put`` takes it (times as integer microseconds)."""
    values = list(columns(record))
    values[4], values[5] = to_us(values[4]), to_us(values[5])
    return (record.identity, *values)


def _unhex(text: str | None) -> bytes | None:
    return None if text is None else bytes.fromhex(text)


class SqliteRecordStore:
    """Records in a SQLite file (WAL, ``synchronous=FULL``): a claim is durable before the
    handler runs. Concurrent requests share commits (group commit)."""

    def __init__(self, path: str | Path, *, table: str = "idempotency_records", busy_timeout_ms: int = 5000):
        self.path = Path(path).absolute()  # where it was named, whatever the cwd at first request
        self.table = table_name(table)
        self._sql = {k: v.format(table=self.table) for k, v in QUERIES.load("sqlite").items()}
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
            response=stored_response(row["status"], row["headers"], row["body"], row["body_stored"]),
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

    def _remember(self, *identities: str) -> None:
        """Keep ``identities`` as completed here (the last 100,000; a batch's at once, not one call each)."""
        completed = self._completed
        completed.update(dict.fromkeys(identities))
        for _ in range(len(completed) - 100_000):
            completed.pop(next(iter(completed)))

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
        for batch in distinct_runs(requests, identity_of):
            params = {"requests": json.dumps(batch),  # each request a [identity, fingerprint, fence] array
                      "unfenced": json.dumps([r.identity for r in batch if r.fence is None]), **times}
            epochs = dict(conn.execute(self._sql["claim_many"], params).fetchall())
            refused = json.dumps([r.identity for r in batch if r.identity not in epochs])
            found = {} if refused == "[]" else {
                row["identity"]: self._record(row) for row in conn.execute(self._sql["get_many"], (refused,))}
            answers += [claimed(epochs[r.identity]) if r.identity in epochs else
                        refusal(found.get(r.identity), r, now=now, lease_until=lease_until, expires_at=expires_at)
                        for r in batch]
        return answers

    def _complete_rows(self, conn: sqlite3.Connection, done: Sequence[tuple[str, int, StoredResponse]],
                       expires_at: datetime) -> list[bool]:
        answers: list[bool] = []
        for batch in distinct_runs(done, identity_of):
            rows = json.dumps([(ident, epoch, r.status, r.headers, None if r.body is None else r.body.hex())
                               for ident, epoch, r in batch])
            completed = {row[0] for row in conn.execute(self._sql["complete_many"],
                                                        {"done": rows, "expires_at": to_us(expires_at)})}
            answers += [ident in completed for ident, _, _ in batch]
        return answers

    def _remember_replays(self, requests: Sequence[ClaimRequest], answers: Sequence[ClaimResult]) -> None:
        self._remember(*[request.identity for request, answer in zip(requests, answers, strict=True)
                         if isinstance(answer, Replay)])

    def _remember_completed(self, done: Sequence[tuple[str, int, StoredResponse]], answers: Sequence[bool]) -> None:
        self._remember(*[identity for (identity, _, _), completed in zip(done, answers, strict=True) if completed])

    async def release_many(self, held: Sequence[tuple[str, int]]) -> list[bool]:
        def run(conn: sqlite3.Connection) -> list[bool]:
            answers: list[bool] = []
            for batch in distinct_runs(held, identity_of):
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
