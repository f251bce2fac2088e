"""An enqueue on the application's own SQLite connection while another connection holds the
database's write lock: it waits for the lock as the connection's busy timeout says, wherever the
transaction stands, and when it cannot have it the application gets StoreUnavailable saying why
and what to configure, with nothing of its transaction committed; run again, it succeeds.

The other writer is a plain sqlite3 connection in ``BEGIN IMMEDIATE`` (as the outbox's service
holds the lock for a group commit), released by a timer where the test needs it to be.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiosqlite
import pytest

from outbox import AsyncProducer, DestinationSpec, Outbox, Producer, StoreUnavailable

from ..conftest import SECRET

INTENT = {"destination": "billing", "scope": "acme", "payload": {"order": 42}}


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Path]:
    """A migrated outbox file with the destination ``billing`` and the application's ``orders``."""
    path = tmp_path / "shop.db"
    async with await Outbox.open(f"sqlite:///{path}") as box:
        await box.put_destination("billing", DestinationSpec(url="https://billing.example/hook", secret=SECRET))
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    yield path


@pytest.fixture
def holder(db: Path) -> Iterator[sqlite3.Connection]:
    """Another connection holding the write lock (``BEGIN IMMEDIATE``) until it commits."""
    conn = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    conn.execute("BEGIN IMMEDIATE")
    yield conn
    if conn.in_transaction:
        conn.execute("COMMIT")
    conn.close()


def release_after(holder: sqlite3.Connection, seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, holder.execute, ("COMMIT",))
    timer.start()
    return timer


def intents(db: Path) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [key for (key,) in conn.execute("SELECT intent_key FROM intents ORDER BY seq")]


def test_the_enqueue_that_begins_the_transaction_waits_and_when_it_cannot_says_so(
        db: Path, holder: sqlite3.Connection) -> None:
    conn = sqlite3.connect(db, timeout=0.2)  # sqlite3's default: no transaction until the first write
    began = time.monotonic()
    with pytest.raises(StoreUnavailable) as refused:
        Producer().enqueue(conn, action_id="order-42", **INTENT)
    assert time.monotonic() - began >= 0.15  # it waited for the lock
    assert "busy timeout (200 ms)" in refused.value.message
    assert "nothing of this transaction is committed" in refused.value.message
    assert "sqlite3.connect(path, timeout=30)" in refused.value.message
    conn.rollback()

    holder.execute("COMMIT")
    conn.execute("INSERT INTO orders VALUES (42)")
    assert Producer().enqueue(conn, action_id="order-42", **INTENT).created
    conn.commit()
    assert intents(db) == ["acme/order-42"]


def test_in_a_transaction_already_open_the_enqueue_waits_for_the_lock(db: Path, holder: sqlite3.Connection) -> None:
    # an open transaction that has not read yet (as `BEGIN`, Django's atomic(), Python 3.12's
    # autocommit=False leave it): the enqueue's first read would not wait, its first write does
    conn = sqlite3.connect(db, timeout=5, isolation_level=None)
    conn.execute("BEGIN")
    timer = release_after(holder, 0.3)
    began = time.monotonic()
    assert Producer().enqueue(conn, action_id="order-42", **INTENT).created
    assert time.monotonic() - began >= 0.25
    conn.execute("INSERT INTO orders VALUES (42)")
    conn.execute("COMMIT")
    timer.join()
    assert intents(db) == ["acme/order-42"]


def test_a_transaction_that_read_first_is_told_to_begin_immediate(db: Path, holder: sqlite3.Connection) -> None:
    conn = sqlite3.connect(db, timeout=5, isolation_level=None)
    conn.execute("BEGIN")
    assert conn.execute("SELECT count(*) FROM orders").fetchone() == (0,)
    began = time.monotonic()
    with pytest.raises(StoreUnavailable) as refused:
        Producer().enqueue(conn, action_id="order-42", **INTENT)
    assert time.monotonic() - began < 2.5  # SQLite refuses at once: there was no waiting to do
    assert "had read the database before its first write" in refused.value.message
    assert "BEGIN IMMEDIATE" in refused.value.message
    conn.execute("ROLLBACK")

    timer = release_after(holder, 0.2)
    conn.execute("BEGIN IMMEDIATE")  # what the message says: it waits for the lock, then reads
    assert conn.execute("SELECT count(*) FROM orders").fetchone() == (0,)
    assert Producer().enqueue(conn, action_id="order-42", **INTENT).created
    conn.execute("COMMIT")
    timer.join()
    assert intents(db) == ["acme/order-42"]


async def test_aiosqlite_waits_for_the_lock_and_when_it_cannot_says_so(db: Path, holder: sqlite3.Connection) -> None:
    async with aiosqlite.connect(db, timeout=0.2) as conn:
        with pytest.raises(StoreUnavailable) as refused:
            await AsyncProducer().enqueue(conn, action_id="order-42", **INTENT)
        assert "busy timeout (200 ms)" in refused.value.message
        await conn.rollback()

    async with aiosqlite.connect(db, timeout=5, isolation_level=None) as conn:
        await conn.execute("BEGIN")
        timer = release_after(holder, 0.3)
        began = time.monotonic()
        assert (await AsyncProducer().enqueue(conn, action_id="order-42", **INTENT)).created
        assert time.monotonic() - began >= 0.25
        await conn.execute("COMMIT")
        timer.join()
    assert intents(db) == ["acme/order-42"]
