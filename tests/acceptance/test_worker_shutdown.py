"""``outbox worker`` on SIGTERM: stop claiming, let in-flight sends finish, record what was cut."""

from __future__ import annotations

import asyncio
import signal
import subprocess

import pytest

from outbox import DestinationSpec, Outbox, Status, Submission

from ..conftest import SECRET
from ..receiver import Reply
from .conftest import OUTBOX, clean_env

pytestmark = pytest.mark.acceptance


async def prepare(url: str, hook: str, count: int) -> None:
    async with await Outbox.open(url) as box:
        await box.put_destination("hook", DestinationSpec(
            url=hook, secret=SECRET, allow_private_network=True, idempotent=True,
            retention_seconds=3600, timeout_seconds=30))
        await box.enqueue_many(
            {"destination": "hook", "scope": "acme", "action_id": f"job-{n}", "payload": {"n": n}}
            for n in range(count))


def start_worker(url: str, drain: float) -> subprocess.Popen[str]:
    env = clean_env(OUTBOX_DATABASE_URL=url, OUTBOX_AUTHORITY="allow-all", OUTBOX_WORKER_CONCURRENCY="4",
               OUTBOX_DRAIN_SECONDS=str(drain), OUTBOX_POLL_SECONDS="0.1")
    return subprocess.Popen([OUTBOX, "worker"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


async def statuses(url: str) -> dict[str, tuple[Status, list[Submission | None]]]:
    async with await Outbox.open(url) as box:
        found = {}
        for n in range(6):
            intent = await box.get(f"job-{n}")
            history = await box.history(intent.action_id)
            found[intent.action_id] = (intent.status, [a.submission for a in history.attempts])
        return found


def terminate_mid_batch(tmp_path, receiver, *, reply: Reply, drain: float):
    """Six intents, a worker of concurrency 4: SIGTERM once four sends are in flight. Returns
    every intent's status and attempt submissions after the worker exited (it must exit 0)."""
    url = f"sqlite:///{tmp_path / 'o.db'}"
    receiver.script("/hook", reply)
    asyncio.run(prepare(url, f"{receiver.url}/hook", 6))
    worker = start_worker(url, drain=drain)
    try:
        receiver.wait_for_requests_blocking(4, timeout=20)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=20) == 0, worker.stdout.read() if worker.stdout else ""
    finally:
        worker.kill()
    return asyncio.run(statuses(url))


def test_in_flight_sends_finish_within_the_drain_and_nothing_more_is_claimed(tmp_path, receiver):
    found = terminate_mid_batch(tmp_path, receiver, reply=Reply(200, delay=1.0), drain=10)
    delivered = [k for k, (status, _) in found.items() if status is Status.DELIVERED]
    untouched = [k for k, (status, attempts) in found.items() if status is Status.PENDING and not attempts]
    assert len(delivered) == 4 and len(untouched) == 2
    assert len(receiver.requests("/hook")) == 4


def test_sends_cut_by_a_short_drain_are_recorded_as_maybe_submitted(tmp_path, receiver):
    found = terminate_mid_batch(tmp_path, receiver, reply=Reply(200, delay=30), drain=0.2)
    cut = [v for v in found.values() if v[1] == [Submission.MAYBE_SUBMITTED]]
    assert len(cut) == 4
    # the receiver declares idempotency, so a possibly-sent request is scheduled to retry
    assert all(status is Status.PENDING for status, _ in found.values())
