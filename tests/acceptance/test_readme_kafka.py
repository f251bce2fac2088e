"""The README's idempotent Kafka consumer example runs as printed, against a real broker."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import time
from pathlib import Path

import pytest
import rfc8785
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from receivers import wire
from tests.conftest import SECRET, eventually
from tests.kafka import Broker

from .test_readme import load


async def produce(broker: Broker, *actions: tuple[str, object, bool]) -> None:
    """Records as the Kafka channel produces them: the canonical payload and the four headers, and
    the two of its signature with ``SECRET`` for an action marked signed."""
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for fence, (action_id, payload, signed) in enumerate(actions, 1):
            value = rfc8785.dumps(payload)
            now = int(time.time())
            headers = [(wire.KAFKA_IDEMPOTENCY_KEY, action_id.encode()),
                       (wire.KAFKA_PAYLOAD_DIGEST, f"sha256:{hashlib.sha256(value).hexdigest()}".encode()),
                       (wire.KAFKA_ATTEMPT_ID, f"attempt-{fence}".encode()), (wire.KAFKA_FENCE, str(fence).encode())]
            if signed:
                headers += [(wire.KAFKA_TIMESTAMP, str(now).encode()),
                            (wire.KAFKA_SIGNATURE, wire.sign([SECRET], action_id, now, value).encode())]
            await (await producer.send("orders", value, key=action_id.encode(), headers=headers))
    finally:
        await producer.stop()


async def committed(broker: Broker, group: str) -> dict[int, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {tp.partition: meta.offset for tp, meta in offsets.items()}


async def test_the_kafka_consumer_example_handles_each_action_once(
        kafka: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KAFKA_SIGNING_SECRET", SECRET)
    example = load("kafka-consumer", tmp_path)
    example["BOOTSTRAP"] = kafka.bootstrap
    monkeypatch.chdir(tmp_path)  # where its record store lives
    await kafka.create_topic("orders", partitions=1)
    # the sender's retry of invoice-1 (same payload), a different payload under its key, and a record
    # someone else wrote under invoice-3's key
    await produce(kafka, ("acme/invoice-1", {"amount": 10}, True), ("acme/invoice-2", {"amount": 20}, True),
                  ("acme/invoice-1", {"amount": 10}, True), ("acme/invoice-1", {"amount": 99}, True),
                  ("acme/invoice-3", {"amount": 1}, False))
    running = asyncio.create_task(example["main"]())
    printed: list[str] = []

    def settled() -> bool:
        printed.append(capsys.readouterr().out)
        return "orders/0/4" in "".join(printed) or running.done()

    assert await eventually(settled, 20)
    os.kill(os.getpid(), signal.SIGTERM)  # main's signal handler stops the consumer gracefully
    await asyncio.wait_for(running, 20)
    assert example["invoices"] == ["acme/invoice-1", "acme/invoice-2"]
    assert "refused orders/0/3: idempotency-key-reused" in "".join(printed)
    assert "refused orders/0/4: missing-signature" in "".join(printed)
    assert await committed(kafka, "billing") == {0: 5}
    assert (tmp_path / "idempotency.db").exists()
