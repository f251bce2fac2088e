"""The SQLite group commit when SQLite gives up a whole transaction mid-batch.

SQLite may roll a whole transaction back on its own after a disk-full or I/O error. The jobs
that shared it must then fail with that error, which callers know as "unavailable" (503,
retried), not with the savepoint the retry loop could no longer roll back to.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path

import aiosqlite
import pytest

from receivers.records import StoreUnavailable
from receivers.sqlite_writer import GroupCommitter


def write(n: int) -> Callable[[sqlite3.Connection], int]:
    def job(conn: sqlite3.Connection) -> int:
        conn.execute("INSERT INTO t VALUES (?)", (n,))
        return n
    return job


def full_disk(conn: sqlite3.Connection) -> None:
    """SQLite's behaviour on a full disk, injected: the transaction is gone, then the error."""
    conn.execute("ROLLBACK")
    raise sqlite3.OperationalError("database or disk is full")


async def test_a_transaction_sqlite_gave_up_fails_every_job_as_unavailable(tmp_path: Path) -> None:
    async with aiosqlite.connect(tmp_path / "t.db", isolation_level=None) as db:
        await db.execute("CREATE TABLE t (n INTEGER)")
        committer = GroupCommitter(db)
        jobs = [asyncio.create_task(committer.write(job)) for job in (write(1), full_disk, write(3))]
        for job in jobs:  # queued together: one batch
            with pytest.raises(StoreUnavailable, match="disk is full"):
                await job
        assert await committer.write(write(4)) == 4  # the next batch commits as usual
        assert [row async for row in await db.execute("SELECT n FROM t")] == [(4,)]
