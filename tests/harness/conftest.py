"""What the harness tests share: a real served outbox (``outbox serve``'s service, its embedded
worker delivering) and a real receiver behind the receivers' idempotency middleware, which
counts each key's effects."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from outbox import DestinationSpec, Outbox, Role, Settings
from outbox.grants import GrantSpec
from receivers import IdempotencyMiddleware, SqliteRecordStore

from ..conftest import SECRET
from ..servers import Served

SCOPE = "acme"
#: The destinations the tests send to, one receiver path each: the ``refunds`` grant is withdrawn,
#: ``wires`` holds each intent for approval, ``paused`` is disabled (its intents stay pending).
PATHS = ("billing", "slow", "gone", "refunds", "wires", "paused")


class Effects:
    """The receiving application: each key's effects, and an answer per path. ``/slow`` takes
    effect and then answers too late for the sender; ``/gone`` refuses for good."""

    def __init__(self) -> None:
        self.keys: Counter[str] = Counter()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope["path"].strip("/")
        status, body = 200, b""
        if path == "gone":
            status = 400
        else:
            self.keys[scope["state"]["idempotency"].key] += 1
            body = json.dumps({"external_id": f"{path}-{sum(self.keys.values())}"}).encode()
            if path == "slow":
                await asyncio.sleep(2)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})


@dataclass
class Service:
    """A served outbox and its receiver: the URL, a producer's and an operator's tokens."""

    url: str
    producer: str
    operator: str
    effects: Effects
    database: str


@pytest.fixture
async def service(tmp_path: Path, serve_api: Callable[[Settings], str]) -> AsyncIterator[Service]:
    effects = Effects()
    records = SqliteRecordStore(tmp_path / "records.db")
    receiver = Served(IdempotencyMiddleware(effects, records, secrets=SECRET))
    database = f"sqlite:///{tmp_path / 'outbox.db'}"
    async with await Outbox.open(database) as box:
        for path in PATHS:
            await box.put_destination(path, DestinationSpec.model_validate({
                "url": f"{receiver.url}/{path}", "secret": SECRET, "allow_private_network": True,
                "idempotent": path != "slow", "on_unknown": "never" if path == "slow" else "declared",
                "timeout_seconds": 0.5, "requires_approval": path == "wires", "disabled": path == "paused"}))
            await box.put_grant(f"{SCOPE}-{path}", GrantSpec(scope=SCOPE, destination=path))
        await box.delete_grant(f"{SCOPE}-refunds")  # refunds: the grant was withdrawn
        producer, _ = await box.create_token(Role.PRODUCER, [SCOPE])
        operator, _ = await box.create_token(Role.OPERATOR, [])
    url = serve_api(Settings(database_url=database, worker=True, authority="grants", poll_seconds=0.05))
    yield Service(url, producer, operator, effects, database)
    receiver.stop()
    await records.close()
