"""What the RabbitMQ and NATS consumers' tests share: messages made as the broker channels make
them (``sender.envelope`` over a real ``outbox`` intent), the shared servers (a test FAILS under
CI=true when one does not answer, and skips elsewhere), and a record store whose completions fail."""

from __future__ import annotations

import dataclasses
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from outbox import Destination, Intent, OnUnknown, Status
from outbox.digest import canonical_json, digest_of
from receivers import IdempotencyContext
from receivers.messages import Refused
from sender import envelope
from sender.channel import Send
from tests.conftest import SECRET

#: How long a shared server may take to answer (RabbitMQ may take a minute to come up on CI).
START_SECONDS = 60.0
NOW = datetime(2030, 1, 1, tzinfo=UTC)
_DESTINATION = Destination("orders", "rabbitmq", {}, (SECRET,), True, 3600, OnUnknown.ALWAYS, 5.0, False, False,
                           False, NOW, NOW)
_INTENT = Intent(1, "a", "acme", "orders", "rabbitmq", "{}", "sha256:x", Status.LEASED, 1, 5, NOW, None, None, "w",
                 NOW, 1, NOW, NOW, None)


def require(port: int, name: str) -> None:
    """Wait for ``name`` on 127.0.0.1:``port``; not there in time: FAIL under CI=true, else skip."""
    deadline = time.monotonic() + (START_SECONDS if os.environ.get("CI") == "true" else 2.0)
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError as exc:
            if time.monotonic() > deadline:
                message = f"{name} does not answer on 127.0.0.1:{port}: {exc}"
                if os.environ.get("CI") == "true":
                    pytest.fail(message)
                pytest.skip(message)
            time.sleep(0.2)


def suffix() -> str:
    return uuid.uuid4().hex[:12]


@dataclass(frozen=True)
class Sent:
    """One message of an attempt as a broker channel publishes it."""

    key: str
    body: bytes
    headers: dict[str, str]


def sent(action_id: str, payload: Any, *, fence: int = 1, signing: tuple[str, ...] = (SECRET,),
         scope: str = "acme") -> Sent:
    """The body and headers the broker channels put on an attempt of ``action_id`` (a real
    intent, attempt and fence), signed with ``signing``."""
    body = canonical_json(payload)
    intent = dataclasses.replace(_INTENT, action_id=action_id, scope=scope, payload_json=body.decode(),
                                 payload_digest=digest_of(body), fence=fence)
    send = Send(intent, _DESTINATION, uuid.uuid4().hex, fence)
    body = envelope.payload(send)
    return Sent(intent.key, body, dict(envelope.headers(send, signing, int(time.time()), body)))


@dataclass
class Effects:
    """The handler's effects and the refusals reported to ``on_error``."""

    scope: str
    done: list[tuple[str, int]] = field(default_factory=list)  # key, epoch
    refused: list[Refused] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)
    fail: dict[str, int] = field(default_factory=dict)  # key: how many first calls raise

    async def handle(self, message: Any, context: IdempotencyContext) -> None:
        assert context.scope == self.scope
        self.calls[context.key] = self.calls.get(context.key, 0) + 1
        if self.calls[context.key] <= self.fail.get(context.key, 0):
            raise RuntimeError(f"{context.key} fails this time")
        self.done.append((context.key, context.epoch))

    def on_error(self, message: Any, refused: Refused) -> None:
        self.refused.append(refused)

    @property
    def keys(self) -> list[str]:
        return [key for key, _ in self.done]


class FailingCompletions:
    """A record store whose first ``failures`` completion transactions fail (the store went away
    after the handler ran); ``events`` says, in order, when completions failed and were stored."""

    def __init__(self, store: Any, failures: int, events: list[str]) -> None:
        self._store, self.failures, self.events = store, failures, events

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def complete_many(self, done: Any, **options: Any) -> list[bool]:
        if self.failures > 0:
            self.failures -= 1
            self.events.append("completion failed")
            raise ConnectionError("the record store went away")
        stored: list[bool] = await self._store.complete_many(done, **options)
        self.events += [f"completed {identity}" for identity, _, _ in done]
        return stored
