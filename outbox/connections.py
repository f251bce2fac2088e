"""An application's own connection, whatever it writes with, as a driver of the enqueue's steps
(``store.intake``), inside the application's own transaction.

Taken, sync: the standard library's ``sqlite3.Connection``, psycopg 3's ``Connection``, a
psycopg2 connection, SQLAlchemy's ``Connection``, ``Session`` and ``scoped_session`` (over any of
those), and Django's connection (``django.db.connection`` or ``connections[alias]``). Async:
asyncpg's ``Connection``, psycopg 3's ``AsyncConnection``, aiosqlite's ``Connection``, and
SQLAlchemy's ``AsyncConnection``, ``AsyncSession`` and ``async_scoped_session``. A framework's
object is unwrapped to the driver connection it holds, and the statements run on that, in the
transaction the framework began.

The outbox never commits, rolls back or ends the caller's transaction. A connection that would
commit each statement alone (autocommit with no transaction open) is refused (NoTransaction):
the intent would not commit with the caller's writes. A connection in implicit-transaction mode
(psycopg's and psycopg2's default, sqlite3's default, SQLAlchemy's autobegin) has its
transaction begun as its own first write would begin it.

On SQLite the enqueue takes the database's write lock before anything else, waiting for it as
the connection's busy timeout says: it begins the transaction ``IMMEDIATE`` where none is open,
and in one already open (``BEGIN``, Django's ``atomic()``) it runs a write that changes nothing
(``take_write_lock``) before its first read: SQLite lets no transaction that has read wait for
the lock, so the enqueue's insert after its read would be refused at once whenever another
connection writes. Not getting the lock is StoreUnavailable saying why and what to configure
(``_no_write_lock``); nothing of the transaction is committed then.

Nothing here imports a driver or framework the application has not imported itself.
"""

from __future__ import annotations

import sqlite3
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar, cast

from .errors import NoTransaction, StoreUnavailable
from .events import NewEvent, Published
from .model import Enqueued, Event, NewIntent
from .store import intake as steps
from .store.intake import Intake, Returns, Statement, Steps

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Bound:
    """A driver bound to a connection inside its caller's transaction: the dialect's statements,
    the function that runs one (``execute``, sync or async as the connection is), and the block
    that raises the driver's "not now" (a lock timeout, the connection lost, SQLite's "database
    is locked") as StoreUnavailable, as the store's own connections do; other errors go through."""

    dialect: Intake
    execute: Callable[..., Any]
    unavailable: Callable[[], AbstractContextManager[None]]
    #: Runs steps to their end in one go, where the driver can do better than a statement at a
    #: time (aiosqlite: one hop to its thread, not one per statement); None: ``execute`` each.
    drive: Callable[[Steps[Any]], Any] | None = None

    def run(self, work: Steps[T]) -> T:
        """``work`` driven to its end on a synchronous connection; its result."""
        return steps.run(work, self.execute)

    async def run_async(self, work: Steps[T]) -> T:
        """``work`` driven to its end on an asyncio connection; its result."""
        if self.drive is not None:
            return cast(T, await self.drive(work))
        return await steps.run_async(work, self.execute)


@contextmanager
def _sqlite_unavailable() -> Iterator[None]:
    from .store.plumbing import unavailable

    try:
        yield
    except sqlite3.Error as exc:
        mapped = unavailable(exc)
        if mapped is None:
            raise
        raise mapped from exc


def _no_write_lock(exc: sqlite3.Error, waited: float, busy_timeout_ms: int) -> Exception:
    """What the application is told when the enqueue could not take SQLite's write lock
    (``exc``, after ``waited`` seconds, on a connection whose busy timeout is ``busy_timeout_ms``):
    StoreUnavailable saying why and what to do, or ``exc`` itself when it is not "not now"."""
    from .store.plumbing import unavailable

    mapped = unavailable(exc)
    if mapped is None:
        return exc
    undone = "nothing of this transaction is committed: roll it back and run it again"
    if waited * 1000 < busy_timeout_ms / 2:  # refused without waiting: SQLite would not let it wait
        return StoreUnavailable(
            f"{mapped}: this transaction had read the database before its first write (or a query of this "
            f"connection was still open), and SQLite does not let a transaction that has read wait for the write "
            f"lock while another connection holds it or has written since; {undone}, and begin it with BEGIN "
            f'IMMEDIATE (sqlite3.connect(path, isolation_level="IMMEDIATE"); Django: "transaction_mode": '
            f'"IMMEDIATE"), or enqueue before reading, so that it takes the lock first and waits for it')
    return StoreUnavailable(
        f"{mapped}: another writer (the outbox's service, or another connection of yours) held the database's "
        f"write lock longer than this connection's busy timeout ({busy_timeout_ms} ms) while the enqueue waited "
        f"for it; {undone}, or give the connection a longer one (sqlite3.connect(path, timeout=30))")


