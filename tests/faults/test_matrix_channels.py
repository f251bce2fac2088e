"""The fault matrix's email and Kafka rows (tier 1), on the same checker and truth table as the
webhook rows (tests/faults/test_matrix.py), with real servers on loopback:

- email: a real ``sender.Worker`` hands messages to the scriptable aiosmtpd server
  (tests/smtp.py), which draws a fault per message from the seed (4xx or 5xx at MAIL FROM, 4xx
  at RCPT or at the DATA command, the connection dropped instead of the reply to MAIL FROM, to
  RCPT TO or to the final dot, no reply at all, or 250); a share of the intents goes to a port
  nobody listens on (refused at connect). The ground truth is what the server received: a
  message counts once its final dot arrived, and mail servers do not deduplicate, so every
  arrival is an effect. A refused MAIL FROM must be recorded not submitted (retried after a 4xx,
  dead-lettered after a 5xx), and so must a connection dropped before DATA (retried).
- Kafka: rounds of a few intents to a noida broker, each round bringing a fault drawn from the
  seed (every fault at least once): the broker stopped before a send (not submitted, produced
  once it is back), SIGSTOPped once the producer is connected (maybe submitted, then produced
  again), or stopped after an acknowledged produce (the records it acknowledged must be in the
  topic after the restart). The ground truth is the topic, the effects counted through the
  receivers' idempotent consumer.

As for the webhook rows, ``--faults=long`` runs more intents (more rounds) with a random seed,
named in the table's title and in any failure; ``--faults-seed`` replays one.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from outbox import Outbox, Settings
from receivers import IdempotentConsumer, MemoryRecordStore, wire
from sender import Worker
from sender.email import EmailChannel, EmailSpec
from sender.kafka import KafkaChannel, KafkaSpec

from ..conftest import SECRET, free_port, rows
from ..kafka import Broker
from ..smtp import SmtpServer
from .checker import Truth, check, off_diagonal, truth_table
from .tables import store_name
from .test_matrix import facts, report, run_until_settled, settled, tier

#: One fault per message, drawn when its MAIL FROM arrives (the destination keeps one connection,
#: so messages reach the server one at a time and each fault belongs to the message being sent);
#: the first messages get each fault once, in an order drawn from the seed.
EMAIL_WEIGHTS = {"ok": 4.0, "mail_4xx": 1.0, "mail_5xx": 0.5, "mail_drop": 0.5, "rcpt_4xx": 1.0, "rcpt_drop": 0.5,
                 "data_4xx": 1.0, "close": 1.0, "hold": 1.0}
#: The replies refusing a command, or the connection dropped instead of a reply ("close"), by
#: fault: before DATA, so nothing can have been submitted.
MAIL_REPLIES = {"mail_4xx": "451 4.3.2 try later", "mail_5xx": "550 5.7.1 sender refused", "mail_drop": "close"}
RCPT_REPLIES = {"rcpt_4xx": "451 4.2.0 mailbox busy", "rcpt_drop": "close"}
#: How the email channel must classify a refused MAIL FROM: (submission, outcome) by reply class.
MAIL_REFUSED = {4: ("not_submitted", "retryable"), 5: ("not_submitted", "rejected")}
REFUSED_SHARE = 0.15  # intents for the destination whose port refuses every connect
TOPIC = "orders"
#: The broker faults of the Kafka row's rounds: each round enqueues a few intents and brings one
#: (or none), and waits for them to be delivered before the next.
STOPPED = "stopped before a send"  # nothing can leave: not submitted, then produced once it is back
SILENT = "silent once connected"  # SIGSTOP: the produce is written, never answered: maybe submitted
ACKED = "stopped after an acknowledged produce"  # the records appended must be there after the restart
KAFKA_FAULTS = (STOPPED, SILENT, ACKED)


class Drawn(dict[str, str]):
    """The server's script for one command, whatever the address: the reply that ``fault()``, the
    message's fault, gives there (None: 250)."""

    def __init__(self, replies: dict[str, str], fault: Callable[[], str]) -> None:
        super().__init__()
        self.replies, self.fault = replies, fault

    def get(self, address: str, default: Any = None) -> Any:
        return self.replies.get(self.fault())


