"""An application's own connection, one kind per class, as an application on that driver or
framework writes with it: connect, run its own INSERT, begin, commit or roll back its transaction
and its savepoints in that stack's idiom, and enqueue on it (``outbox.Producer``,
``outbox.AsyncProducer``, or ``Outbox.transaction(connection=...)``).

    app = KINDS["psycopg"](url)            # the outbox's database URL, as the service has it
    await app.connect()
    async with app.transaction():          # commits on leaving; an exception rolls it back
        await app.insert(1)                # the app's own row in its own table, ``orders``
        await app.enqueue(destination="billing", scope="acme", payload={"order": 1})
    await app.close()

Every method is async so that the behaviours are written once for every kind; a synchronous
kind's run to their end before returning, on the caller's thread (no event loop of their own,
no thread: as a synchronous application calls them). The tests of enqueuing in the application's
transaction (``tests/integration/test_app_transactions.py``) and the application process killed
in the middle of one (``tests/acceptance/app_process.py``) both drive these.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any, ClassVar

from outbox import AsyncProducer, Enqueued, Outbox, Producer, Published, Settings

#: The application's own table, in the outbox's database (both dialects read it alike).
ORDERS = "CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER NOT NULL)"


def sqlite_path(url: str) -> str:
    """The file of a ``sqlite:///path`` URL."""
    return url.removeprefix("sqlite:///")


class App:
    """One connection kind, on the store it applies to (``store``: ``sqlite`` or ``postgres``)."""

    name: ClassVar[str]
    store: ClassVar[str]
    #: Whether the kind has ``enqueue_many`` (``Outbox.transaction``'s has not).
    many: ClassVar[bool] = True
    #: What NoTransaction tells this stack's user to do (a regular expression).
    advice: ClassVar[str]
    #: Whether ``transaction()`` begins one on a connection in autocommit mode (psycopg's, psycopg2's
    #: and asyncpg's blocks do; sqlite3's ``with conn:`` and SQLAlchemy's under AUTOCOMMIT do not).
    begins_in_autocommit: ClassVar[bool] = False

    def __init__(self, url: str, settings: Settings | None = None) -> None:
        self.url = url
        self.settings = settings or Settings()

    async def connect(self, *, autocommit: bool = False) -> None:
        """Open the connection; with ``autocommit``, one that commits each statement alone."""
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def customize(self) -> None:
        """Set on the connection what applications of this stack commonly set (row factories,
        JSON codecs, a session time zone), none of which may change what the outbox stores."""

    def transaction(self) -> Any:
        """An async context manager: a transaction, committed on leaving, rolled back (and the
        exception raised on) when one leaves it."""
        raise NotImplementedError

    def savepoint(self) -> Any:
        """As ``transaction``, nested in the one open: a savepoint released or rolled back to."""
        raise NotImplementedError

    async def insert(self, order: int, total: int = 100) -> None:
        """The application's own write: one row of ``orders``."""
        raise NotImplementedError

    async def enqueue(self, **intent: Any) -> Enqueued:
        raise NotImplementedError

    async def enqueue_many(self, intents: Iterable[Mapping[str, Any]]) -> list[Enqueued]:
        raise NotImplementedError

    async def publish(self, **event: Any) -> Published:
        raise NotImplementedError


class SyncApp(App):
    """A synchronous kind: ``handle`` (the connection or session) given to ``Producer``."""

    handle: Any

    def __init__(self, url: str, settings: Settings | None = None) -> None:
        super().__init__(url, settings)
        self.producer = Producer(self.settings)

    async def enqueue(self, **intent: Any) -> Enqueued:
        return self.producer.enqueue(self.handle, **intent)

    async def enqueue_many(self, intents: Iterable[Mapping[str, Any]]) -> list[Enqueued]:
        return self.producer.enqueue_many(self.handle, intents)

    async def publish(self, **event: Any) -> Published:
        return self.producer.publish(self.handle, **event)


