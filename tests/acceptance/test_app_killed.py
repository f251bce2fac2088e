"""``kill -9`` of an application process in the middle of its own transaction, on both stores.

The application (``app_process.py``, on one of ``tests.apps.KINDS``) writes its order row and
enqueues its intent in one transaction, then waits. Killed before it commits: neither the row
nor the intent exists, and ``outbox worker``, another process running all along, sends nothing
for it. Killed after it commits: both exist, and the worker delivers the intent exactly once.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from outbox import DestinationSpec, Outbox, Status
from outbox.grants import GrantSpec

from ..apps import KINDS, ORDERS, sqlite_path
from ..conftest import SECRET, records, rows
from ..receiver import Receiver, Reply
from .conftest import clean_env, kill_9, outbox_worker

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sqlite3", "sqlalchemy-session-pysqlite", "psycopg", "asyncpg",
                        "sqlalchemy-session-psycopg"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def url(kind: str, db_url: str, request: pytest.FixtureRequest) -> str:
    return db_url if KINDS[kind].store == "sqlite" else str(request.getfixturevalue("pg_url"))


@pytest.fixture
async def service(url: str, receiver: Receiver) -> AsyncIterator[Outbox]:
    """The outbox's database, its destination ``hook`` the receiver, granted to acme, with the
    application's ``orders`` table beside."""
    receiver.script("/hook", Reply(200))
    box = await Outbox.open(url)
    try:
        await box.put_destination("hook", DestinationSpec(url=f"{receiver.url}/hook", secret=SECRET,
                                                          allow_private_network=True))
        await box.put_grant("acme", GrantSpec(scope="acme", destination="hook"))
        await rows(url, ORDERS)
        yield box
    finally:
        await box.close()


class AppProcess:
    """``app_process.py`` running ``kind`` on ``url`` for order ``n``."""

    def __init__(self, kind: str, url: str, n: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.acceptance.app_process", kind, url, str(n)], cwd=ROOT,
            env=clean_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    async def expect(self, line: str) -> None:
        assert self.process.stdout is not None
        got = await asyncio.wait_for(asyncio.to_thread(self.process.stdout.readline), 30)
        if got.strip() != line:
            self.process.kill()
            assert self.process.stderr is not None
            pytest.fail(f"the app said {got!r}, not {line!r}:\n{self.process.stderr.read()}")

    def tell(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def kill_9(self) -> None:
        kill_9(self.process)
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


async def held(url: str) -> tuple[list[int], dict[str, str]]:
    """The orders and the intents (action id: status) the database holds, read from outside."""
    orders = [n for (n,) in await rows(url, "SELECT id FROM orders ORDER BY id")]
    return orders, {a: s for a, s in await rows(url, f"SELECT action_id, status FROM {records(url)} ORDER BY seq")}


async def test_an_app_killed_before_its_commit_leaves_neither_and_after_it_both_delivered_once(
        kind: str, url: str, service: Outbox, receiver: Receiver, tmp_path: Path) -> None:
    with outbox_worker(tmp_path, clean_env(OUTBOX_DATABASE_URL=url, OUTBOX_POLL_SECONDS="5")) as (worker, log):
        deadline = time.monotonic() + 20
        while "started" not in log.read_text():
            assert worker.poll() is None and time.monotonic() < deadline, log.read_text()
            await asyncio.sleep(0.02)

        before = AppProcess(kind, url, 1)
        await before.expect("written")
        assert await held(url) == ([], {})  # written, not committed: nobody else sees it
        before.kill_9()

        after = AppProcess(kind, url, 2)  # (on SQLite it takes the write lock the killed one held)
        await after.expect("written")
        after.tell("commit")
        await after.expect("committed")
        after.kill_9()

        (request,) = await receiver.wait_for_requests(1, "/hook", timeout=20)
        assert (await service.wait("order-2", timeout=10, scope="acme")).status is Status.DELIVERED
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0, log.read_text()
    assert request.headers["idempotency-key"] == "acme/order-2"
    assert receiver.requests() == [request]  # order-1 never sent, order-2 once
    assert await held(url) == ([2], {"order-2": Status.DELIVERED.value})
    assert [a.number for a in (await service.history("order-2", scope="acme")).attempts] == [1]
    if url.startswith("sqlite:"):
        with sqlite3.connect(sqlite_path(url)) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
