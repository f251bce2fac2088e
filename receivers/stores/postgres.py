"""The PostgreSQL record store (asyncpg): many receiver processes on many hosts share one table."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, TypeVar

from ..records import (
    ClaimRequest,
    ClaimResult,
    ProbeResult,
    Record,
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
from .rows import QUERIES, columns, identity_of, stored_response, table_name

T = TypeVar("T")


async def _keep_session(conn: Any) -> None:
    """How the store's pool resets a connection given back: asyncpg still rolls back a transaction
    left open, and nothing else needs undoing (the store's session settings are set once, when a
    connection opens), so the default reset's round trip per call is saved."""


#: The store's sessions never scan the table: every statement names its rows by key. A batch's
#: completions and releases join it to the table, and while the table's statistics lag behind its
#: growth (a new or fast-filling table) the planner would hash the whole table for each batch.
_SESSION = {"enable_seqscan": "off"}


class PostgresRecordStore:
    """Records in PostgreSQL (asyncpg): many receiver processes on many hosts share one table."""

    def __init__(self, dsn: str, *, table: str = "idempotency_records", pool_size: int = 10):
        self.dsn = dsn
        self.table = table_name(table)
        self._sql = {k: v.format(table=self.table) for k, v in QUERIES.load("postgres").items()}
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
            response=stored_response(row["status"], row["headers"], row["body"], row["body_stored"]),
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
                if await conn.fetchval(self._sql["insert"], new.identity, *columns(new)) is None:
                    # another request created it meanwhile: decide again on what it wrote
                    found = self._record(await conn.fetchrow(self._sql["lock"], identity))
                    result, new = decide(found)
                    if new is not None:
                        await conn.execute(self._sql["update"], new.identity, *columns(new))
                return result
            await conn.execute(self._sql["update"], new.identity, *columns(new))
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
        async with self._transaction(atomic=len(distinct_runs(done, identity_of)) > 1) as conn:
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
        for batch in distinct_runs(requests, identity_of):
            rows = await conn.fetch(self._sql["claim_many"], [r.identity for r in batch],
                                    [r.fingerprint for r in batch], [r.fence for r in batch], now, lease_until,
                                    expires_at, [r.identity for r in batch if r.fence is None])
            epochs = dict(rows)
            refused = [r.identity for r in batch if r.identity not in epochs]
            found = {} if not refused else {
                row["identity"]: self._record(row) for row in await conn.fetch(self._sql["get_many"], refused)}
            answers += [claimed(epochs[r.identity]) if r.identity in epochs else
                        refusal(found.get(r.identity), r, now=now, lease_until=lease_until, expires_at=expires_at)
                        for r in batch]
        return answers

    async def _complete_rows(self, conn: Any, done: Sequence[tuple[str, int, StoredResponse]],
                             expires_at: datetime) -> list[bool]:
        answers: list[bool] = []
        for batch in distinct_runs(done, identity_of):
            rows = await conn.fetch(self._sql["complete_many"], [ident for ident, _, _ in batch],
                                    [epoch for _, epoch, _ in batch], [r.status for _, _, r in batch],
                                    json.dumps([r.headers for _, _, r in batch]), [r.body for _, _, r in batch],
                                    expires_at)
            completed = {row[0] for row in rows}
            answers += [ident in completed for ident, _, _ in batch]
        return answers

    async def release_many(self, held: Sequence[tuple[str, int]]) -> list[bool]:
        answers: list[bool] = []
        if not held:
            return answers
        runs = distinct_runs(held, identity_of)
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
