"""The reconcile probe end to end: our sender and our receivers' middleware over real HTTP.

Between them sits a "network" that can lose a response or hold a request back, which is how an
outcome becomes unknown in the first place.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest

from outbox import DestinationSpec, ManualClock, Outbox, Settings, Status, Submission
from receivers import IdempotencyMiddleware, SqliteRecordStore
from sender import Worker

from ..conftest import SECRET
from ..servers import Served


class Network:
    """Wraps the receiving app: may drop the first response for a key, or hold its request."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.lose_first_response = False
        self.hold_first_request: threading.Event | None = None
        self.seen: Counter[str] = Counter()
        self.late_answered = threading.Event()  # set once the held request got its answer
        self.late_status: int | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = dict(scope.get("headers", []))
        key = headers.get(b"idempotency-key", b"").decode()
        probe = b"outbox-reconcile" in headers
        first = not probe and self.seen[key] == 0
        if not probe:
            self.seen[key] += 1
        if first and self.hold_first_request is not None:
            # The request has arrived whole at the edge, but reaches the app only much later.
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            while not self.hold_first_request.is_set():
                await asyncio.sleep(0.01)

            async def late_receive() -> dict[str, Any]:
                return {"type": "http.request", "body": body, "more_body": False}

            async def note(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    self.late_status = message["status"]
                    self.late_answered.set()

            await self.app(scope, late_receive, note)  # its client gave up long ago
            return
        if first and self.lose_first_response:
            async def swallow(message: dict[str, Any]) -> None:
                return None  # the response never makes it back

            await self.app(scope, receive, swallow)
            await asyncio.sleep(2)  # hold the connection until the sender (1 s) gives up
            return
        await self.app(scope, receive, send)


class Effects:
    """The receiving application: records each effect it makes."""

    def __init__(self) -> None:
        self.made: list[tuple[str, int]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        context = scope["state"]["idempotency"]
        self.made.append((context.key, context.epoch))
        body = b'{"ok": true}'
        await send({"type": "http.response.start", "status": 201,
                    "headers": [(b"content-type", b"application/json"), (b"external-id", b"rcpt-1")]})
        await send({"type": "http.response.body", "body": body})


@pytest.fixture
async def world(tmp_path) -> AsyncIterator[tuple[Outbox, Network, Effects]]:
    effects = Effects()
    store = SqliteRecordStore(tmp_path / "records.db")
    network = Network(IdempotencyMiddleware(effects, store, secrets=SECRET))  # the probe needs them
    served = Served(network)
    clock = ManualClock()
    box = await Outbox.open(f"sqlite:///{tmp_path / 'outbox.db'}", clock=clock,
                            settings=Settings(authority="allow-all"))
    # No declared idempotency: an unknown outcome may not be retried blindly; only the probe helps.
    await box.put_destination("hook", DestinationSpec(
        url=f"{served.url}/orders", secret=SECRET, allow_private_network=True, timeout_seconds=1.0,
        idempotent=False, reconcile=True))
    try:
        yield box, network, effects
    finally:
        await box.close()
        served.stop()
        await store.close()


async def test_a_lost_response_is_reconciled_as_delivered_without_a_second_effect(world):
    box, network, effects = world
    network.lose_first_response = True
    await box.enqueue(destination="hook", scope="acme", action_id="order-1", payload={"n": 1})
    worker = Worker(box)
    await worker.run_once()
    intent = await box.get("order-1")
    history = await box.history("order-1")
    assert intent.status is Status.DELIVERED
    assert [a.submission for a in history.attempts] == [Submission.MAYBE_SUBMITTED]
    reconciled = [e for e in history.events if e.kind == "reconciled"]
    assert reconciled[0].data["state"] == "completed" and reconciled[0].data["external_id"] == "rcpt-1"
    assert effects.made == [("acme/order-1", 1)]
    await worker.aclose()


async def test_a_probe_before_the_request_arrives_fences_the_late_request_out(world):
    box, network, effects = world
    network.hold_first_request = threading.Event()
    await box.enqueue(destination="hook", scope="acme", action_id="order-2", payload={"n": 2})
    worker = Worker(box)
    await worker.run_once()
    intent = await box.get("order-2")
    assert intent.status is Status.PENDING  # absent: the old request can no longer take effect
    [reconciled] = [e for e in (await box.history("order-2")).events if e.kind == "reconciled"]
    assert reconciled.data["state"] == "absent"
    assert effects.made == []

    network.hold_first_request.set()  # the stuck request finally arrives, with its old fence
    assert await asyncio.to_thread(network.late_answered.wait, 10)
    assert network.late_status == 409
    assert effects.made == []  # refused as a stale fence: the handler never ran

    box.clock.advance(1)  # type: ignore[attr-defined]
    await worker.run_once()
    assert (await box.get("order-2")).status is Status.DELIVERED
    assert effects.made == [("acme/order-2", 1)]
    await worker.aclose()
