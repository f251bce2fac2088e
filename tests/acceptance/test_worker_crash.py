"""``kill -9`` of ``outbox worker`` in the middle of a batch: nothing is lost, nothing is hidden.

A worker process is killed while its requests are in flight (the receiver answers slowly, so
they are). A second worker, in process, then recovers the expired leases: each send that was
in flight is recorded as ``maybe_submitted`` with a ``lease_expired`` event and a bumped fence,
and, because the destination declares idempotency, retried until delivered. Writes under the
dead worker's fence are refused by the store and change nothing. Each test runs on SQLite and
on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from outbox import (
    DestinationSpec,
    Event,
    OnUnknown,
    Outbox,
    Outcome,
    Settings,
    StaleWrite,
    Status,
    Submission,
)
from outbox.model import SETTLED, Settle
from sender import Worker

from ..conftest import SECRET, records, rows, snapshot
from .conftest import clean_env, kill_9, outbox_worker, served_in_thread

pytestmark = pytest.mark.acceptance

INTENTS = 40
CONCURRENCY = 8
#: How long the receiver takes to answer: long enough that a batch is always in flight.
DELAY = 0.3
#: The worker is killed as the receiver gets this request: the batch in flight is mid-way.
KILL_AT = 12
LEASE_SECONDS = 1.0
POLL_SECONDS = 0.1


class KeyRecorder:
    """A receiver that records each request's Idempotency-Key, then answers 200 after DELAY."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()
        self._arrived = threading.Condition()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while True:
            message = await receive()
            if message["type"] == "http.disconnect" or not message.get("more_body"):
                break
        headers = dict(scope["headers"])
        with self._arrived:
            self.seen[headers.get(b"idempotency-key", b"").decode()] += 1
            self._arrived.notify_all()
        await asyncio.sleep(DELAY)
        body = b'{"ok":true}'
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    def requests(self) -> int:
        with self._arrived:
            return sum(self.seen.values())

    def wait_for(self, count: int, timeout: float) -> int:
        """Block until at least ``count`` requests arrived; returns how many had."""
        with self._arrived:
            self._arrived.wait_for(lambda: sum(self.seen.values()) >= count, timeout)
            return sum(self.seen.values())


@dataclass
class ServedRecorder:
    """A KeyRecorder being served, and the URL its hook is at."""

    app: KeyRecorder
    url: str


@pytest.fixture
def key_recorder() -> Iterator[ServedRecorder]:
    """A KeyRecorder under uvicorn on 127.0.0.1 at a free port, in a thread of the test process."""
    app = KeyRecorder()
    with served_in_thread(app, "crash-receiver") as url:
        yield ServedRecorder(app, f"{url}/hook")


async def snapshot_of(url: str) -> dict[str, list[tuple[object, ...]]]:
    """Every row of every outbox table, read through a separate connection."""
    if url.startswith("sqlite:"):
        return snapshot(Path(url.removeprefix("sqlite:///")))
    tables = [t for (t,) in await rows(
        url, "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")]
    return {t: sorted(await rows(url, f"SELECT * FROM {t}"), key=repr) for t in tables}


def worker_env(url: str) -> dict[str, str]:
    env = clean_env(OUTBOX_DATABASE_URL=url, OUTBOX_AUTHORITY="allow-all",
               OUTBOX_LEASE_SECONDS=str(LEASE_SECONDS), OUTBOX_WORKER_CONCURRENCY=str(CONCURRENCY),
               OUTBOX_POLL_SECONDS=str(POLL_SECONDS))
    return env


@dataclass(frozen=True)
class AtCrash:
    """What the store held for one intent the moment the worker died."""

    status: Status
    fence: int
    started_attempt: str | None  # an attempt begun under the current fence and never finished


async def state_at_crash(url: str) -> dict[str, AtCrash]:
    found = await rows(
        url,
        "SELECT i.action_id, i.status, i.fence, "
        "  (SELECT a.attempt_id FROM attempts a WHERE a.intent_seq = i.seq AND a.fence = i.fence"
        f"   AND a.finished_at IS NULL) FROM {records(url)} i")
    return {action_id: AtCrash(Status(status), fence, attempt) for action_id, status, fence, attempt in found}


async def wait_settled(box: Outbox, timeout: float, count: int = INTENTS) -> dict[str, int]:
    """Wait until ``count`` intents are settled; the count of each status then."""
    deadline = time.monotonic() + timeout
    settled = [s.value for s in SETTLED]
    while True:
        counts: Counter[str] = Counter()
        for status, _, n in await box.store.count_by_status():
            counts[status] += n
        if sum(n for status, n in counts.items() if status in settled) >= count:
            return dict(counts)
        assert time.monotonic() < deadline, f"not settled after {timeout:.0f} s: {counts}"
        await asyncio.sleep(0.1)


