"""Ordering per key, end to end: a worker on a real SQLite file delivers to a real uvicorn
receiver, and each ordering key of an ordered destination reaches it in enqueue order."""

from __future__ import annotations

import asyncio
import random
import threading
from pathlib import Path

import pytest

from outbox import DestinationSpec, Outbox, Settings, Status
from outbox.operations import Actor, cancel, replay
from sender import Worker

from ..conftest import eventually
from ..receiver import Received, Receiver, Reply
from .conftest import SECRET

KEYS = ("k0", "k1", "k2")


@pytest.fixture
def box_settings() -> Settings:
    """Retries that come back within milliseconds, so hundreds fit in a test."""
    return Settings(authority="allow-all", backoff_initial_seconds=0.005, backoff_cap_seconds=0.05,
                    poll_seconds=0.2, default_max_attempts=100)


async def ordered(box: Outbox, url: str, **spec: object) -> None:
    await box.put_destination("ordered", DestinationSpec(
        url=url, secret=SECRET, allow_private_network=True, idempotent=True, timeout_seconds=5,
        ordering="key", **spec))


async def delivered(box: Outbox, action_ids: list[str], timeout: float) -> None:
    async with asyncio.timeout(timeout):
        for action_id in action_ids:
            while (await box.get(action_id, scope="acme")).status is not Status.DELIVERED:
                await asyncio.sleep(0.02)


async def test_each_key_reaches_the_receiver_in_enqueue_order_through_random_transient_failures(
        box: Outbox, receiver: Receiver):
    chance = random.Random(20300101)  # fixed: the same failures every run
    lock = threading.Lock()
    accepted: dict[str, list[int]] = {key: [] for key in KEYS}
    in_flight: dict[str, int] = dict.fromkeys(KEYS, 0)
    overlaps: list[str] = []

    def answer(request: Received) -> Reply:
        body = request.json()
        with lock:
            in_flight[body["key"]] += 1
            if in_flight[body["key"]] > 1:
                overlaps.append(body["key"])
            failed = chance.random() < 0.25
            if not failed:
                accepted[body["key"]].append(body["n"])
            in_flight[body["key"]] -= 1
        return Reply(503) if failed else Reply(200)

    receiver.script("/hook", answer)
    await ordered(box, f"{receiver.url}/hook")
    await box.enqueue_many([{"destination": "ordered", "scope": "acme", "action_id": f"{key}-{n}",
                             "ordering_key": key, "payload": {"key": key, "n": n}}
                            for n in range(200) for key in KEYS])
    worker = Worker(box, concurrency=32)
    running = asyncio.create_task(worker.run())
    try:
        await delivered(box, [f"{key}-199" for key in KEYS], timeout=120)
    finally:
        worker.stop()
        await running
    assert accepted == {key: list(range(200)) for key in KEYS}  # each once, in enqueue order
    assert not overlaps  # and one request of a key at a time
    assert len(receiver.requests("/hook")) > 600  # the failures happened (and were retried)


async def test_a_dead_letter_blocks_its_key_until_it_is_replayed(box: Outbox, receiver: Receiver):
    replies = {"a1": [Reply(422, body="no")], "a2": [], "b1": []}

    def answer(request: Received) -> Reply:
        scripted = replies[request.json()["id"]]
        return scripted.pop(0) if scripted else Reply(200)

    receiver.script("/hook", answer)
    await ordered(box, f"{receiver.url}/hook")
    for action_id, key in (("a1", "k1"), ("a2", "k1"), ("b1", "k2")):
        await box.enqueue(destination="ordered", scope="acme", action_id=action_id, ordering_key=key,
                          payload={"id": action_id})
    worker = Worker(box)
    running = asyncio.create_task(worker.run())
    try:
        await delivered(box, ["b1"], timeout=10)  # another key goes on
        assert (await box.get("a1")).status is Status.DEAD
        waiting = await box.get("a2")
        assert waiting.status is Status.PENDING
        behind = await box.waiting_behind(waiting)
        assert behind is not None and behind.text(waiting) == "behind a1 (dead)"
        await asyncio.sleep(0.3)  # longer than a poll: still nothing for a2
        assert sorted(r.json()["id"] for r in receiver.requests("/hook")) == ["a1", "b1"]
        await replay(box, "a1", Actor("op", "the receiver was fixed"))
        await delivered(box, ["a1", "a2"], timeout=10)
    finally:
        worker.stop()
        await running
    ids = [r.json()["id"] for r in receiver.requests("/hook")]
    assert ids[2:] == ["a1", "a2"]  # a2 only after a1's replay went through
    assert await box.waiting_behind(await box.get("a2")) is None





async def test_cancelling_a_dead_letter_lets_its_key_go_on_without_it(box: Outbox, receiver: Receiver):
    replies = {"a1": [Reply(422, body="no")], "a2": []}

    def answer(request: Received) -> Reply:
        scripted = replies[request.json()["id"]]
        return scripted.pop(0) if scripted else Reply(200)

    receiver.script("/hook", answer)
    await ordered(box, f"{receiver.url}/hook")
    for action_id in ("a1", "a2"):
        await box.enqueue(destination="ordered", scope="acme", action_id=action_id, ordering_key="k1",
                          payload={"id": action_id})
    worker = Worker(box)
    running = asyncio.create_task(worker.run())
    try:
        assert await eventually(lambda: box_status(box, "a1", Status.DEAD), timeout=10)
        await asyncio.sleep(0.3)  # longer than a poll: a2 still waits behind the dead letter
        assert (await box.get("a2")).status is Status.PENDING
        cancelled = await cancel(box, "a1", Actor("op", "refunded by hand instead"))
        assert cancelled.status is Status.CANCELLED
        await delivered(box, ["a2"], timeout=10)
    finally:
        worker.stop()
        await running
    assert [r.json()["id"] for r in receiver.requests("/hook")] == ["a1", "a2"]  # a1 was never sent again


async def box_status(box: Outbox, action_id: str, status: Status) -> bool:
    return (await box.get(action_id)).status is status


async def test_a_finished_intent_lets_the_next_of_its_key_go_without_waiting_a_poll(tmp_path: Path,
                                                                                     receiver: Receiver):
    """The worker claims again as soon as a keyed intent finishes: five intents of one key take
    well under one poll (10 s) rather than a poll each."""
    receiver.script("/hook", lambda request: Reply(200))
    settings = Settings(authority="allow-all", poll_seconds=10)
    async with await Outbox.open(f"sqlite:///{tmp_path / 'slow-poll.db'}", settings=settings) as slow:
        await ordered(slow, f"{receiver.url}/hook")
        ids = [f"s{n}" for n in range(5)]
        for action_id in ids:
            await slow.enqueue(destination="ordered", scope="acme", action_id=action_id, ordering_key="k",
                               payload={"id": action_id})
        worker = Worker(slow)
        running = asyncio.create_task(worker.run())
        try:
            await delivered(slow, ids, timeout=5)
        finally:
            worker.stop()
            await running
