"""Operators' tests: a real outbox on a SQLite file in tmp_path, the real API served by uvicorn
on 127.0.0.1 (port 0) in the test's own event loop (so the app, the test and an in-process
``sender.Worker`` share one ``Outbox``), and a real scriptable webhook receiver."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from outbox import DestinationSpec, Intent, ManualClock, Outbox, Role, Settings, Status
from outbox.app.service import create_service
from outbox.grants import GrantSpec
from sender import Worker

from ..conftest import SECRET
from ..receiver import Received, Receiver, Reply

#: Statuses in which an intent still waits for a worker.
WAITING = (Status.PENDING, Status.LEASED)


class Switch:
    """A receiver handler that answers 503 until ``fix()``, then 200; it remembers every answer
    it gave as ``(idempotency key, status)``, so a test can count the 2xx per key."""

    def __init__(self) -> None:
        self._fixed = threading.Event()
        self._lock = threading.Lock()
        self.answers: list[tuple[str, int]] = []

    def fix(self) -> None:
        self._fixed.set()

    def __call__(self, request: Received) -> Reply:
        key = request.headers.get("idempotency-key", "").rpartition("/")[2]  # scope/action_id: kept by action id
        fixed = self._fixed.is_set()
        reply = Reply(200, headers={"External-Id": f"rcpt-{key}"}) if fixed else Reply(503, body="down")
        with self._lock:
            self.answers.append((key, reply.status))
        return reply

    def successes(self) -> dict[str, int]:
        """How many 2xx answers each key got."""
        with self._lock:
            counts: dict[str, int] = {}
            for key, status in self.answers:
                if 200 <= status < 300:
                    counts[key] = counts.get(key, 0) + 1
            return counts


@asynccontextmanager
async def serve_in_loop(app: FastAPI) -> AsyncIterator[str]:
    """Serve ``app`` with a real uvicorn on 127.0.0.1 (a free port) in the running loop."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           timeout_graceful_shutdown=5))
    task = asyncio.create_task(server.serve())
    deadline = time.monotonic() + 10
    while not server.started:
        if task.done():
            task.result()  # raises what stopped it
            raise RuntimeError("uvicorn stopped before it started")
        assert time.monotonic() < deadline, "uvicorn did not start"
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 20)


class Filled:
    """What the API's and the CLI's tests share: an outbox the test fills with the library, a
    receiver its destinations point at, and in-process workers run until intents settle."""

    box: Outbox
    receiver: Receiver
    clock: ManualClock | None

    async def destination(self, destination_id: str, path: str, **spec: Any) -> None:
        """A webhook destination at the receiver's ``path`` (loopback allowed, 1 s timeout,
        not idempotent unless said)."""
        options: dict[str, Any] = {"secret": SECRET, "allow_private_network": True, "timeout_seconds": 1, **spec}
        await self.box.put_destination(destination_id, DestinationSpec(url=self.receiver.url + path, **options))

    async def enqueue(self, action_id: str, *, destination: str = "hook", scope: str = "acme",
                      **options: Any) -> Intent:
        result = await self.box.enqueue(destination=destination, scope=scope, action_id=action_id,
                                        payload={"action": action_id}, **options)
        return result.intent

    async def status(self, action_id: str) -> Status:
        return (await self.box.get(action_id)).status

    async def deliver(self, action_ids: Iterable[str], *, timeout: float = 30, worker: Worker | None = None) -> None:
        """Run a worker (``run_once``; a fresh one unless given) until none of these intents
        waits any more."""
        own = worker is None
        worker = worker or Worker(self.box)
        ids = list(action_ids)
        deadline = time.monotonic() + timeout
        try:
            while True:
                waiting = [i for i in ids if await self.status(i) in WAITING]
                if not waiting:
                    return
                assert time.monotonic() < deadline, f"still waiting after {timeout}s: {waiting[:5]}"
                if not await worker.run_once():
                    if self.clock is not None:  # a manual clock: move it to the next due intent
                        due = await self.box.store.next_due_at()
                        if due is not None and due > self.clock.now():
                            self.clock.advance((due - self.clock.now()).total_seconds())
                            continue
                    await asyncio.sleep(0.02)  # a backoff of tens of milliseconds is running out
        finally:
            if own:
                await worker.aclose()

    async def unknowns(self, *action_ids: str, destination: str = "slow", **spec: Any) -> None:
        """Intents whose one attempt timed out at a receiver that answers late: outcome unknown.
        The receiver answers at once afterwards."""
        self.receiver.script("/slow", Reply(200, delay=2))
        await self.destination(destination, "/slow", timeout_seconds=0.3, **spec)
        for action_id in action_ids:
            await self.enqueue(action_id, destination=destination)
        await self.deliver(action_ids)
        for action_id in action_ids:
            intent = await self.box.get(action_id)
            assert intent.status is Status.UNKNOWN, intent
        self.receiver.script("/slow", Reply(200, headers={"External-Id": "late-but-fine"}))

    async def dead_letters(self, *action_ids: str) -> Switch:
        """Intents to ``hook`` (a receiver answering 503 until fixed) with one attempt each:
        dead letters. Returns the switch that fixes the receiver."""
        switch = Switch()
        self.receiver.script("/flaky", switch)
        await self.destination("hook", "/flaky")
        for action_id in action_ids:
            await self.enqueue(action_id, max_attempts=1)
        await self.deliver(action_ids)
        for action_id in action_ids:
            assert await self.status(action_id) is Status.DEAD
        return switch


