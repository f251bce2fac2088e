"""The fault matrix's email and Kafka rows (tier 1), on the same checker and truth table as the
webhook rows (tests/faults/test_matrix.py), with real servers on loopback:

- email: a real ``sender.Worker`` hands messages to the scriptable aiosmtpd server
  (tests/smtp.py), which draws a fault per message from the seed (4xx at RCPT or at the DATA
  command, the connection dropped after the final dot, no reply at all, or 250); a share of the
  intents goes to a port nobody listens on (refused at connect). The ground truth is what the
  server received: a message counts once its final dot arrived, and mail servers do not
  deduplicate, so every arrival is an effect.
- Kafka: a noida broker stopped before a send (not submitted) and SIGSTOPped once the producer
  is connected (maybe submitted, then produced again); the ground truth is the topic, and the
  effects are counted through the receivers' idempotent consumer.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections import Counter
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from outbox import Outbox, Settings
from receivers import IdempotentConsumer, MemoryRecordStore, wire
from sender import Worker
from sender.email import EmailChannel, EmailSpec
from sender.kafka import KafkaChannel, KafkaSpec

from ..conftest import free_port
from ..kafka import Broker
from ..smtp import SmtpServer
from .checker import Truth, check, off_diagonal, truth_table
from .test_matrix import TIER1_SEED, facts, report, run_until_settled, settled

#: One fault per message, drawn when its RCPT arrives (the destination keeps one connection, so
#: messages reach the server one at a time and each fault belongs to the message being sent).
EMAIL_WEIGHTS = {"ok": 4.0, "rcpt_4xx": 1.0, "data_4xx": 1.0, "close": 1.0, "hold": 1.0}
REFUSED_SHARE = 0.15  # intents for the destination whose port refuses every connect
TOPIC = "orders"


class FaultySmtp(SmtpServer):
    """The scriptable server, its script drawn per message from a seeded ``random.Random``."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        self.rng = rng
        self.faults: Counter[str] = Counter()
        owner = self

        class Drawn(dict[str, str]):
            def get(self, address: str, default: Any = None) -> Any:
                return owner.draw()

        self.rcpt = Drawn()

    def draw(self) -> str | None:
        """This message's fault: the RCPT reply it gets (None: 250), and the rest of its script."""
        fault = self.rng.choices(list(EMAIL_WEIGHTS), weights=list(EMAIL_WEIGHTS.values()))[0]
        self.faults[fault] += 1
        self.data_command = "451 4.3.0 try later" if fault == "data_4xx" else None
        self.replies = [fault] if fault in ("close", "hold") else []
        return "451 4.2.0 mailbox busy" if fault == "rcpt_4xx" else None


def email_truth(server: SmtpServer) -> Truth:
    arrived = [r.message for r in server.received]
    return Truth(Counter(str(m[wire.IDEMPOTENCY_KEY]) for m in arrived),
                 frozenset(str(m[wire.ATTEMPT_ID]) for m in arrived), idempotent=False)


async def test_smtp_faults_lose_or_misreport_nothing(request: pytest.FixtureRequest, store_url: str) -> None:
    long = request.config.getoption("--faults") == "long"
    seed = request.config.getoption("--faults-seed")
    if seed is None:
        seed = random.SystemRandom().randrange(2**32) if long else TIER1_SEED
    count = 300 if long else 40
    store = "postgres" if store_url.startswith("postgres") else "sqlite"
    rng = random.Random(seed)
    server = FaultySmtp(rng)
    server.start()
    settings = Settings(authority="allow-all", backoff_initial_seconds=0.05, backoff_cap_seconds=0.2,
                        circuit_failures=0, poll_seconds=0.1, default_max_attempts=12)
    box = await Outbox.open(store_url, settings=settings)
    channel = EmailChannel()
    worker = Worker(box, channels={"email": channel}, concurrency=4)
    try:
        common: dict[str, Any] = {"channel": "email", "host": "127.0.0.1", "from": "Billing <billing@example.com>",
                                  "tls": "none", "allow_insecure": True, "allow_private_network": True,
                                  "timeout_seconds": 0.5, "data_timeout_seconds": 0.5, "connections": 1}
        await box.put_destination("mail", EmailSpec.model_validate({**common, "port": server.port}))
        await box.put_destination("refused", EmailSpec.model_validate({**common, "port": free_port()}))
        keys, refused = [], 0
        for n in range(count):
            destination = "refused" if rng.random() < REFUSED_SHARE else "mail"
            refused += destination == "refused"
            result = await box.enqueue(scope="acme", action_id=f"m-{n}", destination=destination,
                                       payload={"to": [f"r{n}@example.org"], "subject": f"n {n}", "text": "hi"},
                                       **({"max_attempts": 2} if destination == "refused" else {}))
            keys.append((result.intent.scope, result.intent.action_id))
        still_open, history = await run_until_settled(box, worker, keys, timeout=300 if long else 30)
    finally:
        await worker.aclose()
        await box.close()
        server.stop()
    truth = email_truth(server)
    table = truth_table(history, truth)
    faults = ", ".join(f"{mode} {n}" for mode, n in sorted((server.faults + Counter(refused=refused)).items()))
    rendered = report("email", store, f"{count} intents, seed {seed}, messages: {faults}", table)
    assert still_open == [], f"seed {seed}: not settled: {still_open}"
    assert check(history, truth) == [], f"seed {seed}"
    assert off_diagonal(table) == 0, f"seed {seed}\n{rendered}"
    assert sum(n for mode, n in server.faults.items() if mode != "ok") > 0 and refused > 0, "no fault was injected"


