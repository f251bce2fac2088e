"""A sender's URL typo, end to end: our sender, a FastAPI receiver behind the receivers'
middleware on a real uvicorn, and an operator's fix followed by a replay.

The receiving app's router answers the wrong path 404 before any handler runs, so the middleware
must not keep that answer for the key: after the fix, the replay (same idempotency key) runs the
handler once and is delivered, instead of replaying the stored 404 or, at the corrected path (a
different fingerprint), answering 422 key reused.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fastapi import FastAPI, Request

from outbox import DestinationSpec, ManualClock, Outbox, Settings, Status
from outbox.operations import Actor, replay
from receivers import IdempotencyMiddleware, SqliteRecordStore, State
from receivers.keys import identity
from sender import Worker

from ..conftest import SECRET
from ..servers import Served

RIGHT, TYPO = "/webhooks/billing", "/webhooks/biling"


@dataclass
class Receiver:
    """The receiving application: a FastAPI app whose handler's runs are its effects."""

    app: FastAPI = field(default_factory=FastAPI)
    effects: list[tuple[str, str, int]] = field(default_factory=list)  # (path, key, epoch)

    def __post_init__(self) -> None:
        self.app.post(RIGHT)(self.billing)

    async def billing(self, request: Request) -> dict[str, str]:
        work = request.state.idempotency
        self.effects.append((request.url.path, work.key, work.epoch))
        return {"external_id": f"inv-{len(self.effects)}"}


@dataclass
class World:
    box: Outbox
    receiver: Receiver
    records: SqliteRecordStore
    url: str


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    receiver = Receiver()
    records = SqliteRecordStore(tmp_path / "idempotency.db")
    receiver.app.add_middleware(IdempotencyMiddleware, store=records, secrets=SECRET)
    served = Served(receiver.app)
    box = await Outbox.open(f"sqlite:///{tmp_path / 'outbox.db'}", clock=ManualClock(),
                            settings=Settings(authority="allow-all"))
    try:
        yield World(box, receiver, records, served.url)
    finally:
        await box.close()
        served.stop()


async def put_hook(world: World, path: str) -> None:
    await world.box.put_destination("billing", DestinationSpec(
        url=f"{world.url}{path}", secret=SECRET, allow_private_network=True, timeout_seconds=5.0))


async def run_worker(world: World) -> None:
    worker = Worker(world.box)
    try:
        await worker.run_once()
    finally:
        await worker.aclose()


@pytest.mark.parametrize("fix", ["the destination's url", "the receiving app's route"])
async def test_a_typo_in_the_url_fixed_then_replayed_is_delivered_once(world: World, fix: str) -> None:
    await put_hook(world, TYPO)
    await world.box.enqueue(destination="billing", scope="acme", action_id="inv-42", payload={"amount": 42})
    await run_worker(world)
    dead = await world.box.get("inv-42")
    assert dead.status is Status.DEAD
    [attempt] = (await world.box.history("inv-42")).attempts
    assert attempt.status_code == 404 and world.receiver.effects == []
    # the router's 404 left nothing behind for the key
    assert (await world.records.get(identity("default", "acme/inv-42"))).state is State.ABSENT

    if fix == "the destination's url":
        await put_hook(world, RIGHT)
    else:
        world.receiver.app.post(TYPO)(world.receiver.billing)
    await replay(world.box, "inv-42", Actor("ops", f"fixed {fix}"))
    await run_worker(world)  # a new worker: one running reads a changed destination within seconds

    intent = await world.box.get("inv-42")
    history = await world.box.history("inv-42")
    assert intent.status is Status.DELIVERED, [(a.status_code, a.error) for a in history.attempts]
    assert [a.status_code for a in history.attempts] == [404, 200]
    assert history.attempts[-1].external_id == "inv-1"
    path = RIGHT if fix == "the destination's url" else TYPO
    assert world.receiver.effects == [(path, "acme/inv-42", 2)]
    assert (await world.records.get(identity("default", "acme/inv-42"))).state is State.COMPLETED
