"""Flow control on SQLite, end to end: the embedded worker on a real SQLite file sends to a real
uvicorn receiver, and a destination's rate_limit, max_in_flight and a receiver's pause (429 with
Retry-After) hold for the one node, held-back sends counted and never attempted."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from outbox import DestinationSpec, EventKind, Outbox, Settings, Status
from outbox.flow import RateLimit
from sender import Worker

from ..conftest import eventually
from ..receiver import Receiver, Reply
from .conftest import SECRET


@pytest.fixture
def box_settings() -> Settings:
    return Settings(authority="allow-all", poll_seconds=0.2)


async def register(box: Outbox, name: str, url: str, **limits: object) -> None:
    await box.put_destination(name, DestinationSpec(url=url, secret=SECRET, allow_private_network=True,
                                                    idempotent=True, **limits))


async def enqueue(box: Outbox, destination: str, n: int) -> list[str]:
    ids = [f"{destination}-{i}" for i in range(n)]
    await box.enqueue_many([{"destination": destination, "scope": "acme", "action_id": a, "payload": {}}
                            for a in ids])
    return ids


async def delivered(box: Outbox, ids: list[str], timeout: float) -> None:
    async with asyncio.timeout(timeout):
        for action_id in ids:
            while (await box.get(action_id, scope="acme")).status is not Status.DELIVERED:
                await asyncio.sleep(0.02)


async def paused(box: Outbox) -> bool:
    return (await box.get_destination("paused")).paused_until is not None


def held_total(box: Outbox, destination: str, limit: str) -> float:
    return box.metrics.registry.get_sample_value(
        "outbox_sends_held_total", {"destination": destination, "limit": limit}) or 0.0


async def test_rate_limit_and_max_in_flight_hold_for_the_embedded_worker(box: Outbox, receiver: Receiver):
    lock = threading.Lock()
    in_flight = {"now": 0, "most": 0}

    def slow(request: object) -> Reply:
        with lock:
            in_flight["now"] += 1
            in_flight["most"] = max(in_flight["most"], in_flight["now"])
        time.sleep(0.05)  # (the receiver's handler runs on a thread of its own)
        with lock:
            in_flight["now"] -= 1
        return Reply(200)

    receiver.script("/capped", slow)
    receiver.script("/metered", Reply(200))
    await register(box, "capped", f"{receiver.url}/capped", max_in_flight=2)
    await register(box, "metered", f"{receiver.url}/metered", rate_limit=RateLimit(per_second=10, burst=2))
    capped, metered = await enqueue(box, "capped", 12), await enqueue(box, "metered", 12)
    worker = Worker(box, concurrency=16)
    running = asyncio.create_task(worker.run())
    try:
        await delivered(box, capped + metered, timeout=30)
    finally:
        worker.stop()
        await running
    assert in_flight["most"] <= 2
    leases = []
    for action_id in capped + metered:  # held back is not an attempt
        history = await box.history(action_id, scope="acme")
        assert history.intent.attempts == 1 and len(history.attempts) == 1
        if action_id in metered:
            [leased] = [e.at for e in history.events if e.kind is EventKind.LEASED]
            leases.append(leased)
    # the bucket holds at the leases (the claims' own times): the burst, then ten a second ...
    assert (max(leases) - min(leases)).total_seconds() >= (12 - 2) / 10 - 0.001
    # ... and at the receiver, give or take the moment between a lease and its send (its checks,
    # then its start's cycle, on a loaded machine), as the README says
    arrivals = sorted(r.at for r in receiver.requests("/metered"))
    assert arrivals[-1] - arrivals[0] >= (12 - 2) / 10 - 0.5
    assert held_total(box, "capped", "in_flight") > 0 and held_total(box, "metered", "rate") > 0


async def test_a_429_with_retry_after_pauses_its_destination_and_another_keeps_flowing(
        box: Outbox, receiver: Receiver):
    receiver.script("/paused", Reply(429, headers={"Retry-After": "1"}), Reply(200))
    receiver.script("/free", Reply(200))
    await register(box, "paused", f"{receiver.url}/paused")
    await register(box, "free", f"{receiver.url}/free")
    worker = Worker(box, concurrency=8)
    running = asyncio.create_task(worker.run())
    try:
        [first] = await enqueue(box, "paused", 1)
        await asyncio.to_thread(receiver.wait_for_requests_blocking, 1, "/paused")
        answered = time.monotonic()
        assert await eventually(lambda: paused(box), timeout=5)
        others = [f"later-{i}" for i in range(5)]
        await box.enqueue_many([{"destination": "paused", "scope": "acme", "action_id": a, "payload": {}}
                                for a in others])
        free = await enqueue(box, "free", 5)
        await delivered(box, free, timeout=10)
        assert time.monotonic() - answered < 1  # flowing while the other is paused
        assert len(receiver.requests("/paused")) == 1
        assert [(await box.history(a, scope="acme")).attempts for a in others] == [[]] * len(others)
        await delivered(box, [first, *others], timeout=10)
    finally:
        worker.stop()
        await running
    assert min(r.at for r in receiver.requests("/paused")[1:]) - answered >= 0.9
    assert held_total(box, "paused", "paused") > 0


async def test_leases_taken_before_a_pause_are_given_back_unsent(box: Outbox, receiver: Receiver):
    receiver.script("/paused", Reply(429, headers={"Retry-After": "1"}), Reply(200))
    await register(box, "paused", f"{receiver.url}/paused")
    ids = await enqueue(box, "paused", 4)
    worker = Worker(box, concurrency=1)  # one send at a time, the four leased at once
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.to_thread(receiver.wait_for_requests_blocking, 1, "/paused")
        answered = time.monotonic()
        await delivered(box, ids, timeout=10)
    finally:
        worker.stop()
        await running
    later = receiver.requests("/paused")[1:]
    assert len(later) == 4 and min(r.at for r in later) - answered >= 0.9  # none sent during the pause
    made = sorted([len((await box.history(a, scope="acme")).attempts) for a in ids])
    assert made == [1, 1, 1, 2]  # the ones given back made no attempt then; the 429'd one two