async def topic_truth(broker: Broker) -> tuple[Truth, int]:
    """Every record's attempt id (reached), and the effects per key as the receivers' idempotent
    consumer applies them (a key produced twice has one effect); and how many records the topic holds."""
    effects: Counter[str] = Counter()
    reached: set[str] = set()
    seen: list[int] = []

    async def handle(record: Any, context: Any) -> None:
        effects[dict(record.headers)[wire.KAFKA_IDEMPOTENCY_KEY].decode()] += 1

    plain = AIOKafkaConsumer(TOPIC, bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False)
    await plain.start()
    try:
        while batch := await plain.getmany(timeout_ms=500):
            for records in batch.values():
                for record in records:
                    reached.add(dict(record.headers)[wire.KAFKA_ATTEMPT_ID].decode())
                    seen.append(record.offset)
    finally:
        await plain.stop()
    consumer = AIOKafkaConsumer(TOPIC, bootstrap_servers=broker.bootstrap, group_id="effects",
                                auto_offset_reset="earliest", enable_auto_commit=False)
    async with IdempotentConsumer(consumer, MemoryRecordStore(), handle):
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and consumer.assignment() == set():
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.2)
        while time.monotonic() < deadline:
            positions = [await consumer.position(tp) for tp in consumer.assignment()]
            if sum(positions) >= len(seen):
                break
            await asyncio.sleep(0.1)
    return Truth(dict(effects), frozenset(reached), idempotent=True), len(seen)


async def attempted(box: Outbox, keys: list[tuple[str, str]], timeout: float = 20) -> None:
    """Wait until every intent has a finished attempt."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        histories = [await box.history(a, scope=s) for s, a in keys]
        if all(h.attempts and h.attempts[0].finished_at is not None for h in histories):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"no finished attempt for some of {keys}")


async def test_broker_faults_lose_duplicate_or_misreport_nothing(store_url: str, kafka: Broker) -> None:
    store = "postgres" if store_url.startswith("postgres") else "sqlite"
    await kafka.create_topic(TOPIC, partitions=2)
    settings = Settings(authority="allow-all", backoff_initial_seconds=0.05, backoff_cap_seconds=0.3,
                        circuit_failures=0, poll_seconds=0.1, default_max_attempts=100)
    box = await Outbox.open(store_url, settings=settings)
    channel = KafkaChannel()
    worker = Worker(box, channels={"kafka": channel}, concurrency=4)
    keys: list[tuple[str, str]] = []
    faults: Counter[str] = Counter()

    async def enqueue(prefix: str, count: int) -> list[tuple[str, str]]:
        batch = []
        for n in range(count):
            result = await box.enqueue(scope="acme", action_id=f"{prefix}-{n}", destination="log", payload={"n": n})
            batch.append((result.intent.scope, result.intent.action_id))
        keys.extend(batch)
        return batch

    assert kafka.process is not None
    try:
        await box.put_destination("log", KafkaSpec.model_validate({
            "channel": "kafka", "bootstrap_servers": [kafka.bootstrap], "topic": TOPIC,
            "allow_private_network": True, "timeout_seconds": 1.0}))
        task = asyncio.create_task(worker.run())
        try:
            await attempted(box, await enqueue("warm", 5))  # the producer is connected
            kafka.stop(graceful=True)
            faults["stopped before the send"] += 1
            stopped = await enqueue("stopped", 5)
            await attempted(box, stopped)
            kafka.start()
            assert await settled(box, stopped, timeout=20) == []  # connected to the broker again
            os.kill(kafka.process.pid, signal.SIGSTOP)
            faults["silent after connect"] += 1
            try:
                await attempted(box, await enqueue("silent", 5))
            finally:
                os.kill(kafka.process.pid, signal.SIGCONT)
            await enqueue("after", 5)
            still_open = await settled(box, keys, timeout=30)
        finally:
            worker.stop()
            await asyncio.wait_for(task, 15)
        history = await facts(box, keys)
    finally:
        await worker.aclose()
        await box.close()
    truth, records = await topic_truth(kafka)
    table = truth_table(history, truth)
    submissions = Counter(a.submission for i in history for a in i.attempts)
    title = (f"{len(keys)} intents, {records} records, faults: " + ", ".join(f"{k} {n}" for k, n in faults.items())
             + ", attempts: " + ", ".join(f"{k} {n}" for k, n in sorted(submissions.items(), key=str)))
    rendered = report("kafka", store, title, table)
    assert still_open == [], f"not settled: {still_open}"
    assert check(history, truth) == []
    assert off_diagonal(table) == 0, rendered
    assert submissions["not_submitted"] > 0 and submissions["maybe_submitted"] > 0, rendered
