"""Shared fixtures for the receivers' tests: an injectable clock, the real PostgreSQL (fails
instead of skipping when CI=true), record stores over one storage for the consumers, and ASGI
apps served by a real uvicorn on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from receivers import MemoryRecordStore, PostgresRecordStore, SqliteRecordStore

from .. import pg

PG_DSN = os.environ.get("RECEIVERS_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


class Clock:
    """An injected clock: ``clock()`` is the current time; tests move it by hand."""

    def __init__(self, start: datetime = T0) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float = 0, *, microseconds: int = 0) -> datetime:
        self.now += timedelta(seconds=seconds, microseconds=microseconds)
        return self.now

    def set(self, when: datetime) -> datetime:
        self.now = when
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def pg_dsn() -> str:
    """The DSN of the real PostgreSQL; unreachable: FAIL under CI=true, skip otherwise."""
    return pg.require(PG_DSN)


@pytest.fixture
async def pg_table(pg_dsn: str) -> AsyncIterator[str]:
    """A unique table name for this test, dropped afterwards."""
    import asyncpg

    name = "idem_" + uuid.uuid4().hex[:20]
    yield name
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(f"DROP TABLE IF EXISTS {name}")
    finally:
        await conn.close()


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def new_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Callable[[], Any]]:
    """Makes record stores over one storage (memory: the same store), as consumer processes would."""
    table = "idem_" + uuid.uuid4().hex[:20]
    if request.param == "memory":
        shared = MemoryRecordStore()
        yield lambda: shared
        return
    if request.param == "sqlite":
        yield lambda: SqliteRecordStore(tmp_path / "records.db")
        return
    dsn = request.getfixturevalue("pg_dsn")
    yield lambda: PostgresRecordStore(dsn, table=table, pool_size=2)
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"DROP TABLE IF EXISTS {table}")
    finally:
        await conn.close()


class UvicornServer:
    """A real uvicorn on 127.0.0.1, port 0, in a background thread. Lifespan is on: the
    middleware closes its store (opened lazily on the server's loop) when the server shuts down."""

    def __init__(self, app: Any) -> None:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="critical",
                                lifespan="on", timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True, name="receivers-uvicorn")
        self.port: int | None = None

    def start(self) -> UvicornServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.005)  # startup polling, not timing
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if not self.thread.is_alive():
            return
        self.server.should_exit = True
        self.thread.join(15)
        assert not self.thread.is_alive(), "uvicorn did not stop"


@pytest.fixture
def serve() -> Iterator[Any]:
    """``serve(app) -> UvicornServer`` (stopped after the test)."""
    servers: list[UvicornServer] = []

    def start(app: Any) -> UvicornServer:
        server = UvicornServer(app).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


class Watched:
    """A store wrapper that lets a test wait until a request's outcome is recorded: the
    middleware records it after the response went out, so a client can be faster."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._done = threading.Condition()
        self.finished = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def complete(self, *args: Any, **kwargs: Any) -> bool:
        try:
            return await self.inner.complete(*args, **kwargs)
        finally:
            with self._done:
                self.finished += 1
                self._done.notify_all()

    async def release(self, *args: Any, **kwargs: Any) -> bool:
        try:
            return await self.inner.release(*args, **kwargs)
        finally:
            with self._done:
                self.finished += 1
                self._done.notify_all()

    async def wait_finished(self, count: int) -> None:
        def wait() -> bool:
            with self._done:
                return self._done.wait_for(lambda: self.finished >= count, 10)

        assert await asyncio.to_thread(wait), f"{self.finished} outcomes recorded, expected {count}"
