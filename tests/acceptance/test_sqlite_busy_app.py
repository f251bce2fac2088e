"""SQLite under a busy application: eight threads of a synchronous app, each on its own sqlite3
connection to the service's database file, write a row of their own and enqueue with
``Producer`` in one transaction, over and over, while a real ``outbox worker`` process delivers
to a real receiver.

The threads take the ways of beginning a transaction an application has (Python beginning it
``IMMEDIATE`` before the app's own insert, sqlite3's default with the enqueue first, an explicit
``BEGIN`` with the enqueue first), with the README's setup: a busy timeout of 30 s. Two more
keep a short one (50 ms) and run a transaction the outbox refused again. What must hold: no
sqlite3 "database is locked" reaches the application (a refusal is StoreUnavailable saying what
happened, only where the busy timeout is short, and running it again succeeds), every committed
row has its intent, every intent is delivered exactly once, and nothing else is.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from outbox import DestinationSpec, Outbox, Producer, StoreUnavailable
from outbox.grants import GrantSpec

from ..conftest import SECRET
from ..receiver import Receiver, Reply
from .conftest import clean_env, outbox_worker

pytestmark = pytest.mark.acceptance

#: Transactions each thread commits.
PER_THREAD = 100
#: The README's busy timeout for an application's connections to the service's file, and a short one.
PATIENT, SHORT = 30.0, 0.05


@dataclass
class App:
    """One thread of the application: how it begins its transactions, its busy timeout, and
    what it saw."""

    name: str
    begin: str  # "immediate": Python begins IMMEDIATE before the app's insert; "default": sqlite3's
    # implicit BEGIN, the enqueue first (the outbox begins IMMEDIATE); "begin": an explicit BEGIN, the enqueue first
    timeout: float
    committed: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)  # StoreUnavailable's messages, each run again
    failures: list[BaseException] = field(default_factory=list)  # anything else: the test fails

    def run(self, db: Path, producer: Producer) -> None:
        isolation = "IMMEDIATE" if self.begin == "immediate" else None if self.begin == "begin" else ""
        conn = sqlite3.connect(db, timeout=self.timeout, isolation_level=isolation)
        try:
            for n in range(PER_THREAD):
                order = f"{self.name}-{n}"
                while True:
                    try:
                        self.transaction(conn, producer, order)
                    except StoreUnavailable as exc:
                        conn.rollback()
                        self.refusals.append(exc.message)
                        continue
                    self.committed.append(order)
                    break
        except BaseException as exc:  # (a thread's failure is the test's)
            self.failures.append(exc)
        finally:
            conn.close()

    def transaction(self, conn: sqlite3.Connection, producer: Producer, order: str) -> None:
        def insert() -> None:
            conn.execute("INSERT INTO orders (id, thread, note) VALUES (?, ?, ?)", (order, self.name, "x" * 100))

        def enqueue() -> None:
            producer.enqueue(conn, destination="billing", scope="acme", action_id=order, payload={"order": order})

        if self.begin == "begin":
            conn.execute("BEGIN")
        for step in (insert, enqueue) if self.begin == "immediate" else (enqueue, insert):
            step()
        conn.commit()


@pytest.fixture
def shop(tmp_path: Path, receiver: Receiver) -> Iterator[Path]:
    """The service's database file with the destination ``billing`` (the receiver), a grant for
    acme, and the application's ``orders`` table."""
    receiver.script("/hook", Reply(200))
    db = tmp_path / "outbox.db"

    async def prepare() -> None:
        async with await Outbox.open(f"sqlite:///{db}") as box:
            await box.put_destination("billing", DestinationSpec(
                url=f"{receiver.url}/hook", secret=SECRET, allow_private_network=True))
            await box.put_grant("acme-billing", GrantSpec(scope="acme", destination="billing"))

    asyncio.run(prepare())
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE orders (id TEXT PRIMARY KEY, thread TEXT NOT NULL, note TEXT NOT NULL)")
    yield db


def wait_delivered(db: Path, count: int, timeout: float) -> bool:
    """Whether ``count`` intents are delivered (their outcomes recorded) within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with sqlite3.connect(db) as conn:
            if conn.execute("SELECT count(*) FROM intents WHERE status = 'delivered'").fetchone()[0] >= count:
                return True
        time.sleep(0.05)
    return False


def run_threads(apps: list[App], work: Callable[[App], None]) -> None:
    threads = [threading.Thread(target=work, args=(app,), name=app.name) for app in apps]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive(), f"{thread.name} is still running after 60 s"


def test_eight_threads_enqueue_in_their_transactions_while_the_service_delivers(
        tmp_path: Path, shop: Path, receiver: Receiver) -> None:
    apps = [App(f"t{n}", ("immediate", "default", "begin")[n % 3], PATIENT) for n in range(6)]
    apps += [App("s0", "default", SHORT), App("s1", "begin", SHORT)]
    producer = Producer()
    with outbox_worker(tmp_path, clean_env(OUTBOX_DATABASE_URL=f"sqlite:///{shop}")) as (worker, log):
        run_threads(apps, lambda app: app.run(shop, producer))
        assert [app.failures for app in apps] == [[]] * len(apps)
        committed = sorted(order for app in apps for order in app.committed)
        assert len(committed) == len(apps) * PER_THREAD
        requests = receiver.wait_for_requests_blocking(len(committed), "/hook", timeout=30)
        assert wait_delivered(shop, len(committed), timeout=30), log.read_text()
        assert worker.poll() is None, log.read_text()

    # only a short busy timeout is refused, and each refusal says what happened and what to do
    for app in apps:
        if app.timeout == PATIENT:
            assert app.refusals == [], (app.name, app.refusals[:1])
        for message in app.refusals:
            assert "nothing of this transaction is committed" in message, message
            assert "busy timeout (50 ms)" in message, message
    # every committed row has its intent, and nothing else was enqueued
    with sqlite3.connect(shop) as conn:
        orders = sorted(order for (order,) in conn.execute("SELECT id FROM orders"))
        intents = dict(conn.execute("SELECT action_id, status FROM intents").fetchall())
    assert orders == committed
    assert sorted(intents) == committed
    # every intent delivered, exactly once, and nothing else
    seen = Counter(r.headers["idempotency-key"] for r in receiver.requests("/hook"))
    assert len(requests) == len(committed)
    assert seen == Counter({f"acme/{order}": 1 for order in committed})
    assert all(r.json() == {"order": r.headers["idempotency-key"].removeprefix("acme/")}
               for r in receiver.requests("/hook"))
    assert set(intents.values()) == {"delivered"}
    print(f"refused and run again: {Counter({app.name: len(app.refusals) for app in apps if app.refusals})}")
