"""A paused worker fenced out, and a grant revoked under load, judged by the fault checker.

Paused: a real ``outbox worker`` sends its intents to a receiver that holds them; it is stopped
(SIGSTOP) longer than its lease, a second worker takes the intents over with a higher fence and
delivers them, then the held requests go on and the first worker is continued (SIGCONT). Its late
requests must meet the receiver's stale-fence 409 and its late store writes must be rejected.

Revoked: a worker delivers many intents under a grant; the grant is deleted mid-run. No request
whose authority check was asked after the deletion committed (each attempt records when) may
reach the receiver; the intents not
yet sent end ``revoked``; nothing is lost.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from outbox import DestinationSpec, OnUnknown, Outbox, Settings
from outbox.grants import GrantSpec
from receivers import wire
from sender import Worker

from ..acceptance.conftest import clean_env, outbox_worker
from ..conftest import SECRET, eventually, rows
from ..servers import Served
from .checker import Truth, check, off_diagonal, truth_table
from .tables import store_name
from .test_crash_points import Ground, integrity, recorded_facts, settled
from .test_matrix import report, tier

pytestmark = pytest.mark.acceptance

INTENTS = 4  # the paused worker's intents (32 in the long tier)
LEASE_SECONDS = 1.0
FENCE = wire.FENCE.lower().encode()
KEY = wire.IDEMPOTENCY_KEY.lower().encode()


class Held(Ground):
    """The receiver, holding every request that arrives while ``holding`` until ``release`` is
    set; while ``refusing``, the first request of each key to run is answered 503 without an
    effect (its record keeps the fence, but not completed) and the key's next ones wait for
    ``retries``. It records each request's status and arrival time, and each effect made with a
    fence lower than one the middleware had already been given for the key (a stale-fence effect)."""

    def __init__(self, records: Path) -> None:
        super().__init__(records)
        self.holding = True
        self.release = threading.Event()
        self.refusing = False
        self.refused: set[str] = set()
        self.retries = threading.Event()
        self.held = 0
        self.statuses: dict[str, int] = {}  # attempt id -> status answered
        self.arrived: dict[str, datetime] = {}  # attempt id -> when it reached the receiver
        self.highest: dict[str, int] = {}  # key -> highest fence handed to the middleware
        self.stale_applied = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = dict(scope.get("headers", []))
        attempt = headers.get(b"outbox-attempt-id", b"").decode()
        if attempt:
            self.arrived[attempt] = datetime.now(UTC)
        if self.holding and attempt:
            self.held += 1
            await wait(self.release)
        elif self.refusing and headers.get(KEY, b"").decode() in self.refused:
            await wait(self.retries)
        if (key := headers.get(KEY)) and (fence := headers.get(FENCE)):
            with self._lock:
                self.highest[key.decode()] = max(self.highest.get(key.decode(), 0), int(fence))

        async def answer(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and attempt:
                self.statuses[attempt] = message["status"]
            await send(message)

        await super().__call__(scope, receive, answer)

    async def _effect(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = dict(scope["headers"])
        key = headers[KEY].decode()
        with self._lock:
            refuse = self.refusing and key not in self.refused
            self.refused.add(key)
            self.stale_applied += int(headers[FENCE]) < self.highest.get(key, 0)
        if refuse:
            await send({"type": "http.response.start", "status": 503, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await super()._effect(scope, receive, send)


async def wait(event: threading.Event) -> None:
    while not event.is_set():
        await asyncio.sleep(0.02)


async def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Wait for ``condition`` (``eventually``); fail naming ``what`` did not happen."""
    assert await eventually(condition, timeout), f"not {what} after {timeout:.0f} s"


