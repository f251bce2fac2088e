"""Flow control across worker processes: three ``outbox worker`` processes on one PostgreSQL
database send to a receiver (uvicorn on loopback) that records when each request arrived and how
many were in flight at once.

- ``rate_limit``: the arrivals in any one-second window stay within per_second + burst;
- ``max_in_flight``: the receiver, slow, never sees more than that many at once (three workers of
  sixteen send slots each would send far more without it);
- a 429 with Retry-After pauses its destination for every worker: the other intents of it are
  not sent, nor attempted, until the pause ends, while another destination keeps flowing;
- being held back is not an attempt: each intent ends with the one attempt that delivered it,
  and no event but its delivery's.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from outbox import DestinationSpec, Outbox, Settings
from outbox.flow import RateLimit
from outbox.shapes import destination_json
from outbox.store.postgres import PostgresStore

from ..conftest import SECRET
from .conftest import OUTBOX, clean_env, served_in_thread

pytestmark = pytest.mark.acceptance

WORKERS = 3
CONCURRENCY = 16
POLL_SECONDS = 0.2
RATE = RateLimit(per_second=5, burst=5)
METERED = 40
MAX_IN_FLIGHT = 3
CAPPED = 30
#: How long the receiver takes over a capped or free destination's request: long enough that, unlimited,
#: the workers would have many of them in flight at once.
SLOW = 0.2
#: What the paused destination's first request is answered: Retry-After, in seconds. The other
#: destination's 20 deliveries must all land inside it, on a machine the suite's other process loads.
RETRY_AFTER = 6
#: Longest a send follows its lease (its checks, then its start's cycle): how much later than the
#: token was taken a request may reach the receiver.
START_SLACK = 0.5
#: The events a delivered intent has when nothing but its one attempt happened to it.
DELIVERY = ["enqueued", "leased", "attempt_started", "attempt_finished", "delivered"]


@dataclass
class Receiver:
    """Records each request's arrival (monotonic) and the most in flight at once, by path; the
    first request to /paused is answered 429 with Retry-After, every other one 200."""

    arrivals: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    in_flight: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    most: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        path = scope["path"].strip("/")
        with self._lock:
            self.arrivals[path].append(time.monotonic())
            self.in_flight[path] += 1
            self.most[path] = max(self.most[path], self.in_flight[path])
            first_pause = path == "paused" and len(self.arrivals[path]) == 1
        try:
            if path in ("capped", "free"):
                await asyncio.sleep(SLOW)
            status, headers = (429, [(b"retry-after", str(RETRY_AFTER).encode())]) if first_pause else (200, [])
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": b"{}"})
        finally:
            with self._lock:
                self.in_flight[path] -= 1

    def count(self, path: str) -> int:
        with self._lock:
            return len(self.arrivals[path])


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    app = Receiver()
    with served_in_thread(app, "flow-receiver") as url:
        yield app, url


@pytest.fixture
async def workers(tmp_path: Path, pg_url: str) -> AsyncIterator[Outbox]:
    """The outbox on ``pg_url`` (migrated) and three ``outbox worker`` processes on it."""
    box = await Outbox.open(pg_url, settings=Settings(database_url=pg_url, authority="allow-all"))
    env = clean_env(OUTBOX_DATABASE_URL=pg_url, OUTBOX_AUTHORITY="allow-all", OUTBOX_POLL_SECONDS=str(POLL_SECONDS),
                    OUTBOX_WORKER_CONCURRENCY=str(CONCURRENCY))
    logs = [tmp_path / f"worker-{n}.log" for n in range(WORKERS)]
    processes = []
    for log in logs:
        with log.open("w") as out:
            processes.append(subprocess.Popen([OUTBOX, "worker"], env=env, cwd=tmp_path, stdout=out,
                                              stderr=subprocess.STDOUT))
    try:
        for log in logs:
            await wait_for(lambda log=log: " started (concurrency" in log.read_text(), f"{log.name} starting", 30)
        yield box
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(20)
        await box.close()


async def wait_for(check: Any, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(check):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def register(box: Outbox, name: str, url: str, **limits: Any) -> None:
    await box.put_destination(name, DestinationSpec(url=f"{url}/{name}", secret=SECRET, allow_private_network=True,
                                                    idempotent=True, **limits))


async def enqueue(box: Outbox, destination: str, n: int, prefix: str | None = None) -> list[str]:
    ids = [f"{prefix or destination}-{i:03d}" for i in range(n)]
    await box.enqueue_many([{"action_id": a, "scope": "acme", "destination": destination, "payload": {"n": a}}
                            for a in ids])
    return ids


async def delivered(pg_url: str, destination: str) -> int:
    db = await asyncpg.connect(pg_url)
    try:
        return await db.fetchval("SELECT count(*) FROM intents WHERE destination = $1 AND status = 'delivered'",
                                 destination)
    finally:
        await db.close()


async def only_their_delivery(pg_url: str, destination: str) -> dict[str, tuple[int, int, list[str]]]:
    """Each of the destination's intents that has anything but one attempt and its delivery's
    events: key -> (attempts counted, attempt rows, events)."""
    db = await asyncpg.connect(pg_url)
    store = PostgresStore(pg_url)
    await store.open()
    try:
        found = {}
        for key, attempts in await db.fetch("SELECT intent_key, attempts FROM intents WHERE destination = $1",
                                            destination):
            history = await store.history(key)  # (its timeline: the events rows and what its attempts keep)
            found[key] = (attempts, len(history.attempts), [e.kind.value for e in history.events])
    finally:
        await db.close()
        await store.close()
    return {key: got for key, got in found.items() if got != (1, 1, DELIVERY)}


async def lease_times(pg_url: str, destination: str) -> list[float]:
    """When each of the destination's intents was leased, as epoch seconds (the claims' times)."""
    db = await asyncpg.connect(pg_url)
    try:
        return [row[0] for row in await db.fetch(
            "SELECT extract(epoch FROM e.at)::float8 FROM events e JOIN intents i ON i.seq = e.intent_seq"
            " WHERE i.destination = $1 AND e.kind = 'leased'", destination)]
    finally:
        await db.close()


def most_in_any_second(arrivals: list[float]) -> int:
    """The most arrivals in any window of one second."""
    arrivals = sorted(arrivals)
    most, start = 0, 0
    for end, at in enumerate(arrivals):
        while at - arrivals[start] > 1.0:
            start += 1
        most = max(most, end - start + 1)
    return most


async def test_rate_limit_and_max_in_flight_hold_across_three_worker_processes(
    workers: Outbox, receiver: tuple[Receiver, str], pg_url: str
) -> None:
    box, (app, url) = workers, receiver
    await register(box, "metered", url, rate_limit=RATE)
    await register(box, "capped", url, max_in_flight=MAX_IN_FLIGHT)
    await register(box, "free", url)
    started = time.monotonic()
    await enqueue(box, "metered", METERED)
    await enqueue(box, "capped", CAPPED)
    await enqueue(box, "free", 30)

    async def all_delivered() -> bool:
        return all([await delivered(pg_url, "metered") == METERED, await delivered(pg_url, "capped") == CAPPED,
                    await delivered(pg_url, "free") == 30])

    deadline = time.monotonic() + 60
    while not await all_delivered():
        assert time.monotonic() < deadline, "not every intent was delivered"
        # held back is not an attempt: while some wait, no pending intent has an attempt or a count
        db = await asyncpg.connect(pg_url)
        try:
            assert await db.fetchval(
                "SELECT count(*) FROM intent_records i WHERE i.status = 'pending'"
                " AND (i.attempts > 0 OR EXISTS (SELECT 1 FROM attempts a WHERE a.intent_seq = i.seq))") == 0
        finally:
            await db.close()
        await asyncio.sleep(0.2)

    # the bucket holds at the leases, as the database recorded them across the three workers ...
    assert most_in_any_second(await lease_times(pg_url, "metered")) <= RATE.per_second + RATE.burst
    # ... and at the receiver, give or take the moment between a lease and its send
    assert most_in_any_second(app.arrivals["metered"]) <= RATE.burst + RATE.per_second * (1 + START_SLACK)
    # the bucket was the bound: 40 sends at 5 a second after a burst of 5 take 7 s at least
    assert max(app.arrivals["metered"]) - started >= (METERED - RATE.burst) / RATE.per_second - 0.5
    assert app.most["capped"] <= MAX_IN_FLIGHT
    assert app.most["capped"] == MAX_IN_FLIGHT  # the limit was reached: it is what held them
    assert app.count("capped") == CAPPED and app.count("metered") == METERED
    assert app.most["free"] > MAX_IN_FLIGHT  # an unlimited destination is sent to at once, as before
    for destination in ("metered", "capped", "free"):
        assert await only_their_delivery(pg_url, destination) == {}


async def test_a_429_with_retry_after_pauses_its_destination_for_every_worker(
    workers: Outbox, receiver: tuple[Receiver, str], pg_url: str
) -> None:
    box, (app, url) = workers, receiver
    await register(box, "paused", url)
    await register(box, "free", url)
    [first] = await enqueue(box, "paused", 1, "first")
    await wait_for(lambda: app.count("paused") == 1, "the 429", 30)
    answered = app.arrivals["paused"][0]
    shown = destination_json(await box.get_destination("paused"))
    assert shown["paused_until"] is not None  # the destination's answer says so
    await enqueue(box, "paused", 10)
    await enqueue(box, "free", 20)

    deadline = time.monotonic() + 30
    while await delivered(pg_url, "free") < 20:
        assert time.monotonic() < deadline, "the other destination did not flow"
        await asyncio.sleep(0.05)
    assert time.monotonic() - answered < RETRY_AFTER  # it flowed while the paused one waited
    db = await asyncpg.connect(pg_url)
    try:  # meanwhile none of the paused destination's intents was sent or attempted
        assert await db.fetchval("SELECT count(*) FROM attempts a JOIN intents i ON i.seq = a.intent_seq"
                                 " WHERE i.destination = 'paused'") == 1
    finally:
        await db.close()
    assert app.count("paused") == 1

    deadline = time.monotonic() + 30
    while await delivered(pg_url, "paused") < 11:
        assert time.monotonic() < deadline, "the paused destination did not resume"
        await asyncio.sleep(0.1)
    assert min(app.arrivals["paused"][1:]) - answered >= RETRY_AFTER - 0.5  # not before the pause ended
    assert await only_their_delivery(pg_url, "free") == {}
    held = await only_their_delivery(pg_url, "paused")
    assert set(held) == {f"acme/{first}"}  # only the 429'd one had a second attempt
    assert held[f"acme/{first}"][:2] == (2, 2)
