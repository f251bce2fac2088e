"""The served API and its tokens, and outboxes on real SQLite files for the sender's integration
tests (their receivers: ``receiver`` and ``start_receiver`` in tests/conftest.py)."""

from __future__ import annotations

import asyncio
import base64
import socket
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from outbox import Destination, DestinationSpec, Intent, ManualClock, Outbox, Role, Settings, Status
from outbox.grants import GrantSpec
from sender import Worker

from ..conftest import SECRET

# -- the HTTP API served by a real uvicorn on loopback, over a real SQLite file -----------------


@dataclass
class Api:
    """The served API, its database file and a token of each role."""

    url: str
    admin: str
    operator: str
    producer: str  # scopes acme, shop
    db_path: Path

    def client(self, token: str | None) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=30)


@pytest.fixture
def api_settings() -> dict[str, Any]:
    """The served API's settings besides its database: no embedded sender, payloads up to 4096
    bytes. A module whose API runs otherwise overrides this fixture."""
    return {"max_payload_bytes": 4096, "worker": False}


@pytest.fixture
async def api(db_path: Path, db_url: str, serve_api: Callable[[Settings], str], api_settings: dict[str, Any]) -> Api:
    """The API served on the SQLite file at ``db_path`` with ``api_settings``, the destination
    ``billing`` and the three tokens."""
    async with await Outbox.open(db_url) as box:
        await box.put_destination("billing", DestinationSpec(url="https://billing.example/", secret=SECRET))
        admin, _ = await box.create_token(Role.ADMIN)
        operator, _ = await box.create_token(Role.OPERATOR)
        producer, _ = await box.create_token(Role.PRODUCER, ["acme", "shop"])
    return Api(serve_api(Settings(database_url=db_url, **api_settings)), admin, operator, producer, db_path)


# -- an outbox on a real SQLite file, a manual clock, and the workers a test makes ------------

SECRET_NEW = "whsec_" + base64.b64encode(bytes(range(100, 132))).decode()
SECRET_OTHER = "whsec_" + base64.b64encode(bytes(range(200, 232))).decode()


@dataclass
class SenderEnv:
    """What a sender test works with."""

    box: Outbox
    clock: ManualClock
    workers: list[Worker] = field(default_factory=list)
    path: Path | None = None  # the SQLite file

    def worker(self, **options: Any) -> Worker:
        """A Worker on this outbox (closed after the test)."""
        worker = Worker(self.box, **options)
        self.workers.append(worker)
        return worker

    @asynccontextmanager
    async def running(self, **options: Any) -> AsyncIterator[tuple[Worker, asyncio.Task[None]]]:
        """A Worker running (``run()``) while the block lasts, then stopped and awaited, its
        drain included; the block gets the worker and its task."""
        worker = self.worker(**options)
        task = asyncio.create_task(worker.run())
        try:
            yield worker, task
        finally:
            worker.stop()
            await asyncio.wait_for(task, 10)

    async def status_is(self, action_id: str, status: Status) -> bool:
        return (await self.box.get(action_id)).status is status

    async def destination(self, url: str, destination_id: str = "hook", **spec: Any) -> Destination:
        """Register a webhook destination; by default loopback is allowed, timeout 1 s,
        idempotent with an hour's retention."""
        options: dict[str, Any] = {"secret": SECRET, "allow_private_network": True, "timeout_seconds": 1,
                                   "idempotent": True, "retention_seconds": 3600, **spec}
        destination, _ = await self.box.put_destination(destination_id, DestinationSpec(url=url, **options))
        return destination

    async def legacy_destination(self, url: str, destination_id: str = "hook", *,
                                 allow_private_network: bool = False, **spec: Any) -> None:
        """A destination row as stored before registration checked what it checks now: registered
        with a placeholder URL, then its url and allow_private_network written straight into the
        SQLite table."""
        await self.destination("https://placeholder.example/", destination_id, **spec)
        assert self.path is not None
        with sqlite3.connect(self.path, timeout=10) as conn:
            conn.execute("UPDATE destinations SET settings = json_object('url', ?), allow_private_network = ? "
                         "WHERE id = ?", (url, int(allow_private_network), destination_id))
        conn.close()

    async def enqueue(self, action_id: str, payload: Any = None, *, destination: str = "hook",
                      scope: str = "acme", **options: Any) -> Intent:
        result = await self.box.enqueue(destination=destination, scope=scope, action_id=action_id,
                                        payload={"action": action_id} if payload is None else payload,
                                        **options)
        return result.intent

    async def due_in(self, action_id: str) -> float:
        """Seconds (by the manual clock) until the intent is next due."""
        intent = await self.box.get(action_id)
        return (intent.next_attempt_at - self.clock.now()).total_seconds()

    async def advance_until_due(self, action_id: str) -> None:
        """Move the clock exactly to the intent's next_attempt_at (never backwards)."""
        self.clock.advance(max(0.0, await self.due_in(action_id)))

    async def aclose(self) -> None:
        for worker in self.workers:
            await worker.aclose()
        await self.box.close()


@pytest.fixture
async def open_env(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[SenderEnv]]]:
    """Open an outbox (``o.db`` in tmp_path) with a ManualClock and the given Settings
    (defaults: grants authority, no caching, 30 s leases); a grant lets scope acme reach every
    destination unless ``grant=False``."""
    opened: list[SenderEnv] = []

    async def open_(*, grant: bool = True, **settings: Any) -> SenderEnv:
        clock = ManualClock()
        values: dict[str, Any] = {"authority": "grants", "authority_seconds": 0, "lease_seconds": 30,
                                  **settings}
        box = await Outbox.open(f"sqlite:///{tmp_path / 'o.db'}", settings=Settings(**values), clock=clock)
        env = SenderEnv(box, clock, path=tmp_path / "o.db")
        opened.append(env)
        if grant:
            await box.put_grant("g1", GrantSpec(scope="acme", destination="*"))
        return env

    yield open_
    for env in opened:
        await env.aclose()


@pytest.fixture
async def env(open_env: Callable[..., Awaitable[SenderEnv]]) -> SenderEnv:
    """The default SenderEnv."""
    return await open_env()


@dataclass
class Listener:
    """A plain TCP listener on 127.0.0.1: counts every connection it accepts (a request or not)
    and answers whatever arrives with a 200."""

    port: int
    connections: int = 0


@pytest.fixture
async def listener() -> AsyncIterator[Listener]:
    """A running Listener, closed after the test."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        found.connections += 1
        try:
            await reader.read(65536)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    found = Listener(server.sockets[0].getsockname()[1])
    try:
        yield found
    finally:
        server.close()
        await server.wait_closed()


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port bound but not listening: connecting to it is refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


@pytest.fixture
def unanswered_port() -> Iterator[int]:
    """A loopback port whose TCP handshake never completes, so a connect to it can only time out.

    The socket listens with backlog 0 and never accepts; a few non-blocking connects fill its
    accept queue, after which Linux drops further SYNs (syncookies or not). That it really does
    is checked here, so a kernel that completes the handshake anyway fails the test, never skips it.
    """
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    fillers: list[socket.socket] = []
    try:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port: int = server.getsockname()[1]
        for _ in range(3):
            filler = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.settimeout(0.2)
            try:
                probe.connect(("127.0.0.1", port))
            except TimeoutError:
                pass
            else:
                pytest.fail("a connect to a full accept queue completed: no way to make a real connect timeout here")
        yield port
    finally:
        for filler in fillers:
            filler.close()
        server.close()
