"""The fault matrix's RabbitMQ row (tier 1), on the same checker and truth table as the webhook,
email and Kafka rows: rounds of a few intents published to the shared broker through a TCP proxy
(tests/rabbitmq.py), each round bringing a fault drawn from the seed (every fault at least once):

- the broker gone before a send (the proxy drops every connection and refuses new ones): not
  submitted, then published once it is back;
- the broker silent once connected (the proxy holds its confirms back, the publishes still go
  in and are routed): maybe submitted after the timeout, then the connection dropped and the
  intents published again;
- the connection dropped once a publish frame went through (before its confirm): maybe
  submitted, the message routed or not.

The ground truth is two queues every message is routed to: the test's, read whole, for the
attempt of every message (``outbox-attempt-id``, its signature checked), and a second one taken
by the receivers' idempotent RabbitMQ consumer, whose handler's runs are the effects (each key's
once, however many copies the queue held). RabbitMQ has no publisher-side deduplication and the destination's
``on_unknown`` is ``always``, so the queue holds a second message for each maybe-submitted
attempt whose message had been routed: each counted, and each from a maybe-submitted attempt.
``--faults=long`` runs more rounds with a random seed; ``--faults-seed`` replays one.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from outbox import Outbox, Settings
from receivers import IdempotencyContext, IdempotentRabbitMQConsumer, MemoryRecordStore, wire
from sender import Worker
from sender.rabbitmq import RabbitChannel, RabbitSpec

from ..conftest import SECRET, eventually
from ..rabbitmq import Rabbit, TcpProxy
from .checker import Truth, check, off_diagonal, truth_table
from .tables import store_name
from .test_matrix import facts, report, settled, tier
from .test_matrix_channels import attempted

pytestmark = pytest.mark.acceptance

GONE = "gone before a send"  # nothing can leave: not submitted, then published once it is back
SILENT = "silent once connected"  # the publishes go in, no confirm comes back: maybe submitted
DROPPED = "dropped after a publish"  # the connection lost with a publish in flight: maybe submitted
FAULTS = (GONE, SILENT, DROPPED)
KEY = "orders"


async def queue_truth(rabbit: Rabbit, consumed: str) -> tuple[Truth, dict[str, list[str]]]:
    """The truth from the two queues every message was routed to: the test's, read whole (the
    attempt of each message, in the queue's order, its signature checked), and ``consumed``, taken
    by the receivers' idempotent RabbitMQ consumer, whose handler's runs are the effects."""
    reached: set[str] = set()
    by_key: dict[str, list[str]] = {}
    for message in await rabbit.messages():
        headers = {name: str(value) for name, value in message.headers.items()}
        key = headers[wire.KAFKA_IDEMPOTENCY_KEY]
        wire.verify_signature(SECRET, {wire.WEBHOOK_ID: key, wire.WEBHOOK_TIMESTAMP: headers[wire.KAFKA_TIMESTAMP],
                                       wire.WEBHOOK_SIGNATURE: headers[wire.KAFKA_SIGNATURE]}, message.body,
                              tolerance_seconds=3600)
        reached.add(headers[wire.KAFKA_ATTEMPT_ID])
        by_key.setdefault(key, []).append(headers[wire.KAFKA_ATTEMPT_ID])
    effects: Counter[str] = Counter()
    refused: list[object] = []

    async def handle(message: object, work: IdempotencyContext) -> None:
        effects[work.key] += 1

    async def drained() -> bool:
        queue = await rabbit.channel.declare_queue(consumed, passive=True)
        return queue.declaration_result.message_count == 0

    consumer = IdempotentRabbitMQConsumer(await rabbit.channel.get_queue(consumed), MemoryRecordStore(), handle,
                                          secrets=SECRET, on_error=lambda message, why: refused.append(why))
    async with consumer:
        assert await eventually(lambda: len(effects) == len(by_key), 30), (len(effects), len(by_key))
        assert await eventually(drained, 30)
    assert await drained(), "the consumer handed messages back: not every copy was taken"
    assert refused == []
    return Truth(dict(effects), frozenset(reached), idempotent=True), by_key


async def test_broker_faults_lose_or_misreport_nothing(request: pytest.FixtureRequest, store_url: str,
                                                       rabbit: Rabbit) -> None:
    long, seed = tier(request)
    rng = random.Random(seed)
    store = store_name(store_url)
    rounds = [*FAULTS, *rng.choices([None, *FAULTS], k=12 if long else 2)]
    rng.shuffle(rounds)
    await rabbit.bind(KEY)
    consumed = await rabbit.bind(KEY, queue=f"{rabbit.queue}-consumed")
    settings = Settings(authority="allow-all", backoff_initial_seconds=0.05, backoff_cap_seconds=0.3,
                        circuit_failures=0, poll_seconds=0.1, default_max_attempts=100)
    box = await Outbox.open(store_url, settings=settings)
    worker = Worker(box, channels={"rabbitmq": RabbitChannel()}, concurrency=4)
    keys: list[tuple[str, str]] = []
    faults: Counter[str] = Counter()

    async def enqueue(prefix: str, size: int | None = None) -> list[tuple[str, str]]:
        batch = [(e.intent.scope, e.intent.action_id) for e in await box.enqueue_many(
            {"destination": "bus", "scope": "acme", "action_id": f"{prefix}-{n}", "payload": {"n": n}}
            for n in range(size or rng.randint(2, 5)))]
        keys.extend(batch)
        return batch

    try:
        async with TcpProxy() as proxy:
            await box.put_destination("bus", RabbitSpec.model_validate({
                "channel": "rabbitmq", "url": f"amqp://guest@127.0.0.1:{proxy.port}/", "password": "guest",
                "allow_insecure": True, "allow_private_network": True, "exchange": rabbit.exchange,
                "routing_key": KEY, "timeout_seconds": 1.0, "secret": SECRET}))
            task = asyncio.create_task(worker.run())
            try:
                for number, fault in enumerate([None, *rounds]):
                    faults[fault or ("warm-up" if number == 0 else "none")] += 1
                    if fault is not None:  # one intent delivered first: the channel is connected
                        assert await settled(box, await enqueue(f"r{number}-connect", 1), timeout=30) == []
                    if fault == GONE:
                        await proxy.drop()
                        await attempted(box, batch := await enqueue(f"r{number}"))
                        await proxy.accept()
                    elif fault == SILENT:
                        proxy.answering.clear()
                        await attempted(box, batch := await enqueue(f"r{number}"))
                        await proxy.drop()  # the held connection gone; the next send opens another
                        proxy.answering.set()
                        await proxy.accept()
                    elif fault == DROPPED:
                        proxy.drop_at_publish = True
                        await attempted(box, batch := await enqueue(f"r{number}"))
                        await proxy.accept()
                    else:
                        batch = await enqueue(f"r{number}")
                    assert await settled(box, batch, timeout=30) == [], f"seed {seed}, round {number}: {fault}"
            finally:
                worker.stop()
                await asyncio.wait_for(task, 15)
        history = await facts(box, keys)
    finally:
        await worker.aclose()
        await box.close()
    truth, by_key = await queue_truth(rabbit, consumed)
    duplicates = sum(len(attempts) - 1 for attempts in by_key.values())
    table = truth_table(history, truth)
    submissions = Counter(a.submission for i in history for a in i.attempts)
    title = (f"{len(keys)} intents, seed {seed}, {sum(map(len, by_key.values()))} messages ({duplicates} duplicates), "
             "rounds: " + ", ".join(f"{k} {n}" for k, n in faults.items())
             + "; attempts: " + ", ".join(f"{k} {n}" for k, n in sorted(submissions.items(), key=str)))
    rendered = report("rabbitmq", store, title, table)
    assert check(history, truth) == [], f"seed {seed}"
    assert off_diagonal(table) == 0, f"seed {seed}\n{rendered}"
    assert all(fact.status == "delivered" for fact in history), f"seed {seed}\n{rendered}"
    assert submissions["not_submitted"] > 0 and submissions["maybe_submitted"] > 0, f"seed {seed}\n{rendered}"
    # of a key's messages, every one but the delivered attempt's came from an attempt that said
    # it may have been published, and no attempt published twice
    maybe = {a.attempt_id for i in history for a in i.attempts if a.submission == "maybe_submitted"}
    for key, attempts in by_key.items():
        assert len(set(attempts)) == len(attempts), f"seed {seed}: {key} published twice by one attempt"
        assert len([a for a in attempts if a not in maybe]) == 1, f"seed {seed}: {key} {attempts}\n{rendered}"
