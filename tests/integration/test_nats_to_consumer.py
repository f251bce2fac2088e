"""End to end over the shared NATS: what the NATS channel publishes, the receivers' idempotent
JetStream consumer takes, signature checked with the destination's secret, each action's effect
once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from outbox import Status
from receivers import IdempotencyContext, IdempotentJetStreamConsumer, MemoryRecordStore
from sender.nats import NatsChannel
from tests.conftest import SECRET, eventually
from tests.nats import Stream, connect

from .conftest import SenderEnv
from .test_nats import register, run_until


@pytest.fixture
async def stream() -> AsyncIterator[Stream]:
    async with Stream.made() as made:
        yield made


async def test_the_channels_messages_run_once_each_behind_the_consumer(env: SenderEnv, stream: Stream) -> None:
    await register(env, ["127.0.0.1:4222"], stream.subject)
    for n in (1, 2):
        await env.enqueue(f"order-{n}", {"n": n}, destination="log")
        intent, _ = await run_until(env, NatsChannel(), f"order-{n}")  # the worker closes it
        assert intent.status is Status.DELIVERED
    handled: list[tuple[str, Any]] = []
    refused: list[Any] = []

    async def handle(message: Any, work: IdempotencyContext) -> None:
        handled.append((work.key, message.data))

    client = await connect(stream.url)
    try:
        js = client.jetstream()
        await js.add_consumer(stream.name, ConsumerConfig(durable_name="billing", ack_policy=AckPolicy.EXPLICIT))
        consumer = IdempotentJetStreamConsumer(js, stream.name, "billing", MemoryRecordStore(), handle,
                                               secrets=SECRET, on_error=lambda message, why: refused.append(why))
        async with consumer:
            assert await eventually(lambda: len(handled) == 2, 20)
    finally:
        await client.close()
    assert handled == [("acme/order-1", b'{"n":1}'), ("acme/order-2", b'{"n":2}')]
    assert refused == []
