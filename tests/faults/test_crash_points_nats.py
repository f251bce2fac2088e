"""``kill -9`` at each crash point of the sender (``outbox.crash``) while it publishes to NATS
JetStream, on SQLite and PostgreSQL: the rows of tests/faults/test_crash_points_channels.py for the
NATS channel, on the machine's shared server (a stream of the test's own, deleted after).

A real ``outbox worker`` process, armed with ``OUTBOX_CRASH_AT``, publishes a few intents and
kills itself with SIGKILL at one step; an in-process ``sender.Worker`` then recovers the expired
leases and settles everything. ``on_unknown`` is ``always``, so an attempt cut in flight is
published again, and JetStream's duplicate window (``Nats-Msg-Id``) drops the resend of one that
had been stored: every intent ends delivered, its message in the stream exactly once. An attempt
cut once the server had answered (``after_answer`` and later) was stored; one cut at
``after_request`` was only handed to the client's buffer and need not have left.
"""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from outbox import Outbox, Settings
from outbox.crash import CrashPoint
from sender.nats import NatsSpec

from ..conftest import SECRET
from ..nats import Stream
from .checker import check, off_diagonal, truth_table
from .tables import store_name
from .test_crash_points import ANSWERED, CONCURRENCY, LEASE_SECONDS, POLL_SECONDS, recovered
from .test_crash_points_channels import INTENTS, killed_at
from .test_matrix import report
from .test_matrix_nats import stream_truth

pytestmark = pytest.mark.acceptance


@pytest.mark.parametrize("point", get_args(CrashPoint))
async def test_a_worker_killed_while_publishing_loses_duplicates_and_misreports_nothing(
        tmp_path: Path, store_url: str, point: str) -> None:
    url = store_url
    settings = Settings(database_url=url, authority="allow-all", lease_seconds=LEASE_SECONDS, poll_seconds=POLL_SECONDS,
                        worker_concurrency=CONCURRENCY, backoff_initial_seconds=0.1)
    async with Stream.made() as stream, await Outbox.open(url, settings=settings) as box:
        await box.put_destination("out", NatsSpec.model_validate({
            "channel": "nats", "servers": ["127.0.0.1:4222"], "subject": stream.subject,
            "allow_private_network": True, "timeout_seconds": 5.0, "secret": SECRET}))
        enqueued = await box.enqueue_many({"destination": "out", "scope": "acme", "action_id": f"nats-{n}",
                                           "payload": {"n": n}} for n in range(INTENTS))
        in_flight = await killed_at(point, url, tmp_path)
        history = await recovered(box, url, [e.intent.action_id for e in enqueued])
        truth, held = await stream_truth(stream)
    table = truth_table(history, truth)
    report("nats", f"{store_name(url)}-crash-{point}", f"{INTENTS} intents, {len(in_flight)} attempt(s) cut in "
           f"flight, {held} messages stored", table)
    assert check(history, truth) == []
    assert off_diagonal(table) == 0
    # maybe_submitted exactly for the attempts the crash cut short
    assert {a.attempt_id for i in history for a in i.attempts if a.submission == "maybe_submitted"} == in_flight
    assert bool(in_flight) is (point != "after_claim"), in_flight
    if point in ANSWERED:  # the server had answered: stored
        assert in_flight & truth.reached, f"no attempt cut in flight at {point} had been stored"
    assert all(fact.status == "delivered" for fact in history), history
    # published again, and the duplicate window dropped the resend of each stored one
    assert held == INTENTS and set(truth.effects.values()) == {1}, truth.effects