@dataclass
class Ops(Filled):
    """One test's outbox, API, receiver and tokens."""

    box: Outbox
    url: str
    receiver: Receiver
    admin: str
    operator: str
    operator_actor: str  # how events name the operator token
    producer: str  # scopes acme and globex
    clock: ManualClock | None
    workers: list[Worker] = field(default_factory=list)

    def client(self, token: str | None) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=60)

    def worker(self, **options: Any) -> Worker:
        """An in-process Worker on this outbox (its connections are closed after the test)."""
        worker = Worker(self.box, **options)
        self.workers.append(worker)
        return worker

    async def events(self, action_id: str) -> list[Any]:
        return (await self.box.history(action_id)).events


OpenOps = Callable[..., Awaitable[Ops]]


@pytest.fixture
async def open_ops(tmp_path: Path) -> AsyncIterator[OpenOps]:
    """Open an outbox on ``tmp_path/ops.db`` (or the ``database_url`` given; grants authority, no
    authority cache, backoff of tens of milliseconds, a grant for scope acme to every
    destination), serve the API on it (``worker=True``: with its embedded sender) and start a
    receiver."""
    stack: list[Any] = []

    async def open_(*, worker: bool = False, clock: ManualClock | None = None, **settings: Any) -> Ops:
        url = settings.pop("database_url", f"sqlite:///{tmp_path / 'ops.db'}")
        values: dict[str, Any] = {"database_url": url, "worker": worker, "authority": "grants",
                                  "authority_seconds": 0, "backoff_initial_seconds": 0.05,
                                  "backoff_cap_seconds": 0.2, "poll_seconds": 0.2, **settings}
        box = await Outbox.open(url, settings=Settings(**values), clock=clock)
        receiver = Receiver().start()
        await box.put_grant("acme-all", GrantSpec(scope="acme", destination="*"))
        admin, _ = await box.create_token(Role.ADMIN)
        operator, info = await box.create_token(Role.OPERATOR)
        producer, _ = await box.create_token(Role.PRODUCER, ["acme", "globex"])
        served = serve_in_loop(create_service(outbox=box))
        api_url = await served.__aenter__()
        ops = Ops(box, api_url, receiver, admin, operator, info.actor, producer, clock)
        stack.append((ops, served))
        return ops

    yield open_
    for ops, served in reversed(stack):
        try:
            await served.__aexit__(None, None, None)
        finally:
            for worker in ops.workers:
                await worker.aclose()
            ops.receiver.stop()
            await ops.box.close()


@pytest.fixture
async def ops(open_ops: OpenOps) -> Ops:
    """The default: the API without an embedded sender (tests drive ``Worker`` themselves)."""
    return await open_ops()