class AsyncApp(App):
    """An asyncio kind: ``handle`` given to ``AsyncProducer``."""

    handle: Any

    def __init__(self, url: str, settings: Settings | None = None) -> None:
        super().__init__(url, settings)
        self.producer = AsyncProducer(self.settings)

    async def enqueue(self, **intent: Any) -> Enqueued:
        return await self.producer.enqueue(self.handle, **intent)

    async def enqueue_many(self, intents: Iterable[Mapping[str, Any]]) -> list[Enqueued]:
        return await self.producer.enqueue_many(self.handle, intents)

    async def publish(self, **event: Any) -> Published:
        return await self.producer.publish(self.handle, **event)


class OutboxTransactionApp(App):
    """An asyncio kind whose enqueues go through ``Outbox.transaction(connection=handle)``: the
    library's own facade, opened on the same database, writing on the application's connection."""

    many = False
    handle: Any
    box: Outbox | None = None

    async def open_box(self) -> None:
        self.box = await Outbox.open(self.url, settings=self.settings, migrate=False)

    async def close_box(self) -> None:
        if self.box is not None:
            await self.box.close()

    async def enqueue(self, **intent: Any) -> Enqueued:
        assert self.box is not None
        async with self.box.transaction(connection=self.handle) as tx:
            return await tx.enqueue(**intent)

    async def publish(self, **event: Any) -> Published:
        assert self.box is not None
        async with self.box.transaction(connection=self.handle) as tx:
            return await tx.publish(**event)


# -- SQLite ------------------------------------------------------------------------------------


class Sqlite3(SyncApp):
    """The standard library's ``sqlite3``, in its default (implicit transaction) mode, ``with conn:``."""

    name = "sqlite3"
    store = "sqlite"
    advice = "BEGIN IMMEDIATE"

    async def connect(self, *, autocommit: bool = False) -> None:
        self.handle = sqlite3.connect(sqlite_path(self.url), isolation_level=None if autocommit else "")

    async def close(self) -> None:
        self.handle.close()

    async def customize(self) -> None:
        self.handle.row_factory = lambda cursor, row: dict(zip([c[0] for c in cursor.description], row, strict=True))

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        with self.handle:
            yield

    @asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        self.handle.execute("SAVEPOINT app")
        try:
            yield
        except BaseException:
            self.handle.execute("ROLLBACK TO app")
            raise
        finally:
            self.handle.execute("RELEASE app")

    async def insert(self, order: int, total: int = 100) -> None:
        self.handle.execute("INSERT INTO orders (id, total) VALUES (?, ?)", (order, total))


class _Aiosqlite:
    handle: Any
    url: str

    async def connect(self, *, autocommit: bool = False) -> None:
        import aiosqlite

        self.handle = await aiosqlite.connect(sqlite_path(self.url), isolation_level=None if autocommit else "")

    async def customize(self) -> None:
        import aiosqlite

        self.handle.row_factory = aiosqlite.Row

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        try:
            yield
        except BaseException:
            await self.handle.rollback()
            raise
        await self.handle.commit()

    @asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        await self.handle.execute("SAVEPOINT app")
        try:
            yield
        except BaseException:
            await self.handle.execute("ROLLBACK TO app")
            raise
        finally:
            await self.handle.execute("RELEASE app")

    async def insert(self, order: int, total: int = 100) -> None:
        await self.handle.execute("INSERT INTO orders (id, total) VALUES (?, ?)", (order, total))


class Aiosqlite(_Aiosqlite, AsyncApp):
    """aiosqlite, in its default (implicit transaction) mode, ``commit()`` and ``rollback()``."""

    name = "aiosqlite"
    store = "sqlite"
    advice = "BEGIN IMMEDIATE"

    async def close(self) -> None:
        await self.handle.close()


class AiosqliteOutboxTransaction(_Aiosqlite, OutboxTransactionApp):
    """aiosqlite, enqueuing through ``Outbox.transaction(connection=conn)``."""

    name = "aiosqlite-outbox-transaction"
    store = "sqlite"
    advice = "BEGIN IMMEDIATE"

    async def connect(self, *, autocommit: bool = False) -> None:
        await super().connect(autocommit=autocommit)
        await self.open_box()

    async def close(self) -> None:
        await self.handle.close()
        await self.close_box()


