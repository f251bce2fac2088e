"""The PostgreSQL drivers the intake's steps (``store.intake``) run on: asyncpg (the store's own
connections, and an application's), psycopg 3 (sync and async) and psycopg2. Each is an
``execute`` for one statement on a connection inside its caller's transaction; none begins,
commits or ends one.

Rows come back read by column name, JSON columns as their text and times as UTC datetimes,
whatever the application set on its connection: psycopg's loaders are set on the outbox's own
cursor, never on the connection. A stored time no datetime can hold (``infinity``) is read as
the records read it (``records.nearest``), not raised from the driver.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC
from functools import cache, lru_cache
from typing import Any

from ...errors import StoreUnavailable
from ..intake import Returns, Statement
from ..records import Reader

#: The SQLSTATEs (or their classes) that mean "not now", as ``connection.UNAVAILABLE`` says them
#: for asyncpg: the connection (08), operator intervention (57), resources (53), a rollback a
#: retry resolves (40), a lock not available (55P03), no such database (3D000), read-only (25006).
_NOT_NOW = ("08", "57", "53", "40", "55P03", "3D000", "25006")


def _not_now(sqlstate: str | None, lost: bool) -> bool:
    """Whether an error with ``sqlstate`` (None: the driver's own, ``lost`` when it lost the
    connection) means "not now"."""
    return lost if sqlstate is None else any(sqlstate.startswith(state) for state in _NOT_NOW)


@contextmanager
def psycopg_unavailable() -> Iterator[None]:
    """psycopg 3's "not now" as StoreUnavailable."""
    import psycopg

    try:
        yield
    except psycopg.Error as exc:
        if not _not_now(exc.sqlstate, isinstance(exc, psycopg.OperationalError)):
            raise
        raise StoreUnavailable(f"the PostgreSQL database is unavailable: {exc}") from exc


@contextmanager
def psycopg2_unavailable() -> Iterator[None]:
    """psycopg2's "not now" as StoreUnavailable."""
    import psycopg2

    try:
        yield
    except psycopg2.Error as exc:
        if not _not_now(exc.pgcode, isinstance(exc, psycopg2.OperationalError | psycopg2.InterfaceError)):
            raise
        raise StoreUnavailable(f"the PostgreSQL database is unavailable: {exc}") from exc


def read_time(value: Any) -> Any:
    """A time as these drivers give it: a datetime, or for one no datetime can hold, a signed
    int (negative: before year 1), which raises OverflowError as ``connection.read_time`` does."""
    if isinstance(value, int):
        raise OverflowError(f"a stored time {'before year 1' if value < 0 else 'after year 9999'}")
    return value if value is None or value.tzinfo is UTC else value.astimezone(UTC)


#: Rows as records, as the application's drivers read them.
READ = Reader(read_time)


class Asyncpg:
    """An asyncpg connection (asyncpg gives JSON as text already)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def execute(self, s: Statement) -> Any:
        if s.returns is Returns.ROWS:
            return await self.conn.fetch(s.sql, *s.args)
        if s.returns is Returns.ROW:
            return await self.conn.fetchrow(s.sql, *s.args)
        if s.returns is Returns.VALUE:
            return await self.conn.fetchval(s.sql, *s.args)
        await self.conn.execute(s.sql, *s.args)
        return None


@cache
def _psycopg_loaders() -> tuple[tuple[int, type], ...]:
    """The loaders an outbox cursor reads with, by type oid: JSON (json, jsonb) as its text, and
    times as ``read_time`` takes them. Made once: psycopg remembers every loader class it is
    given, so one made per cursor would be kept for good, a few KiB per enqueue."""
    from psycopg.types.datetime import TimestamptzLoader
    from psycopg.types.string import TextLoader

    class Timestamptz(TimestamptzLoader):
        def load(self, data: Any) -> Any:
            try:
                return super().load(data)
            except Exception:  # (psycopg's DataError for infinity, before year 1, after 9999)
                return -1 if bytes(data).startswith(b"-") or bytes(data).endswith(b" BC") else 1

    return (114, TextLoader), (3802, TextLoader), (1184, Timestamptz)  # json, jsonb, timestamptz


@cache
def _psycopg_rows() -> tuple[Any, Any]:
    """psycopg's row factories for rows by column name and for plain tuples."""
    from psycopg.rows import dict_row, tuple_row

    return dict_row, tuple_row