class FaultySmtp(SmtpServer):
    """The scriptable server, its script drawn per message from a seeded ``random.Random``."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        self.rng = rng
        self.faults: Counter[str] = Counter()
        self.fault = "ok"
        self.deck = rng.sample(list(EMAIL_WEIGHTS), len(EMAIL_WEIGHTS))  # every fault once first, shuffled
        self.mail = Drawn(MAIL_REPLIES, self.draw)
        self.rcpt = Drawn(RCPT_REPLIES, lambda: self.fault)

    def draw(self) -> str:
        """A new message's fault (at its MAIL FROM), and the rest of its script."""
        self.fault = fault = self.deck.pop() if self.deck else \
            self.rng.choices(list(EMAIL_WEIGHTS), weights=list(EMAIL_WEIGHTS.values()))[0]
        self.faults[fault] += 1
        self.data_command = "451 4.3.0 try later" if fault == "data_4xx" else None
        self.replies = [fault] if fault in ("close", "hold") else []
        return fault


def email_truth(server: SmtpServer) -> Truth:
    """Every message whose final dot arrived is an effect (mail servers do not deduplicate)."""
    arrived = [r.message for r in server.received]
    return Truth(Counter(str(m[wire.IDEMPOTENCY_KEY]) for m in arrived),
                 frozenset(str(m[wire.ATTEMPT_ID]) for m in arrived), idempotent=False)