# -- PostgreSQL --------------------------------------------------------------------------------


class Psycopg(SyncApp):
    """psycopg 3's ``Connection``, its ``with conn.transaction():`` blocks (nested: savepoints)."""

    name = "psycopg"
    store = "postgres"
    advice = r"with conn\.transaction\(\)"
    begins_in_autocommit = True

    async def connect(self, *, autocommit: bool = False) -> None:
        import psycopg

        self.handle = psycopg.connect(self.url, autocommit=autocommit)

    async def customize(self) -> None:
        from psycopg.rows import namedtuple_row
        from psycopg.types.json import set_json_loads

        self.handle.row_factory = namedtuple_row
        set_json_loads(lambda data: ("app's own loads", data), self.handle)
        self.handle.execute("SET TIME ZONE 'Pacific/Chatham'")
        self.handle.commit()

    async def close(self) -> None:
        self.handle.close()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        with self.handle.transaction():
            yield

    savepoint = transaction

    async def insert(self, order: int, total: int = 100) -> None:
        self.handle.execute("INSERT INTO orders (id, total) VALUES (%s, %s)", (order, total))


class AsyncPsycopg(AsyncApp):
    """psycopg 3's ``AsyncConnection``, its ``async with conn.transaction():`` blocks."""

    name = "psycopg-async"
    store = "postgres"
    advice = r"async with conn\.transaction\(\)"
    begins_in_autocommit = True

    async def connect(self, *, autocommit: bool = False) -> None:
        import psycopg

        self.handle = await psycopg.AsyncConnection.connect(self.url, autocommit=autocommit)

    async def customize(self) -> None:
        from psycopg.rows import dict_row
        from psycopg.types.json import set_json_loads

        self.handle.row_factory = dict_row
        set_json_loads(lambda data: ("app's own loads", data), self.handle)
        await self.handle.execute("SET TIME ZONE 'Asia/Kathmandu'")
        await self.handle.commit()

    async def close(self) -> None:
        await self.handle.close()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        async with self.handle.transaction():
            yield

    savepoint = transaction

    async def insert(self, order: int, total: int = 100) -> None:
        await self.handle.execute("INSERT INTO orders (id, total) VALUES (%s, %s)", (order, total))


class Psycopg2(SyncApp):
    """psycopg2, in its default (implicit transaction) mode, ``with conn:`` and SQL savepoints."""

    name = "psycopg2"
    store = "postgres"
    advice = r"conn\.autocommit = False"
    begins_in_autocommit = True  # (since psycopg2 2.9)

    async def connect(self, *, autocommit: bool = False) -> None:
        import psycopg2

        self.handle = psycopg2.connect(self.url)
        self.handle.autocommit = autocommit

    async def customize(self) -> None:
        import psycopg2.extras

        self.handle.cursor_factory = psycopg2.extras.NamedTupleCursor
        psycopg2.extras.register_default_json(self.handle, loads=lambda data: ("app's own loads", data))
        psycopg2.extras.register_default_jsonb(self.handle, loads=lambda data: ("app's own loads", data))
        with self.handle, self.handle.cursor() as cursor:
            cursor.execute("SET TIME ZONE 'America/St_Johns'")

    async def close(self) -> None:
        self.handle.close()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        with self.handle:
            yield

    @asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        with self.handle.cursor() as cursor:
            cursor.execute("SAVEPOINT app")
            try:
                yield
            except BaseException:
                cursor.execute("ROLLBACK TO SAVEPOINT app")
                raise
            finally:
                cursor.execute("RELEASE SAVEPOINT app")

    async def insert(self, order: int, total: int = 100) -> None:
        with self.handle.cursor() as cursor:
            cursor.execute("INSERT INTO orders (id, total) VALUES (%s, %s)", (order, total))