class _PsycopgReader:
    """How an outbox cursor on psycopg 3 (a raw cursor: ``$n`` parameters, as the dialect's SQL
    numbers them) reads a statement's answer: rows by column name with ``_psycopg_loaders``,
    registered on the cursor the first time it reads rows (an enqueue that only inserts reads a
    value, for which a tuple does), whatever the connection's own row factory."""

    def __init__(self, cursor: Any) -> None:
        self.cursor = cursor
        self._loaders = False

    def prepare(self, s: Statement) -> None:
        """Set the cursor to read ``s``'s answer."""
        by_name, plain = _psycopg_rows()
        if s.returns is Returns.ROW or s.returns is Returns.ROWS:
            if not self._loaders:
                for oid, loader in _psycopg_loaders():
                    self.cursor.adapters.register_loader(oid, loader)
                self._loaders = True
            self.cursor.row_factory = by_name
        else:
            self.cursor.row_factory = plain


def _answer(s: Statement, cursor: Any) -> Any:
    """What ``s`` returns, from a DB-API cursor that has run it (rows as dicts; a statement that
    returns no rows, such as a caller's INSERT, answers as an empty result)."""
    if s.returns is Returns.NOTHING:
        return None
    if cursor.description is None:
        return [] if s.returns is Returns.ROWS else None
    if s.returns is Returns.ROWS:
        return cursor.fetchall()
    row = cursor.fetchone()
    if s.returns is Returns.ROW or row is None:
        return row
    return _first(row)


def _first(row: Any) -> Any:
    """A row's first column (a tuple's, or a dict's by column order)."""
    return row[0] if isinstance(row, tuple) else next(iter(row.values()))


class Psycopg:
    """A psycopg 3 ``Connection``."""

    def __init__(self, conn: Any) -> None:
        import psycopg

        self.reader = _PsycopgReader(psycopg.RawCursor(conn))

    def execute(self, s: Statement) -> Any:
        self.reader.prepare(s)
        cursor = self.reader.cursor
        cursor.execute(s.sql, s.args)
        return _answer(s, cursor)


class AsyncPsycopg:
    """A psycopg 3 ``AsyncConnection``."""

    def __init__(self, conn: Any) -> None:
        import psycopg

        self.reader = _PsycopgReader(psycopg.AsyncRawCursor(conn))

    async def execute(self, s: Statement) -> Any:
        self.reader.prepare(s)
        cursor = self.reader.cursor
        await cursor.execute(s.sql, s.args)
        if s.returns is Returns.NOTHING:
            return None
        if cursor.description is None:
            return [] if s.returns is Returns.ROWS else None
        if s.returns is Returns.ROWS:
            return await cursor.fetchall()
        row = await cursor.fetchone()
        if s.returns is Returns.ROW or row is None:
            return row
        return _first(row)


#: ``$n`` where the dialect's SQL numbers a parameter (never inside a quoted string: it has none).
_NUMBERED = re.compile(r"\$(\d+)")


@lru_cache(maxsize=64)
def _pyformat(sql: str) -> str:
    """The dialect's ``$n`` parameters as psycopg2's ``%(pn)s`` (a literal ``%`` doubled)."""
    return _NUMBERED.sub(r"%(p\1)s", sql.replace("%", "%%"))


class Psycopg2:
    """A psycopg2 connection."""

    def __init__(self, conn: Any) -> None:
        import psycopg2.extensions
        import psycopg2.extras

        self.cursor = conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor)
        for oid, name in ((114, "JSON"), (3802, "JSONB")):  # (psycopg2 reads infinity as datetime.max itself)
            psycopg2.extensions.register_type(psycopg2.extensions.new_type((oid,), name, _text), self.cursor)

    def execute(self, s: Statement) -> Any:
        self.cursor.execute(_pyformat(s.sql), {f"p{n}": value for n, value in enumerate(s.args, 1)})
        return _answer(s, self.cursor)


def _text(value: str | None, _cursor: Any) -> str | None:
    return value
