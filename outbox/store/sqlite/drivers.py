"""The SQLite drivers the intake's steps (``store.intake``) run on: the standard library's
``sqlite3`` (the store's writer thread, and an application's connection) and aiosqlite (an
application's asyncio connection, as SQLAlchemy's async engine holds it). Each is an ``execute``
for one statement on a connection inside its caller's transaction; none begins, commits or
ends one. Rows are read by column name on the outbox's own cursor, whatever ``row_factory`` the
application set on its connection."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

from ..intake import Returns, Statement, Steps, run
from ..plumbing import on_thread

T = TypeVar("T")


def _answer(s: Statement, cursor: sqlite3.Cursor) -> Any:
    """What ``s`` returns, from a cursor that has run it."""
    if s.returns is Returns.ROWS:
        return cursor.fetchall()
    if s.returns is Returns.NOTHING:
        return None
    row = cursor.fetchone()
    return row if s.returns is Returns.ROW or row is None else row[0]


class Sqlite3:
    """A ``sqlite3.Connection``."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def execute(self, s: Statement) -> Any:
        cursor = self.conn.cursor()
        cursor.row_factory = sqlite3.Row
        try:
            return _answer(s, cursor.execute(s.sql, s.args))
        finally:
            cursor.close()


class Aiosqlite:
    """An ``aiosqlite.Connection``: each statement, or a whole run of steps, runs on its thread
    as ``Sqlite3`` runs it, in one hop there (aiosqlite's own calls would take one a call: a
    cursor, its execute, its fetch and its close). ``first``, if given, runs there before the
    first statement (the binding's taking of the write lock), in the same hop."""

    def __init__(self, conn: Any, *, first: Callable[[sqlite3.Connection], None] | None = None) -> None:
        self.conn = conn
        self._first = first

    def _begun(self, conn: sqlite3.Connection) -> Sqlite3:
        if self._first is not None:
            first, self._first = self._first, None
            first(conn)
        return Sqlite3(conn)

    async def execute(self, s: Statement) -> Any:
        return await on_thread(self.conn, lambda conn: self._begun(conn).execute(s))

    async def run(self, steps: Steps[T]) -> T:
        """``steps`` driven to their end on the connection's thread."""
        return await on_thread(self.conn, lambda conn: run(steps, self._begun(conn).execute))
