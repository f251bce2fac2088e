"""``kill -9`` of ``outbox worker`` while it produces to Kafka, and of the broker: after a restart
nothing is lost, and every record in the topic is held against the attempt that produced it (its
``outbox-attempt-id`` header): no attempt that produced a record is recorded ``not_submitted``,
and every delivered attempt's ``external_id`` names the record it produced."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from outbox import IntentQuery, Outbox, Outcome, Settings, Status, Submission
from receivers import wire
from sender import Worker
from sender.kafka import KafkaSpec

from ..conftest import SECRET
from ..kafka import Broker
from .conftest import clean_env, kill_9, outbox_worker

pytestmark = pytest.mark.acceptance

INTENTS = 500  # (one page of a listing)
LEASE_SECONDS = 1.0
TOPIC = "orders"


async def topic_records(broker: Broker) -> list[tuple[str, int, int, dict[str, bytes]]]:
    """Every record of the topic as (action id, partition, offset, headers)."""
    consumer = AIOKafkaConsumer(TOPIC, bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    try:
        found = []
        while batch := await consumer.getmany(timeout_ms=500):
            for records in batch.values():
                found.extend((r.key.decode(), r.partition, r.offset, dict(r.headers)) for r in records)
        return found
    finally:
        await consumer.stop()


async def produced(broker: Broker) -> int:
    """How many records the topic holds (the sum of its partitions' end offsets)."""
    consumer = AIOKafkaConsumer(TOPIC, bootstrap_servers=broker.bootstrap)
    await consumer.start()
    try:
        partitions = [TopicPartition(TOPIC, p) for p in consumer.partitions_for_topic(TOPIC) or ()]
        return sum((await consumer.end_offsets(partitions)).values())
    finally:
        await consumer.stop()


async def count(box: Outbox, status: Status) -> int:
    return len((await box.list_intents(IntentQuery(statuses=[status], limit=INTENTS))).intents)


async def registered(box: Outbox, broker: Broker) -> None:
    """The destination ``log``: the broker's topic."""
    await box.put_destination("log", KafkaSpec.model_validate({
        "channel": "kafka", "bootstrap_servers": [broker.bootstrap], "topic": TOPIC,
        "allow_private_network": True, "timeout_seconds": 5, "secret": SECRET}))


async def enqueued(box: Outbox, numbers: range) -> None:
    """An intent for ``log`` per number ``n``, ``order-n``."""
    await box.enqueue_many({"destination": "log", "scope": "acme", "action_id": f"order-{n}",
                            "payload": {"n": n}} for n in numbers)


async def test_kill_9_while_producing_loses_nothing_and_misreports_nothing(tmp_path: Path, kafka: Broker) -> None:
    await kafka.create_topic(TOPIC, partitions=3)
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    settings = Settings(database_url=url, authority="allow-all", lease_seconds=LEASE_SECONDS, poll_seconds=0.1)
    async with await Outbox.open(url, settings=settings) as box:
        await registered(box, kafka)
        await enqueued(box, range(INTENTS))
        env = clean_env(OUTBOX_DATABASE_URL=url, OUTBOX_AUTHORITY="allow-all", OUTBOX_WORKER_CONCURRENCY="16",
                        OUTBOX_LEASE_SECONDS=str(LEASE_SECONDS), OUTBOX_POLL_SECONDS="0.1")
        with outbox_worker(tmp_path, env) as (worker, log):
            deadline = time.monotonic() + 30
            while await produced(kafka) < INTENTS // 4:
                assert worker.poll() is None, f"the worker exited early:\n{log.read_text()}"
                assert time.monotonic() < deadline, f"too few records in 30 s:\n{log.read_text()}"
                await asyncio.sleep(0.02)
            kill_9(worker)
        assert await produced(kafka) < INTENTS  # killed mid-run

        recovering = Worker(box)
        running = asyncio.create_task(recovering.run())
        try:
            deadline = time.monotonic() + 60
            while (delivered := await count(box, Status.DELIVERED)) < INTENTS:
                assert time.monotonic() < deadline, f"{delivered} of {INTENTS} delivered in 60 s"
                await asyncio.sleep(0.1)
        finally:
            recovering.stop()
            await running

        intents = (await box.list_intents(IntentQuery(limit=INTENTS))).intents
        assert len(intents) == INTENTS and {i.status for i in intents} == {Status.DELIVERED}  # nothing lost
        found = await topic_records(kafka)
        by_attempt = {h[wire.KAFKA_ATTEMPT_ID].decode(): (key, p, o) for key, p, o, h in found}
        assert Counter(key for key, *_ in found).keys() == {i.action_id for i in intents}
        assert len(by_attempt) == len(found)  # one record per attempt at most
        for intent in intents:
            for attempt in (await box.history(intent.action_id)).attempts:
                record = by_attempt.get(attempt.attempt_id)
                if record is not None:
                    assert attempt.submission is not Submission.NOT_SUBMITTED, (intent.action_id, attempt)
                if attempt.submission is Submission.SUBMITTED:
                    assert record is not None and attempt.external_id == f"{TOPIC}/{record[1]}/{record[2]}"
        duplicates = len(found) - INTENTS
        assert duplicates <= 16  # only what was in flight when the worker died may be produced twice


BROKER_INTENTS = 150


async def test_a_broker_killed_mid_stream_and_restarted_gets_every_intent(tmp_path: Path, kafka: Broker) -> None:
    """SIGKILL of the broker while the worker produces, then a restart: the broker has lost the
    idempotent producer's state (its id and sequence numbers), so it refuses every later record of
    the producer the worker holds (``OutOfOrderSequenceNumber``). The worker replaces the producer
    and every intent is delivered, the worker never restarted. (noida loses what it acknowledged
    before the kill, so only attempts started after the restart can be held against the topic.)
    Half the intents are enqueued after the restart: a worker quick enough to have produced all the
    first half before the kill landed still sends the rest through the producer the broker forgot."""
    await kafka.create_topic(TOPIC, partitions=3)
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    async with await Outbox.open(url, settings=Settings(database_url=url, authority="allow-all")) as box:
        await registered(box, kafka)
        await enqueued(box, range(BROKER_INTENTS // 2))
        env = clean_env(OUTBOX_DATABASE_URL=url, OUTBOX_AUTHORITY="allow-all", OUTBOX_WORKER_CONCURRENCY="16",
                        OUTBOX_POLL_SECONDS="0.1", OUTBOX_BACKOFF_INITIAL_SECONDS="0.2",
                        OUTBOX_BACKOFF_CAP_SECONDS="2")
        with outbox_worker(tmp_path, env) as (worker, log):
            deadline = time.monotonic() + 30
            while await count(box, Status.DELIVERED) < BROKER_INTENTS // 4:
                assert worker.poll() is None, f"the worker exited early:\n{log.read_text()}"
                assert time.monotonic() < deadline, f"too few delivered in 30 s:\n{log.read_text()}"
                await asyncio.sleep(0.02)
            kafka.stop()  # SIGKILL, mid-stream
            await asyncio.sleep(1)
            kafka.start()
            restarted = datetime.now(UTC)
            await enqueued(box, range(BROKER_INTENTS // 2, BROKER_INTENTS))  # the same producer: not put again
            deadline = time.monotonic() + 60
            while (delivered := await count(box, Status.DELIVERED)) < BROKER_INTENTS:
                assert worker.poll() is None, f"the worker exited:\n{log.read_text()}"
                assert time.monotonic() < deadline, (
                    f"{delivered} of {BROKER_INTENTS} delivered 60 s after the restart:\n{log.read_text()[-3000:]}")
                await asyncio.sleep(0.1)

        attempts = [attempt for n in range(BROKER_INTENTS) for attempt in (await box.history(f"order-{n}")).attempts]
        ended = [a for a in attempts if "OutOfOrderSequenceNumber" in (a.error or "")
                 or "UnknownProducerId" in (a.error or "")]
        assert ended, "the broker never refused the old producer: the crash was not exercised"
        assert {(a.submission, a.outcome) for a in ended} == {(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN)}
        by_attempt = {h[wire.KAFKA_ATTEMPT_ID].decode(): (p, o) for _, p, o, h in await topic_records(kafka)}
        for attempt in attempts:
            record = by_attempt.get(attempt.attempt_id)
            if record is not None:
                assert attempt.submission is not Submission.NOT_SUBMITTED, attempt
            if attempt.outcome is Outcome.DELIVERED and attempt.started_at > restarted:
                assert record is not None and attempt.external_id == f"{TOPIC}/{record[0]}/{record[1]}", attempt