def _loaded(module: str) -> Any:
    """``module`` if the application has imported it, else None (never imported here)."""
    return sys.modules.get(module)


@cache
def _postgres() -> Intake:
    from .store.postgres.drivers import READ
    from .store.postgres.intake import PostgresIntake

    return PostgresIntake(READ)


@cache
def _sqlite() -> tuple[Intake, Any, str]:
    """The SQLite dialect's statements, its sqlite3 driver, and the statement that takes the
    write lock in a transaction already open (imported once: a bind is on every enqueue)."""
    from .store.sqlite.drivers import Sqlite3
    from .store.sqlite.intake import INTAKE
    from .store.sqlite.sql import SQL

    return INTAKE, Sqlite3, SQL["take_write_lock"]


_AUTOCOMMIT = ("the connection is in autocommit mode with no transaction open, so the intent would commit at once "
               "and alone; enqueue inside your transaction ({how}), so it commits with your writes or not at all")


def _sqlite_lock(in_transaction: bool, autocommit: bool) -> str:
    """The statement that takes SQLite's write lock for the enqueue (see the module's docstring),
    on a connection ``in_transaction`` or not, in ``autocommit`` mode or not; raises NoTransaction."""
    if in_transaction:
        return _sqlite()[2]
    if autocommit:
        raise NoTransaction(_AUTOCOMMIT.format(how='conn.execute("BEGIN IMMEDIATE") ... conn.commit()'))
    return "BEGIN IMMEDIATE"  # (where the connection's first write would have begun one)


def _sqlite3_begin(conn: sqlite3.Connection) -> None:
    """Make sure ``conn`` is in a transaction holding the write lock (see the module's docstring)."""
    statement = _sqlite_lock(conn.in_transaction,
                             conn.isolation_level is None or getattr(conn, "autocommit", -1) is True)
    began = time.monotonic()
    try:
        conn.execute(statement)
    except sqlite3.Error as exc:
        waited = time.monotonic() - began
        raise _no_write_lock(exc, waited, conn.execute("PRAGMA busy_timeout").fetchone()[0]) from exc


def bind(connection: Any) -> Bound:
    """The synchronous driver of ``connection`` (see the module's docstring). Raises
    NoTransaction, or TypeError for a connection of no kind taken here."""
    if isinstance(connection, sqlite3.Connection):
        _sqlite3_begin(connection)
        dialect, driver, _ = _sqlite()
        return Bound(dialect, driver(connection).execute, _sqlite_unavailable)
    if (psycopg := _loaded("psycopg")) is not None and isinstance(connection, psycopg.Connection):
        from .store.postgres.drivers import Psycopg, psycopg_unavailable

        if connection.autocommit and connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            raise NoTransaction(_AUTOCOMMIT.format(how="with conn.transaction(): ..."))
        return Bound(_postgres(), Psycopg(connection).execute, psycopg_unavailable)
    if (psycopg2 := _loaded("psycopg2.extensions")) is not None and isinstance(connection, psycopg2.connection):
        from .store.postgres.drivers import Psycopg2, psycopg2_unavailable

        if connection.autocommit and connection.get_transaction_status() == psycopg2.TRANSACTION_STATUS_IDLE:
            raise NoTransaction(_AUTOCOMMIT.format(how="conn.autocommit = False, or BEGIN ... COMMIT"))
        return Bound(_postgres(), Psycopg2(connection).execute, psycopg2_unavailable)
    if (orm := _loaded("sqlalchemy.orm")) is not None:
        if isinstance(connection, orm.scoped_session):  # (Flask-SQLAlchemy's db.session is one)
            return bind(connection())  # this scope's Session
        if isinstance(connection, orm.Session):
            return bind(connection.connection())  # (the session's transaction begins, as a query of its own would)
    if (engine := _loaded("sqlalchemy.engine")) is not None and isinstance(connection, engine.Connection):
        if not connection.in_transaction():
            connection.begin()  # (as its own first statement would: autobegin)
        with _sqlalchemy_autocommit():
            return bind(connection.connection.driver_connection)
    if (proxy := _loaded("django.utils.connection")) is not None and isinstance(connection, proxy.ConnectionProxy):
        # django.db.connection: a proxy (no BaseDatabaseWrapper) for this thread's default connection
        return bind(connection._connections[connection._alias])
    if (django := _loaded("django.db.backends.base.base")) is not None and isinstance(
            connection, django.BaseDatabaseWrapper):
        if connection.get_autocommit() and not connection.in_atomic_block:
            raise NoTransaction(_AUTOCOMMIT.format(how="with transaction.atomic(): ..., or ATOMIC_REQUESTS"))
        connection.validate_no_broken_transaction()  # (Django's own refusal, as its cursors give it)
        connection.ensure_connection()
        return bind(connection.connection)
    raise TypeError(_unknown(connection, "sqlite3, psycopg, psycopg2, a SQLAlchemy Connection or Session, "
                                         "a Django connection"))