async def test_a_paused_worker_is_fenced_out_of_the_store_and_the_receiver(
    request: pytest.FixtureRequest, tmp_path: Path, store_url: str
) -> None:
    """``--faults=long``: 32 intents taken over at once instead of 4."""
    count = 32 if tier(request)[0] else INTENTS
    url = store_url
    receiver = Held(tmp_path / "records.db")
    served = Served(receiver)
    hook = f"{served.url}/orders"
    settings = Settings(database_url=url, authority="allow-all", lease_seconds=LEASE_SECONDS,
                        worker_concurrency=count, poll_seconds=0.1, backoff_initial_seconds=0.1)
    ids = [f"order-{n}" for n in range(count)]
    try:
        async with await Outbox.open(url, settings=settings) as box:
            await box.put_destination("hook", DestinationSpec(
                url=hook, secret=SECRET, allow_private_network=True, idempotent=True, retention_seconds=3600,
                on_unknown=OnUnknown.DECLARED, timeout_seconds=30))
            await box.enqueue_many({"destination": "hook", "scope": "acme", "action_id": action_id,
                                    "payload": {"n": n}} for n, action_id in enumerate(ids))
            env = clean_env(OUTBOX_DATABASE_URL=url, OUTBOX_AUTHORITY="allow-all",
                            OUTBOX_LEASE_SECONDS=str(LEASE_SECONDS), OUTBOX_WORKER_CONCURRENCY=str(count),
                            OUTBOX_POLL_SECONDS="0.1")
            with outbox_worker(tmp_path, env) as (first, log):
                # 1. the first worker holds every lease, each request held at the receiver
                await until(lambda: receiver.held == count, 20, "all requests held")
                first_attempts = set(receiver.arrived)
                os.kill(first.pid, signal.SIGSTOP)
                try:
                    await asyncio.sleep(2.5 * LEASE_SECONDS)  # its leases run out, not renewed
                    # 2. a second worker takes over with a higher fence; its first request of each
                    # key leaves the receiver's record at that fence, not completed (503)
                    receiver.holding = False
                    receiver.refusing = True
                    second = Worker(box)
                    running = asyncio.create_task(second.run())
                    try:
                        await until(lambda: len(receiver.refused) == count, 20, "taken over")
                        # 3. the first worker's held requests reach the middleware late: fenced out
                        receiver.release.set()
                        await until(lambda: first_attempts <= set(receiver.statuses), 10, "late requests answered")
                        # 4. the second worker's retries deliver everything
                        receiver.retries.set()
                        await settled(box, timeout=20 + count / 10, count=count)
                    finally:
                        second.stop()
                        await running
                finally:
                    os.kill(first.pid, signal.SIGCONT)
                # 5. continued, it tries to record its outcomes: every write is fenced out
                assert await eventually(lambda: log.read_text().count("fenced write rejected") >= count, 15), \
                    f"not {count} stale writes rejected:\n{log.read_text()}"
                first.send_signal(signal.SIGTERM)
                await asyncio.to_thread(first.wait, 15)
            await integrity(url)
            facts = await recorded_facts(box, ids)
            stored = {attempt: rest for attempt, *rest in
                      await rows(url, "SELECT attempt_id, worker, submission, status_code FROM attempts")}
    finally:
        receiver.release.set()
        receiver.retries.set()
        served.stop()
        await receiver.store.close()
    truth = Truth(effects=dict(receiver.effects), reached=frozenset(receiver.reached),
                  stale_fence_applied=receiver.stale_applied)
    stale = log.read_text().count("fenced write rejected")
    late = {receiver.statuses[a] for a in first_attempts}
    table = truth_table(facts, truth)
    store = store_name(url)
    report("webhook", f"{store}-paused", (
        f"paused worker: {count} intents taken over; its {len(first_attempts)} late requests "
        f"answered {sorted(late)}, {stale} late store writes rejected"), table)
    assert late == {409}, receiver.statuses
    assert check(facts, truth) == []
    assert off_diagonal(table) == 0
    assert all(f.status == "delivered" for f in facts), facts
    assert all(receiver.effects[f.key] == 1 for f in facts), receiver.effects
    # the store kept the second worker's outcomes: the first worker's attempts stay as the takeover
    # recorded them (maybe submitted), the 409 it was answered never written
    assert {(stored[a][1], stored[a][2]) for a in first_attempts} == {
        ("maybe_submitted", None)}, stored
    assert sum(status == 200 for _, _, status in stored.values()) == count, stored
    assert stale >= count


REVOKE_INTENTS = 60


async def test_a_grant_revoked_under_load_stops_every_send_checked_after_it(
    request: pytest.FixtureRequest, tmp_path: Path, store_url: str
) -> None:
    """``--faults=long``: 600 intents, revoked once a share drawn from the seed is delivered."""
    long, seed = tier(request)
    count = 600 if long else REVOKE_INTENTS
    share = random.Random(seed).uniform(0.1, 0.9) if long else 0.25
    url = store_url
    receiver = Held(tmp_path / "records.db")
    receiver.holding = False
    served = Served(receiver)
    hook = f"{served.url}/orders"
    settings = Settings(database_url=url, authority="grants", authority_seconds=0, lease_seconds=5,
                        worker_concurrency=4, poll_seconds=0.05, backoff_initial_seconds=0.1)
    ids = [f"order-{n}" for n in range(count)]
    try:
        async with await Outbox.open(url, settings=settings) as box:
            await box.put_destination("hook", DestinationSpec(
                url=hook, secret=SECRET, allow_private_network=True, idempotent=True, retention_seconds=3600))
            await box.put_grant("acme-hook", GrantSpec(scope="acme", destination="hook"))
            await box.enqueue_many({"destination": "hook", "scope": "acme", "action_id": action_id,
                                    "payload": {"n": n}} for n, action_id in enumerate(ids))
            worker = Worker(box)
            running = asyncio.create_task(worker.run())
            try:
                await until(lambda: len(receiver.effects) >= int(count * share), 20 + count / 10,
                            f"{share:.0%} delivered")
                await box.delete_grant("acme-hook")
                revoked_at = datetime.now(UTC)
                await settled(box, timeout=20 + count / 10, count=count)
            finally:
                worker.stop()
                await running
            await integrity(url)
            facts = await recorded_facts(box, ids)
            checked = {}  # attempt id -> when the authority that allowed it was asked
            for action_id in ids:
                for event in (await box.history(action_id)).events:
                    if event.kind.value == "attempt_started":
                        checked[event.data["attempt_id"]] = datetime.fromisoformat(event.data["authority_checked_at"])
    finally:
        served.stop()
        await receiver.store.close()
    after = [a for a in receiver.arrived if checked[a] > revoked_at]  # asked once the deletion had committed
    truth = Truth(effects=dict(receiver.effects), reached=frozenset(receiver.reached),
                  sent_after_revocation=len(after))
    table = truth_table(facts, truth)
    statuses = Counter(f.status for f in facts)
    arrived_late = sum(at > revoked_at for at in receiver.arrived.values())
    store = store_name(url)
    report("webhook", f"{store}-revoked", (
        f"grant revoked under load: {count} intents, seed {seed}, {statuses['delivered']} delivered, "
        f"{statuses['revoked']} revoked; {arrived_late} request(s) arrived after the revocation, "
        f"{len(after)} asked after it"), table)
    assert check(facts, truth) == []
    assert off_diagonal(table) == 0
    assert set(statuses) == {"delivered", "revoked"}, statuses
    assert all(receiver.effects.get(f.key, 0) == (f.status == "delivered") for f in facts)
    assert all(not f.attempts for f in facts if f.status == "revoked"), "a revoked intent had been sent"

