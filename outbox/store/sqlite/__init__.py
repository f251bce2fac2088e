"""The embedded SQLite store (aiosqlite, WAL, ``synchronous=FULL``).

Writes go through one connection and are group-committed: concurrent writers share a
transaction and its fsync (one writer's failure undoes only its own writes), the changes of the
applies in it are made as one set (a named block per move, ``sql/sqlite.sql``), and each writer
is acknowledged only after the commit that made its write durable. Reads use a second
connection, which WAL lets run beside the writer.

One module per concern: ``sql`` (the named statements, and values as they are stored),
``intake`` (enqueues), ``changes`` (``apply``, ``claim``, ``recover``), ``migration`` and
``store`` (``SqliteStore``: the connections, the caller's transactions, each method one unit of
work).
"""

from __future__ import annotations

from ..plumbing import to_us
from .sql import SQL
from .store import SqliteStore

__all__ = ["SQL", "SqliteStore", "to_us"]