async def bind_async(connection: Any) -> Bound:
    """The asynchronous driver of ``connection`` (see the module's docstring). Raises
    NoTransaction, or TypeError for a connection of no kind taken here."""
    if (asyncpg := _loaded("asyncpg")) is not None and isinstance(connection, asyncpg.Connection):
        from .store.postgres.connection import unavailable
        from .store.postgres.drivers import Asyncpg

        if not connection.is_in_transaction():
            raise NoTransaction(_AUTOCOMMIT.format(how="async with conn.transaction(): ..."))
        return Bound(_postgres(), Asyncpg(connection).execute, lambda: unavailable(connection))
    if (psycopg := _loaded("psycopg")) is not None and isinstance(connection, psycopg.AsyncConnection):
        from .store.postgres.drivers import AsyncPsycopg, psycopg_unavailable

        if connection.autocommit and connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            raise NoTransaction(_AUTOCOMMIT.format(how="async with conn.transaction(): ..."))
        return Bound(_postgres(), AsyncPsycopg(connection).execute, psycopg_unavailable)
    if (aiosqlite := _loaded("aiosqlite")) is not None and isinstance(connection, aiosqlite.Connection):
        from .store.sqlite.drivers import Aiosqlite

        _sqlite_lock(connection.in_transaction, connection.isolation_level is None)  # (NoTransaction now)
        driver = Aiosqlite(connection, first=_sqlite3_begin)  # (the lock: in the first hop to its thread)
        return Bound(_sqlite()[0], driver.execute, _sqlite_unavailable, driver.run)
    if (orm := _loaded("sqlalchemy.ext.asyncio")) is not None:
        if isinstance(connection, orm.async_scoped_session):
            return await bind_async(connection())  # this scope's AsyncSession
        if isinstance(connection, orm.AsyncSession):
            return await bind_async(await connection.connection())
        if isinstance(connection, orm.AsyncConnection):
            return await _sqlalchemy_async(connection)
    raise TypeError(_unknown(connection, "asyncpg, psycopg's AsyncConnection, aiosqlite, a SQLAlchemy "
                                         "AsyncConnection or AsyncSession"))


async def _sqlalchemy_async(connection: Any) -> Bound:
    """A SQLAlchemy ``AsyncConnection``'s driver connection, in the transaction SQLAlchemy began."""
    if not connection.in_transaction():
        await connection.begin()  # (as its own first statement would: autobegin)
    driver = (await connection.get_raw_connection()).driver_connection
    asyncpg = _loaded("asyncpg")
    if asyncpg is not None and isinstance(driver, asyncpg.Connection) and not driver.is_in_transaction():
        await connection.exec_driver_sql("SELECT 1")  # (SQLAlchemy begins asyncpg's transaction at a first statement)
    with _sqlalchemy_autocommit():
        return await bind_async(driver)


@contextmanager
def _sqlalchemy_autocommit() -> Iterator[None]:
    """NoTransaction from the driver under a SQLAlchemy connection, saying what helps there: its
    begin() begins nothing on a connection whose isolation level is AUTOCOMMIT (not the driver's
    own idiom, which SQLAlchemy's connection does not have)."""
    try:
        yield
    except NoTransaction:
        raise NoTransaction(_AUTOCOMMIT.format(
            how="on an engine or connection without isolation_level='AUTOCOMMIT', in with conn.begin(): ... or "
                "with session.begin(): ...")) from None


def _unknown(connection: Any, taken: str) -> str:
    kind = type(connection)
    return f"cannot enqueue on a {kind.__module__}.{kind.__qualname__}: give {taken}"


class CallerTransaction:
    """The store's ``Transaction`` on the caller's own asyncio connection (``Outbox.transaction``):
    its enqueues are written there and commit or roll back with the caller's transaction."""

    def __init__(self, bound: Bound) -> None:
        self.bound = bound

    async def execute(self, sql: str, parameters: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self.bound.unavailable():
            rows = await self.bound.execute(Statement(sql, tuple(parameters), Returns.ROWS))
        return [tuple(row.values()) if isinstance(row, Mapping) else tuple(row) for row in rows]

    async def insert_intent(self, new: NewIntent, event: Event) -> Enqueued:
        with self.bound.unavailable():
            return await self.bound.run_async(steps.insert_intent(self.bound.dialect, new, event))

    async def publish(self, new: NewEvent, *, granted_only: bool, max_fanout: int | None = None) -> Published:
        with self.bound.unavailable():
            return await self.bound.run_async(steps.publish(self.bound.dialect, new, granted_only, max_fanout))
