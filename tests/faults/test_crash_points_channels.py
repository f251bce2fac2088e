"""``kill -9`` at each crash point of the sender (``outbox.crash``) while it sends email,
produces to Kafka and adds to a Redis stream, on SQLite and PostgreSQL: the webhook rows of
tests/faults/test_crash_points.py, for the other channels.

A real ``outbox worker`` process, armed with ``OUTBOX_CRASH_AT``, sends a few intents and kills
itself with SIGKILL at one step; an in-process ``sender.Worker`` then recovers the expired leases
and settles everything, and the fault matrix's checker judges the store's history against the
ground truth:

- email: what the scriptable aiosmtpd server (tests/smtp.py) received, a message counting once
  its final dot arrived. Mail servers do not deduplicate and an email destination's ``on_unknown``
  is ``never``, so an intent whose attempt was cut in flight is recorded ``unknown`` and never
  sent again: its message arrived once (the worker died once the message and its final dot were
  written) or never (it died before the send), and the test checks which against the server.
- Kafka: the topic of a noida broker, and of a Tansu broker (produced to without the idempotent
  producer, which it lacks), the effects counted through the receivers' idempotent consumer.
  ``on_unknown`` is ``always``, so an attempt cut in flight is produced again: every intent ends
  delivered with one effect, and the topic holds one extra record for each attempt that had been
  appended when the worker died (every one cut once the broker had answered; one cut at
  ``after_request`` was only handed to the producer and need not have left).
- Redis: the stream on a private redis-server (append-only, fsynced per write). ``on_unknown`` is
  ``always`` and the channel's script answers a resend with the entry added first, so every
  intent ends delivered and the stream holds exactly one entry per intent, whichever attempts
  had reached it.

Every point runs for email, noida and Redis on both stores, and for Tansu on SQLite (Tansu's
consumer group takes seconds to join, and the stores differ only below the sender): 42 cases.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import pytest

from outbox import DestinationSpec, Outbox, Settings
from outbox.crash import CrashPoint
from sender.email import EmailSpec
from sender.kafka import KafkaSpec
from sender.redis import RedisSpec

from ..acceptance.conftest import outbox_worker
from ..conftest import SECRET, rows
from ..kafka import Broker
from ..redis_servers import RedisServer
from ..smtp import SmtpServer
from .checker import IntentFact, Truth, check, off_diagonal, truth_table
from .tables import store_name
from .test_crash_points import (
    ANSWERED,
    CONCURRENCY,
    LEASE_SECONDS,
    POLL_SECONDS,
    WRITTEN,
    crashing,
    integrity,
    recovered,
)
from .test_matrix import report
from .test_matrix_channels import TOPIC, email_truth, topic_truth
from .test_matrix_redis import STREAM, stream_truth

pytestmark = pytest.mark.acceptance

INTENTS = 3
#: Every point for email and noida on both stores; for Tansu (whose consumer group takes seconds
#: to join) on SQLite: the stores differ only below the sender, and the noida rows cover both.
CASES = [(kind, store, point) for kind in ("email", "noida", "redis") for store in ("sqlite", "postgres")
         for point in get_args(CrashPoint)] + [("tansu", "sqlite", point) for point in get_args(CrashPoint)]


@dataclass(frozen=True)
class Target:
    """One channel's destination, the payload of its n-th intent, and its ground truth (with how
    many messages or records arrived in all)."""

    channel: str
    spec: DestinationSpec
    payload: Callable[[int], dict[str, Any]]
    truth: Callable[[], Awaitable[tuple[Truth, int]]]
    row: str = ""  # how its rows are told apart in the tables: the broker's kind


@pytest.fixture
async def target(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Target]:
    """The SMTP server (``email``), a private redis-server (``redis``), or a broker (``noida`` or
    ``tansu``: the ``kafka`` or ``tansu`` fixture) with the topic created."""
    if request.param == "email":
        server = SmtpServer().start()

        async def received() -> tuple[Truth, int]:
            return email_truth(server), len(server.received)

        try:
            yield Target("email", EmailSpec.model_validate({
                "channel": "email", "host": "127.0.0.1", "port": server.port, "from": "Billing <billing@example.com>",
                "tls": "none", "allow_insecure": True, "allow_private_network": True, "timeout_seconds": 5.0,
                "data_timeout_seconds": 5.0}), lambda n: {"to": [f"r{n}@example.org"], "subject": f"n {n}",
                                                          "text": "hi"}, received)
        finally:
            server.stop()
        return
    if request.param == "redis":
        redis = RedisServer(tmp_path).start()

        async def stream() -> tuple[Truth, int]:
            truth, entries = await stream_truth(redis)
            return truth, sum(entries.values())

        try:
            yield Target("redis", RedisSpec.model_validate({
                "channel": "redis", "host": "127.0.0.1", "port": redis.port, "stream": STREAM,
                "allow_private_network": True, "timeout_seconds": 5.0, "secret": SECRET}), lambda n: {"n": n}, stream)
        finally:
            redis.stop()
        return
    broker: Broker = request.getfixturevalue("kafka" if request.param == "noida" else "tansu")
    await broker.create_topic(TOPIC, partitions=2)
    yield Target("kafka", KafkaSpec.model_validate({
        "channel": "kafka", "bootstrap_servers": [broker.bootstrap], "topic": TOPIC, "allow_private_network": True,
        "timeout_seconds": 5.0, "secret": SECRET,
        "enable_idempotence": broker.kind == "noida"}),  # (Tansu has no idempotent producer)
        lambda n: {"n": n}, lambda: topic_truth(broker), f"-{broker.kind}")


async def killed_at(point: str, url: str, tmp_path: Path) -> set[str]:
    """Run ``outbox worker`` armed at ``point`` until it has killed itself; the ids of the attempts
    it left in flight (it finished none: the crash cut every outcome short)."""
    with outbox_worker(tmp_path, crashing(url, point)) as (process, log):
        code = await asyncio.to_thread(process.wait, 60)
    assert code == -9, f"not killed at {point} (exit {code}):\n{log.read_text()}"
    await integrity(url)
    started = await rows(url, "SELECT attempt_id, finished_at FROM attempts")
    assert all(finished is None for _, finished in started), started
    return {attempt for attempt, _ in started}


def in_flight_of(fact: IntentFact, in_flight: set[str]) -> str | None:
    """The attempt of ``fact`` the crash cut short, if any."""
    return next((a.attempt_id for a in fact.attempts if a.attempt_id in in_flight), None)


@pytest.mark.parametrize(("target", "store_url", "point"), CASES, indirect=["target", "store_url"])
async def test_a_worker_killed_while_sending_email_or_producing_loses_and_misreports_nothing(
        tmp_path: Path, target: Target, store_url: str, point: str) -> None:
    url = store_url
    settings = Settings(database_url=url, authority="allow-all", lease_seconds=LEASE_SECONDS, poll_seconds=POLL_SECONDS,
                        worker_concurrency=CONCURRENCY, backoff_initial_seconds=0.1)
    async with await Outbox.open(url, settings=settings) as box:
        await box.put_destination("out", target.spec)
        enqueued = await box.enqueue_many({"destination": "out", "scope": "acme", "action_id": f"{target.channel}-{n}",
                                           "payload": target.payload(n)} for n in range(INTENTS))
        in_flight = await killed_at(point, url, tmp_path)
        history = await recovered(box, url, [e.intent.action_id for e in enqueued])
    truth, arrivals = await target.truth()
    table = truth_table(history, truth)
    arrived = f"{arrivals} {dict(email='messages', redis='entries').get(target.channel, 'records')} arrived"
    report(target.channel, f"{store_name(url)}-crash-{point}{target.row}",
           f"{INTENTS} intents, {len(in_flight)} attempt(s) cut in flight, {arrived}", table)
    assert check(history, truth) == []
    assert off_diagonal(table) == 0
    # maybe_submitted exactly for the attempts the crash cut short
    assert {a.attempt_id for i in history for a in i.attempts if a.submission == "maybe_submitted"} == in_flight
    assert bool(in_flight) is (point != "after_claim"), in_flight
    # what the dead worker had written reached the server (a message and its final dot on an open
    # connection) or the topic (the broker answered the produce); a record only handed to the
    # producer need not have left (nor a script call the server had not answered)
    if point in (WRITTEN if target.channel == "email" else ANSWERED):
        assert in_flight & truth.reached, f"no attempt cut in flight at {point} had arrived"
    if target.channel == "email":  # never sent again: unknown, and arrived once or never, as the server says
        for fact in history:
            cut = in_flight_of(fact, in_flight)
            assert fact.status == ("delivered" if cut is None else "unknown"), fact
            assert truth.effects.get(fact.key, 0) == (cut is None or cut in truth.reached), fact
    elif target.channel == "redis":  # sent again, and the server's dedupe answered the entry added first
        assert all(fact.status == "delivered" for fact in history), history
        assert arrivals == INTENTS and all(truth.effects.get(fact.key) == 1 for fact in history), truth
    else:  # produced again: delivered once through the consumer; one extra record per appended cut attempt
        assert all(fact.status == "delivered" for fact in history), history
        assert arrivals == INTENTS + len(in_flight & truth.reached), (arrivals, in_flight, truth.reached)
