"""``kill -9`` at each crash point of the sender (``outbox.crash``) while it sends to SQS, on
SQLite and PostgreSQL: the rows of tests/faults/test_crash_points_channels.py for the SQS channel,
against a FIFO queue on moto's server (tests/sqs.py).

A real ``outbox worker`` process, armed with ``OUTBOX_CRASH_AT``, sends a few intents and kills
itself with SIGKILL at one step; an in-process ``sender.Worker`` then recovers the expired leases
and settles everything, and the checker judges the store's history against what the queue
holds. ``on_unknown`` is ``always``, so an attempt cut in flight is sent again, and the queue's
deduplication id drops the resend of one that had arrived: every intent ends delivered with
exactly one message. At ``after_request`` the batch is handed to the client and need not have
left; at every later point SQS had answered, so the message is in the queue.
"""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from outbox import Outbox, Settings
from outbox.crash import CrashPoint
from receivers import wire
from sender.sqs import SqsSpec

from ..conftest import SECRET
from ..sqs import ACCESS_KEY_ID, REGION, SECRET_ACCESS_KEY, MotoServer, queue_name
from .checker import Truth, check, off_diagonal, truth_table
from .tables import store_name
from .test_crash_points import ANSWERED, CONCURRENCY, LEASE_SECONDS, POLL_SECONDS, recovered
from .test_crash_points_channels import killed_at
from .test_matrix import report

pytestmark = pytest.mark.acceptance

INTENTS = 3


@pytest.mark.parametrize("point", get_args(CrashPoint))
async def test_a_worker_killed_while_sending_to_sqs_loses_duplicates_and_misreports_nothing(
        tmp_path: Path, moto: MotoServer, store_url: str, point: str) -> None:
    url = await moto.create_queue(queue_name("crash", fifo=True))
    settings = Settings(database_url=store_url, authority="allow-all", lease_seconds=LEASE_SECONDS,
                        poll_seconds=POLL_SECONDS, worker_concurrency=CONCURRENCY, backoff_initial_seconds=0.1)
    async with await Outbox.open(store_url, settings=settings) as box:
        await box.put_destination("out", SqsSpec.model_validate({
            "channel": "sqs", "region": REGION, "queue_url": url, "endpoint_url": moto.endpoint,
            "allow_insecure": True, "allow_private_network": True, "access_key_id": ACCESS_KEY_ID,
            "secret_access_key": SECRET_ACCESS_KEY, "secret": SECRET, "timeout_seconds": 5.0}))
        enqueued = await box.enqueue_many({"destination": "out", "scope": "acme", "action_id": f"sqs-{n}",
                                           "payload": {"n": n}} for n in range(INTENTS))
        in_flight = await killed_at(point, store_url, tmp_path)
        history = await recovered(box, store_url, [e.intent.action_id for e in enqueued])
    messages = await moto.received(url)
    attributes = [{k: v["StringValue"] for k, v in m["MessageAttributes"].items()} for m in messages]
    truth = Truth({key: sum(a[wire.KAFKA_IDEMPOTENCY_KEY] == key for a in attributes)
                   for key in {a[wire.KAFKA_IDEMPOTENCY_KEY] for a in attributes}},
                  frozenset(a[wire.KAFKA_ATTEMPT_ID] for a in attributes))
    table = truth_table(history, truth)
    report("sqs", f"{store_name(store_url)}-crash-{point}",
           f"{INTENTS} intents, {len(in_flight)} attempt(s) cut in flight, {len(messages)} messages", table)
    assert check(history, truth) == []
    assert off_diagonal(table) == 0
    assert {a.attempt_id for i in history for a in i.attempts if a.submission == "maybe_submitted"} == in_flight
    assert bool(in_flight) is (point != "after_claim"), in_flight
    if point in ANSWERED:  # SQS had answered: the message of a cut attempt is in the queue, and counted once
        assert in_flight & truth.reached, f"no attempt cut in flight at {point} had arrived"
    assert all(fact.status == "delivered" for fact in history), history
    assert len(messages) == INTENTS and all(truth.effects[fact.key] == 1 for fact in history), truth.effects
