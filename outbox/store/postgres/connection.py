"""The PostgreSQL store's connections: the pool, how a timestamptz travels, which errors mean
"not now", and work run on a pooled connection again when the server had already ended its
session."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import asyncpg

from ...errors import StoreUnavailable
from .. import records
from .sql import SQL

log = logging.getLogger("outbox.store")
T = TypeVar("T")

#: Longest wait for a pooled connection or a statement's answer: a server that went silent (a
#: network that drops packets) is then "not now" within this, not after the kernel gives up on
#: the connection many minutes later. Migrations get longer.
STATEMENT_SECONDS = 60.0
MIGRATION_SECONDS = 3600.0
#: The transaction of reads that must see one snapshot.
SNAPSHOT: Mapping[str, Any] = {"isolation": "repeatable_read", "readonly": True}

#: Errors that mean "not now" rather than "wrong", answered 503 with Retry-After: the server
#: unreachable or shutting down, the connection lost, resources exhausted, the database not there
#: (yet) or read-only for now, a lock or serialization conflict that a retry resolves.
UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,  # the connection or pool closed under the call
    asyncpg.PostgresConnectionError,  # 08: the connection failed or is gone
    asyncpg.exceptions.OperatorInterventionError,  # 57: shutting down, cannot connect now, cancelled
    asyncpg.exceptions.InsufficientResourcesError,  # 53: disk full, out of memory, too many connections
    asyncpg.exceptions.TransactionRollbackError,  # 40: serialization failure, deadlock
    asyncpg.exceptions.LockNotAvailableError,  # 55P03
    asyncpg.exceptions.InvalidCatalogNameError,  # 3D000: no such database
    asyncpg.exceptions.ReadOnlySQLTransactionError,  # 25006: a standby, or a primary read-only for now
)


def gone(conn: asyncpg.Connection) -> bool:
    """Whether ``conn`` is closed: dropped by asyncpg, or, lost while lent, already taken back by
    the pool (whose proxy then refuses every call)."""
    try:
        return bool(conn.is_closed())
    except asyncpg.InterfaceError:
        return True


def ended_before(exc: BaseException, conn: asyncpg.Connection) -> bool:
    """Whether ``exc`` is asyncpg refusing work on ``conn`` because the server had already ended
    its session, so none of that work took effect.

    The server says goodbye (an error such as ``pg_terminate_backend``'s FATAL) and then closes
    the socket. asyncpg reads a goodbye that comes while the connection is idle as the start of an
    operation and waits for its end, and only the close, read later, tells it the connection is
    gone: a statement in between is refused before anything of it is sent ("cannot switch to
    state 12; another operation (2) is in progress", an InternalClientError) and the connection
    dropped. After the close a statement is refused as well (an InterfaceError), and asyncpg
    ends no transaction on a closed connection, whose session the server rolled back."""
    return isinstance(exc, asyncpg.InternalClientError | asyncpg.InterfaceError) and gone(conn)


@contextmanager
def unavailable(conn: asyncpg.Connection | None = None) -> Iterator[None]:
    """Raise the outbox's StoreUnavailable for the database answering "not now", or for work on
    ``conn`` refused because the server had ended its session (``ended_before``); anything
    else, such as a constraint the caller's own SQL broke or a fault of the driver on a live
    connection, goes through as it is."""
    try:
        yield
    except UNAVAILABLE as exc:
        raise StoreUnavailable(f"the PostgreSQL database is unavailable: {exc}") from exc
    except asyncpg.InternalClientError as exc:
        if conn is None or not ended_before(exc, conn):
            raise
        raise StoreUnavailable("the PostgreSQL database had ended the connection; nothing of the work took effect"
                               ) from exc


#: PostgreSQL's epoch: a timestamptz travels as microseconds from it.
PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _encode_time(value: datetime) -> tuple[int]:
    """A datetime as a timestamptz travels (a naive one in local time, as asyncpg takes it)."""
    if value.tzinfo is None:
        value = value.astimezone(UTC)
    return ((value - PG_EPOCH) // _MICROSECOND,)


def _decode_time(stored: tuple[int]) -> datetime | int:
    """A timestamptz as a UTC datetime; one no datetime can hold (before year 1, after 9999,
    ``infinity``) stays its microseconds, for ``read_time`` to refuse: asyncpg's own decoding
    raises for it, and so failed the whole result it was in (a claim, a listing)."""
    try:
        return PG_EPOCH + stored[0] * _MICROSECOND
    except OverflowError:
        return stored[0]


async def _opened(conn: asyncpg.Connection) -> None:
    """Every pooled connection, once opened: timestamptz read and written through
    ``_decode_time``, and the store's session (``start_session``)."""
    await conn.set_type_codec("timestamptz", schema="pg_catalog", encoder=_encode_time, decoder=_decode_time,
                              format="tuple")
    await start_session(conn)


async def start_session(conn: asyncpg.Connection) -> None:
    """What the store's statements need of a session, set when a connection opens and again after
    a full reset: JIT off. The claim's cost estimate grows with the backlog past
    ``jit_above_cost``, and compiling it then costs more than the claim itself (bench_postgres's
    claim case, README "Running on PostgreSQL"); the store's statements are short and gain
    nothing from it. (A SET rather than a startup parameter, which a session pooler such as
    PgBouncer may refuse.)"""
    await conn.execute("SET jit = off")


def read_time(value: Any) -> Any:
    """A time as ``_decode_time`` gave it; OverflowError for one no datetime can hold."""
    if isinstance(value, int):
        raise OverflowError(f"timestamptz {value} µs from {PG_EPOCH.date()} is beyond what a datetime can hold")
    return value


#: Rows as records: times are timestamptz, JSON columns jsonb (asyncpg gives their text).
READ = records.Reader(read_time)


async def _unchanged(conn: asyncpg.Connection) -> None:
    """What a connection given back to the pool needs beyond asyncpg's own cleanup (an open
    transaction rolled back): nothing, as the store's own statements never change a session (no
    SET but ``start_session``'s, LISTEN or session lock), so the default reset's round trip is
    saved on every release. A connection lent to the caller's SQL (``transaction()``) is reset in
    full, and its session started again, before it goes back."""


class Connections:
    """The pool of one store's connections, and work run on them."""

    def __init__(self, dsn: str, *, pool_size: int, statement_seconds: float) -> None:
        self.dsn = dsn
        self.pool_size = pool_size
        self.statement_seconds = statement_seconds
        self._pool: asyncpg.Pool | None = None

    async def open(self) -> None:
        """Make the pool (connecting its first connection)."""
        if self._pool is not None:
            return
        try:
            self._pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=self.pool_size, reset=_unchanged,
                                                   init=_opened, command_timeout=self.statement_seconds)
        except (*UNAVAILABLE, asyncpg.PostgresError) as exc:
            raise StoreUnavailable(f"cannot use the PostgreSQL database: {exc}") from exc

    async def close(self) -> None:
        """Close the pool, once its connections are given back."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    @property
    def pool(self) -> asyncpg.Pool:
        """The open pool; StoreUnavailable before ``open`` or after ``close``."""
        if self._pool is None:
            raise StoreUnavailable("the store is not open")
        return self._pool

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection for the block, given back after it (see ``release``)."""
        with unavailable():
            conn = await self.pool.acquire(timeout=self.statement_seconds)
        try:
            yield conn
        finally:
            await self.release(conn)

    async def release(self, conn: asyncpg.Connection) -> None:
        """Give a connection back to the pool. One the server dropped under it cannot be reset
        (asyncpg then closes it, and the pool opens another); what was done on it before stands,
        committed or not, so that is not the caller's error: an intent committed just before the
        connection was cut is not answered 500."""
        try:
            await self.pool.release(conn)
        except Exception as exc:
            log.info("a pooled connection could not be reset and was closed (%s: %s)", type(exc).__name__, exc)

    async def run(self, work: Callable[[asyncpg.Connection], Awaitable[T]], *,
                  transaction: Mapping[str, Any] | None = None) -> T:
        """``work`` on a pooled connection, inside a transaction if ``transaction`` gives its
        options (asyncpg's isolation, readonly; empty for the defaults), else as one statement or
        reads only. Work refused because the server had already ended the session of the
        connection taken (``ended_before``: none of it took effect) runs again on another, so a
        connection the server cut is never one more failed operation; each connection taken
        goes back to the pool (``release``), and the pool replaces a dropped one."""
        for _ in range(self.pool_size + 1):  # every pooled connection cut at once, then a fresh one
            with unavailable():
                async with self.connection() as conn:
                    try:
                        if transaction is None:
                            return await work(conn)
                        async with conn.transaction(**transaction):
                            return await work(conn)
                    except (asyncpg.InternalClientError, asyncpg.InterfaceError) as exc:
                        if not ended_before(exc, conn):
                            raise
                        cut: BaseException = exc
            log.debug("the database had ended a pooled connection's session (%s); running the work on another", cut)
        raise StoreUnavailable(f"the PostgreSQL database ended {self.pool_size + 1} connections in a row "
                               "before the work reached it") from cut

    # statement ``name`` of ``SQL`` with ``args``, as asyncpg's methods of the same names answer

    async def fetch(self, name: str, *args: Any) -> list[Any]:
        return list(await self.run(lambda conn: conn.fetch(SQL[name], *args)))

    async def execute(self, name: str, *args: Any) -> None:
        await self.run(lambda conn: conn.execute(SQL[name], *args))

    async def fetchrow(self, name: str, *args: Any) -> Any:
        return await self.run(lambda conn: conn.fetchrow(SQL[name], *args))

    async def fetchval(self, name: str, *args: Any) -> Any:
        return await self.run(lambda conn: conn.fetchval(SQL[name], *args))