async def test_smtp_faults_lose_or_misreport_nothing(request: pytest.FixtureRequest, store_url: str) -> None:
    long, seed = tier(request)
    count = 300 if long else 40
    store = store_name(store_url)
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
    assert set(server.faults) == set(EMAIL_WEIGHTS) and refused > 0, f"seed {seed}: a fault was never drawn"
    # a refused MAIL FROM is recorded not submitted (nothing can have been: it precedes DATA), to be
    # tried again after a 4xx and dead-lettered after a 5xx; one attempt for each such fault drawn
    refusals = await rows(store_url, "SELECT status_code, submission, outcome FROM attempts "
                                     "WHERE stage = 'mail' AND status_code IS NOT NULL")
    assert Counter(f"mail_{code // 100}xx" for code, _, _ in refusals) == \
        Counter({mode: server.faults[mode] for mode in ("mail_4xx", "mail_5xx")}), f"seed {seed}: {refusals}"
    assert all(MAIL_REFUSED[code // 100] == (submission, outcome) for code, submission, outcome in refusals), refusals
    # a connection dropped instead of the reply to MAIL FROM or RCPT TO: not submitted, tried again.
    # (On a reused connection the channel takes a drop at MAIL FROM for a connection that had
    # gone, and goes on over a new one within the same attempt: not every drop is an attempt.)
    drops = await rows(store_url, "SELECT stage, submission, outcome FROM attempts "
                                  "WHERE stage IN ('mail', 'rcpt') AND status_code IS NULL")
    assert 0 < len(drops) <= server.faults["mail_drop"] + server.faults["rcpt_drop"], f"seed {seed}: {drops}"
    assert {(submission, outcome) for _, submission, outcome in drops} == {("not_submitted", "retryable")}, drops


async def topic_truth(broker: Broker) -> tuple[Truth, int]:
    """Every record's attempt id (reached), and the effects per key as the receivers' idempotent
    consumer applies them, checking their signatures (a key produced twice has one effect); and how many
    records the topic holds."""
    effects: Counter[str] = Counter()
    reached: set[str] = set()
    records = 0

    async def handle(record: Any, context: Any) -> None:
        effects[dict(record.headers)[wire.KAFKA_IDEMPOTENCY_KEY].decode()] += 1

    plain = AIOKafkaConsumer(TOPIC, bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False)
    await plain.start()
    try:
        while batch := await plain.getmany(timeout_ms=500):
            for batch_records in batch.values():
                for record in batch_records:
                    reached.add(dict(record.headers)[wire.KAFKA_ATTEMPT_ID].decode())
                records += len(batch_records)
    finally:
        await plain.stop()
    consumer = AIOKafkaConsumer(TOPIC, bootstrap_servers=broker.bootstrap, group_id="effects",
                                auto_offset_reset="earliest", enable_auto_commit=False)
    async with IdempotentConsumer(consumer, MemoryRecordStore(), handle, secrets=SECRET):
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and consumer.assignment() == set():
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.2)
        while time.monotonic() < deadline:
            positions = [await consumer.position(tp) for tp in consumer.assignment()]
            if sum(positions) >= records:
                break
            await asyncio.sleep(0.1)
    return Truth(dict(effects), frozenset(reached), idempotent=True), records


async def attempted(box: Outbox, keys: list[tuple[str, str]], timeout: float = 20) -> None:
    """Wait until every intent has a finished attempt."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        histories = [await box.history(a, scope=s) for s, a in keys]
        if all(h.attempts and h.attempts[0].finished_at is not None for h in histories):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"no finished attempt for some of {keys}")


async def test_broker_faults_lose_duplicate_or_misreport_nothing(
        request: pytest.FixtureRequest, store_url: str, kafka: Broker) -> None:
    long, seed = tier(request)
    rng = random.Random(seed)
    store = store_name(store_url)
    # a warm-up round connects the producer; then every fault at least once, more drawn, shuffled
    rounds = [*KAFKA_FAULTS, *rng.choices([None, *KAFKA_FAULTS], k=12 if long else 2)]
    rng.shuffle(rounds)
    await kafka.create_topic(TOPIC, partitions=2)
    settings = Settings(authority="allow-all", backoff_initial_seconds=0.05, backoff_cap_seconds=0.3,
                        circuit_failures=0, poll_seconds=0.1, default_max_attempts=100)
    box = await Outbox.open(store_url, settings=settings)
    worker = Worker(box, channels={"kafka": KafkaChannel()}, concurrency=4)
    keys: list[tuple[str, str]] = []
    acked: list[str] = []  # delivered before the broker was stopped: their records must survive it
    faults: Counter[str] = Counter()

    async def enqueue(prefix: str, size: int | None = None) -> list[tuple[str, str]]:
        batch = [(e.intent.scope, e.intent.action_id) for e in await box.enqueue_many(
            {"destination": "log", "scope": "acme", "action_id": f"{prefix}-{n}", "payload": {"n": n}}
            for n in range(size or rng.randint(2, 5)))]
        keys.extend(batch)
        return batch

    def broker() -> subprocess.Popen[bytes]:
        assert kafka.process is not None
        return kafka.process

    try:
        await box.put_destination("log", KafkaSpec.model_validate({
            "channel": "kafka", "bootstrap_servers": [kafka.bootstrap], "topic": TOPIC,
            "allow_private_network": True, "timeout_seconds": 1.0, "secret": SECRET}))
        task = asyncio.create_task(worker.run())
        try:
            for number, fault in enumerate([None, *rounds]):
                faults[fault or ("warm-up" if number == 0 else "none")] += 1
                if fault == STOPPED:  # (gracefully, as below: noida SIGKILLed loses records it acknowledged)
                    await asyncio.to_thread(kafka.stop, graceful=True)
                    await attempted(box, batch := await enqueue(f"r{number}"))
                    await asyncio.to_thread(kafka.start)
                elif fault == SILENT:
                    # one intent delivered first: the producer is connected (the round before may
                    # have restarted the broker), so the next produce requests are written, unanswered
                    assert await settled(box, await enqueue(f"r{number}-connect", 1), timeout=30) == []
                    os.kill(broker().pid, signal.SIGSTOP)
                    try:
                        await attempted(box, batch := await enqueue(f"r{number}"))
                    finally:
                        os.kill(broker().pid, signal.SIGCONT)
                else:
                    batch = await enqueue(f"r{number}")
                # delivered, and the producer connected for the next round
                assert await settled(box, batch, timeout=30) == [], f"seed {seed}, round {number}: {fault}"
                if fault == ACKED:
                    await asyncio.to_thread(kafka.stop, graceful=True)
                    await asyncio.to_thread(kafka.start)
                    acked.extend(f"{s}/{a}" for s, a in batch)
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
    title = (f"{len(keys)} intents, seed {seed}, {records} records, rounds: "
             + ", ".join(f"{k} {n}" for k, n in faults.items())
             + "; attempts: " + ", ".join(f"{k} {n}" for k, n in sorted(submissions.items(), key=str)))
    rendered = report("kafka", store, title, table)
    assert check(history, truth) == [], f"seed {seed}"
    assert off_diagonal(table) == 0, f"seed {seed}\n{rendered}"
    assert all(fact.status == "delivered" for fact in history), f"seed {seed}\n{rendered}"
    assert [key for key in acked if truth.effects.get(key) != 1] == [], f"seed {seed}: acknowledged records lost"
    assert submissions["not_submitted"] > 0 and submissions["maybe_submitted"] > 0, f"seed {seed}\n{rendered}"
