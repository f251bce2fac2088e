"""``kill -9`` at each crash point of the sender (``outbox.crash``) while it publishes to RabbitMQ:
the rows of tests/faults/test_crash_points_channels.py for the RabbitMQ channel, on SQLite and
PostgreSQL, against the shared broker (an exchange and queue of the test's own).

A real ``outbox worker`` process, armed with ``OUTBOX_CRASH_AT``, publishes a few intents and kills
itself at one step; an in-process ``sender.Worker`` then recovers the expired leases and settles
everything, and the checker judges the store's history against the queue (and the effects the
receivers' idempotent RabbitMQ consumer runs from a second queue bound alike). ``on_unknown`` is
``always``, so an attempt cut in flight is published again: every intent ends delivered with one
effect, and the queue holds one extra message
for each cut attempt whose message the broker had routed (every one cut once the broker had
confirmed; one cut at ``after_request`` had only been handed to the channel's publish and need
not have left).
"""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from outbox import Outbox, Settings
from outbox.crash import CrashPoint
from sender.rabbitmq import RabbitSpec

from ..conftest import SECRET
from ..rabbitmq import PORT, Rabbit
from .checker import check, off_diagonal, truth_table
from .tables import store_name
from .test_crash_points import ANSWERED, CONCURRENCY, LEASE_SECONDS, POLL_SECONDS, recovered
from .test_crash_points_channels import killed_at
from .test_matrix import report
from .test_matrix_rabbitmq import queue_truth

pytestmark = pytest.mark.acceptance

INTENTS = 3
KEY = "orders"


@pytest.mark.parametrize("point", get_args(CrashPoint))
async def test_a_worker_killed_while_publishing_loses_and_misreports_nothing(
        tmp_path: Path, rabbit: Rabbit, store_url: str, point: str) -> None:
    url = store_url
    await rabbit.bind(KEY)
    consumed = await rabbit.bind(KEY, queue=f"{rabbit.queue}-consumed")
    settings = Settings(database_url=url, authority="allow-all", lease_seconds=LEASE_SECONDS, poll_seconds=POLL_SECONDS,
                        worker_concurrency=CONCURRENCY, backoff_initial_seconds=0.1)
    async with await Outbox.open(url, settings=settings) as box:
        await box.put_destination("out", RabbitSpec.model_validate({
            "channel": "rabbitmq", "url": f"amqp://guest@127.0.0.1:{PORT}/", "password": "guest",
            "allow_insecure": True, "allow_private_network": True, "exchange": rabbit.exchange, "routing_key": KEY,
            "timeout_seconds": 5.0, "secret": SECRET}))
        enqueued = await box.enqueue_many({"destination": "out", "scope": "acme", "action_id": f"rabbitmq-{n}",
                                           "payload": {"n": n}} for n in range(INTENTS))
        in_flight = await killed_at(point, url, tmp_path)
        history = await recovered(box, url, [e.intent.action_id for e in enqueued])
    truth, by_key = await queue_truth(rabbit, consumed)
    messages = sum(map(len, by_key.values()))
    table = truth_table(history, truth)
    report("rabbitmq", f"{store_name(url)}-crash-{point}",
           f"{INTENTS} intents, {len(in_flight)} attempt(s) cut in flight, {messages} messages arrived", table)
    assert check(history, truth) == []
    assert off_diagonal(table) == 0
    # maybe_submitted exactly for the attempts the crash cut short
    assert {a.attempt_id for i in history for a in i.attempts if a.submission == "maybe_submitted"} == in_flight
    assert bool(in_flight) is (point != "after_claim"), in_flight
    if point in ANSWERED:  # the broker had confirmed the messages of the attempts cut in flight
        assert in_flight & truth.reached, f"no attempt cut in flight at {point} had arrived"
    assert all(fact.status == "delivered" for fact in history), history
    assert messages == INTENTS + len(in_flight & truth.reached), (messages, in_flight, truth.reached)