class _Asyncpg:
    handle: Any
    url: str
    begins_in_autocommit = True

    async def connect(self, *, autocommit: bool = False) -> None:
        import asyncpg

        self.handle = await asyncpg.connect(self.url)  # (asyncpg has no transaction until one is begun)

    async def customize(self) -> None:
        import json

        for name in ("json", "jsonb"):  # (as asyncpg's documentation shows, and many pools' init do)
            await self.handle.set_type_codec(name, encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
        await self.handle.execute("SET TIME ZONE 'Australia/Eucla'")

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        async with self.handle.transaction():
            yield

    savepoint = transaction

    async def insert(self, order: int, total: int = 100) -> None:
        await self.handle.execute("INSERT INTO orders (id, total) VALUES ($1, $2)", order, total)


class Asyncpg(_Asyncpg, AsyncApp):
    """asyncpg, its ``async with conn.transaction():`` blocks (nested: savepoints)."""

    name = "asyncpg"
    store = "postgres"
    advice = r"async with conn\.transaction\(\)"

    async def close(self) -> None:
        await self.handle.close()


class AsyncpgOutboxTransaction(_Asyncpg, OutboxTransactionApp):
    """asyncpg, enqueuing through ``Outbox.transaction(connection=conn)``."""

    name = "asyncpg-outbox-transaction"
    store = "postgres"
    advice = r"async with conn\.transaction\(\)"

    async def connect(self, *, autocommit: bool = False) -> None:
        await super().connect(autocommit=autocommit)
        await self.open_box()

    async def close(self) -> None:
        await self.handle.close()
        await self.close_box()


# -- SQLAlchemy, on either store ---------------------------------------------------------------

#: Each store's name in a SQLAlchemy URL.
SA_DIALECTS = {"sqlite": "sqlite", "postgres": "postgresql"}


def sqlalchemy_url(url: str, driver: str) -> str:
    """The outbox's database URL as SQLAlchemy names it with ``driver``."""
    return driver + url[url.index("://"):]


def _orm() -> Any:
    """The ORM's mapping of ``orders`` (made once, when first needed)."""
    global _ORDER
    if _ORDER is None:
        from sqlalchemy import Integer
        from sqlalchemy.orm import DeclarativeBase, mapped_column

        class Base(DeclarativeBase):
            pass

        class Order(Base):
            __tablename__ = "orders"
            id = mapped_column(Integer, primary_key=True, autoincrement=False)
            total = mapped_column(Integer, nullable=False)

        _ORDER = Order
    return _ORDER


_ORDER: Any = None
_INSERT = "INSERT INTO orders (id, total) VALUES (:id, :total)"


class _SqlAlchemy:
    """What the SQLAlchemy kinds share: the engine over the store's driver."""

    url: str
    store: ClassVar[str]
    driver: ClassVar[str]  # the DBAPI SQLAlchemy's engine uses (``sqlite+pysqlite``: pysqlite)
    asynchronous: ClassVar[bool]
    advice = "without isolation_level='AUTOCOMMIT'"
    engine: Any

    def make_engine(self, autocommit: bool) -> Any:
        options = {"isolation_level": "AUTOCOMMIT"} if autocommit else {}
        url = sqlalchemy_url(self.url, f"{SA_DIALECTS[self.store]}+{self.driver}")
        if self.asynchronous:
            from sqlalchemy.ext.asyncio import create_async_engine

            return create_async_engine(url, **options)
        import sqlalchemy

        return sqlalchemy.create_engine(url, **options)


class _SqlAlchemyConnection(_SqlAlchemy, SyncApp):
    """SQLAlchemy's ``Connection``: ``with conn.begin():``, ``with conn.begin_nested():``."""

    asynchronous = False

    async def connect(self, *, autocommit: bool = False) -> None:
        self.engine = self.make_engine(autocommit)
        self.handle = self.engine.connect()

    async def close(self) -> None:
        self.handle.close()
        self.engine.dispose()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        with self.handle.begin():
            yield

    @asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        with self.handle.begin_nested():
            yield

    async def insert(self, order: int, total: int = 100) -> None:
        import sqlalchemy

        self.handle.execute(sqlalchemy.text(_INSERT), {"id": order, "total": total})


class _SqlAlchemySession(_SqlAlchemy, SyncApp):
    """SQLAlchemy's ORM ``Session``: ``with session.begin():``, ``session.add(Order(...))``."""

    asynchronous = False

    async def connect(self, *, autocommit: bool = False) -> None:
        from sqlalchemy.orm import Session

        self.engine = self.make_engine(autocommit)
        self.handle = Session(self.engine)

    async def close(self) -> None:
        self.handle.close()
        self.engine.dispose()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        with self.handle.begin():
            yield

    @asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        with self.handle.begin_nested():
            yield

    async def insert(self, order: int, total: int = 100) -> None:
        self.handle.add(_orm()(id=order, total=total))  # (flushed by the commit, after the enqueue)


class _SqlAlchemyAsyncConnection(_SqlAlchemy, AsyncApp):
    """SQLAlchemy's ``AsyncConnection``: ``async with conn.begin():``, ``begin_nested()``."""

    asynchronous = True

    async def connect(self, *, autocommit: bool = False) -> None:
        self.engine = self.make_engine(autocommit)
        self.handle = await self.engine.connect()

    async def close(self) -> None:
        await self.handle.close()
        await self.engine.dispose()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        async with self.handle.begin():
            yield

    @asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        async with self.handle.begin_nested():
            yield

    async def insert(self, order: int, total: int = 100) -> None:
        import sqlalchemy

        await self.handle.execute(sqlalchemy.text(_INSERT), {"id": order, "total": total})


class _SqlAlchemyAsyncSession(_SqlAlchemy, AsyncApp):
    """SQLAlchemy's ORM ``AsyncSession``: ``async with session.begin():``, ``session.add(...)``."""

    asynchronous = True

    async def connect(self, *, autocommit: bool = False) -> None:
        from sqlalchemy.ext.asyncio import AsyncSession

        self.engine = self.make_engine(autocommit)
        self.handle = AsyncSession(self.engine)

    async def close(self) -> None:
        await self.handle.close()
        await self.engine.dispose()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        async with self.handle.begin():
            yield

    @asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        async with self.handle.begin_nested():
            yield

    async def insert(self, order: int, total: int = 100) -> None:
        self.handle.add(_orm()(id=order, total=total))


def _kind(base: type[App], store: str, driver: str) -> type[App]:
    """``base`` on ``store``, its engine over ``driver``, named for both."""
    name = base.__name__.strip("_").replace("SqlAlchemy", "sqlalchemy-").replace("Async", "async-").lower()
    return type(f"{base.__name__.strip('_')}On{driver.title()}", (base,),
                {"name": f"{name}-{driver}", "store": store, "driver": driver,
                 "__doc__": f"{base.__doc__} Over {driver}."})


_SQLALCHEMY = [
    *(_kind(base, store, driver)
      for store, sync, asynchronous in (("sqlite", "pysqlite", "aiosqlite"), ("postgres", "psycopg", "asyncpg"))
      for base, driver in ((_SqlAlchemyConnection, sync), (_SqlAlchemySession, sync),
                           (_SqlAlchemyAsyncConnection, asynchronous), (_SqlAlchemyAsyncSession, asynchronous))),
    # and the engine's other PostgreSQL drivers the outbox takes, once each
    _kind(_SqlAlchemySession, "postgres", "psycopg2"), _kind(_SqlAlchemyAsyncConnection, "postgres", "psycopg"),
]

#: Every kind, by name.
KINDS: dict[str, type[App]] = {
    kind.name: kind
    for kind in [Sqlite3, Aiosqlite, AiosqliteOutboxTransaction, Psycopg, AsyncPsycopg, Psycopg2, Asyncpg,
                 AsyncpgOutboxTransaction, *_SQLALCHEMY]
}
