"""The SQLite store's migrations, run on the writer connection in one transaction that holds the
database's write lock (one migrator at a time, across processes)."""

from __future__ import annotations

import sqlite3
from datetime import datetime

import aiosqlite

from ..migrator import Migration
from ..plumbing import on_thread, to_us
from .sql import SQL


def begin_migration(conn: sqlite3.Connection) -> None:
    conn.execute(SQL["create_migrations_table"])
    conn.execute("BEGIN IMMEDIATE")  # one migrator at a time, across processes


def _run_script(conn: sqlite3.Connection, script: str) -> None:
    for statement in _statements(script):
        conn.execute(statement)


class SqliteMigration:
    """The migration runner's view of the writer connection, inside the migration's transaction."""

    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    async def applied_versions(self) -> set[int]:
        return await on_thread(self._db, lambda conn: {row[0] for row in conn.execute(SQL["applied_migrations"])})

    async def run_script(self, script: str) -> None:
        await on_thread(self._db, _run_script, script)

    async def record(self, migration: Migration, at: datetime) -> None:
        params = (migration.version, migration.name, to_us(at))
        await on_thread(self._db, lambda conn: conn.execute(SQL["record_migration"], params) and None)


def _statements(script: str) -> list[str]:
    """Split a migration script into statements (sqlite3 runs one at a time)."""
    statements, current = [], ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            statements.append(current.strip())
            current = ""
    if current.strip() and not all(
        part.strip().startswith("--") or not part.strip() for part in current.splitlines()
    ):
        raise ValueError(f"incomplete statement in migration: {current.strip()[:80]!r}")
    return statements