async def test_kill_9_mid_batch_loses_nothing_and_fences_out_the_dead_worker(
    tmp_path: Path, key_recorder: ServedRecorder, store_url: str
) -> None:
    url = store_url
    settings = Settings(database_url=url, authority="allow-all", lease_seconds=LEASE_SECONDS,
                        worker_concurrency=CONCURRENCY, poll_seconds=POLL_SECONDS)
    ids = [f"crash-{n:02d}" for n in range(INTENTS)]
    async with await Outbox.open(url, settings=settings) as box:
        await box.put_destination("hook", DestinationSpec(
            url=key_recorder.url, secret=SECRET, allow_private_network=True, idempotent=True,
            retention_seconds=3600, on_unknown=OnUnknown.DECLARED))
        await box.enqueue_many({"destination": "hook", "scope": "acme", "action_id": action_id,
                                "payload": {"n": n}} for n, action_id in enumerate(ids))

        # 1. a worker process, killed while the receiver holds a batch of its requests
        with outbox_worker(tmp_path, worker_env(url)) as (first, log):
            arrived = await asyncio.to_thread(key_recorder.app.wait_for, KILL_AT, 20)
            assert first.poll() is None, f"the worker exited early:\n{log.read_text()}"
            assert arrived >= KILL_AT, f"only {arrived} requests in 20 s:\n{log.read_text()}"
            kill_9(first)
        seen_at_crash = key_recorder.app.requests()
        crash = await state_at_crash(url)
        leased = {a: c for a, c in crash.items() if c.status is Status.LEASED}
        in_flight = {a: c for a, c in leased.items() if c.started_attempt is not None}
        assert seen_at_crash < INTENTS, "every request had arrived: the kill came too late"
        assert in_flight, f"no send was in flight when the worker died: {crash}"
        assert all(c.status in (Status.DELIVERED, Status.LEASED, Status.PENDING) for c in crash.values())

        # 2. a second worker recovers the expired leases and delivers everything
        worker = Worker(box)
        running = asyncio.create_task(worker.run())
        try:
            counts = await wait_settled(box, timeout=20)
        finally:
            worker.stop()
            await running
        assert counts == {"delivered": INTENTS}
        assert worker.stale_writes == 0

        # nothing lost: the receiver saw every key, and only a possibly-sent one twice
        assert set(key_recorder.app.seen) == {f"acme/{action_id}" for action_id in ids}
        repeated = {key.removeprefix("acme/") for key, n in key_recorder.app.seen.items() if n > 1}
        assert repeated <= set(in_flight), (repeated, set(in_flight))

        for action_id in ids:
            intent = await box.get(action_id)
            history = await box.history(action_id)
            kinds = [e.kind for e in history.events]
            last = history.attempts[-1]
            assert (last.submission, last.outcome) == (Submission.SUBMITTED, Outcome.DELIVERED)
            if action_id not in leased:
                assert "lease_expired" not in kinds
                continue
            # the dead worker's lease was recovered under a new fence ...
            before = crash[action_id]
            assert intent.fence > before.fence, (action_id, intent.fence, before.fence)
            expired = [e for e in history.events if e.kind == "lease_expired"]
            assert len(expired) == 1 and expired[0].actor == worker.id
            assert expired[0].data.get("fence", before.fence) == before.fence
            assert last.fence > before.fence
            if action_id in in_flight:
                # ... and its send, which may have reached the receiver, says so, then was retried
                cut = next(a for a in history.attempts if a.attempt_id == before.started_attempt)
                assert (cut.submission, cut.outcome) == (Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN)
                assert cut.fence == before.fence and cut.finished_at is not None
                assert kinds.index("lease_expired") < kinds.index("delivered")
                assert len(history.attempts) == 2 and history.attempts[-1].number == 2
            else:  # claimed, never started: released without an attempt
                assert len(history.attempts) == 1

        # 3. a write under the dead worker's fence is refused and changes nothing
        victim = next(iter(in_flight))
        before_rows = await snapshot_of(url)
        late = Settle(f"acme/{victim}", crash[victim].fence, Status.DELIVERED,
                      (Event("delivered", box.clock.now(), "the-dead-worker", "a late write"),))
        [refused] = (await box.store.apply([late])).results
        assert isinstance(refused, StaleWrite)
        assert await snapshot_of(url) == before_rows


async def test_a_write_under_a_superseded_fence_is_refused_even_when_the_status_matches(
    store_url: str,
) -> None:
    """The fence alone shuts the old holder out: the intent is leased again, to someone else."""
    url = store_url
    settings = Settings(database_url=url, authority="allow-all", lease_seconds=LEASE_SECONDS)
    async with await Outbox.open(url, settings=settings) as box:
        await box.put_destination("hook", DestinationSpec(
            url="http://127.0.0.1:9/hook", secret=SECRET, allow_private_network=True))
        await box.enqueue(destination="hook", scope="acme", action_id="probe", payload={})
        now = box.clock.now()
        (old,) = await box.store.claim("the-dead-worker", now=now, lease_until=now, limit=1)
        assert await Worker(box).sweep() == 1  # its lease ran out: released under a new fence
        now = box.clock.now()
        (new,) = await box.store.claim("successor", now=now, lease_until=now, limit=1)
        assert new.status is Status.LEASED and new.fence > old.fence

        before = await snapshot_of(url)
        late = Event("delivered", box.clock.now(), "the-dead-worker", "a late write")
        [refused] = (await box.store.apply([Settle("acme/probe", old.fence, Status.DELIVERED, (late,))])).results
        assert isinstance(refused, StaleWrite)
        assert await snapshot_of(url) == before
        history = await box.history("probe")
        assert [e.kind for e in history.events] == ["enqueued", "leased", "lease_expired", "leased"]
        assert history.events[2].data["next_attempt_at"]

        # the holder of the current fence may write
        ours = Settle("acme/probe", new.fence, Status.DELIVERED, (Event("delivered", box.clock.now(), "successor"),))
        assert (await box.store.apply([ours])).results == [None]
        assert (await box.get("probe")).status is Status.DELIVERED
