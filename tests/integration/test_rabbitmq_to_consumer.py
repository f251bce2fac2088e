"""End to end over the shared RabbitMQ: what the RabbitMQ channel publishes, the receivers'
idempotent RabbitMQ consumer takes, signature checked with the destination's secret, each
action's effect once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from outbox import Status
from receivers import IdempotencyContext, IdempotentRabbitMQConsumer, MemoryRecordStore
from sender.rabbitmq import RabbitChannel
from tests.conftest import SECRET, eventually
from tests.rabbitmq import Rabbit

from .conftest import SenderEnv
from .test_rabbitmq import KEY, register, run_until


@pytest.fixture
async def rabbitmq() -> AsyncIterator[RabbitChannel]:
    made = RabbitChannel()
    yield made
    await made.aclose()


async def test_the_channels_messages_run_once_each_behind_the_consumer(env: SenderEnv, rabbitmq: RabbitChannel,
                                                                      rabbit: Rabbit) -> None:
    queue = await rabbit.bind(KEY)
    await register(env, rabbit)
    for n in (1, 2):
        await env.enqueue(f"order-{n}", {"n": n}, destination="bus")
        intent, _ = await run_until(env, rabbitmq, f"order-{n}")
        assert intent.status is Status.DELIVERED
    handled: list[tuple[str, Any]] = []
    refused: list[Any] = []

    async def handle(message: Any, work: IdempotencyContext) -> None:
        handled.append((work.key, message.body))

    consumer = IdempotentRabbitMQConsumer(await rabbit.channel.get_queue(queue), MemoryRecordStore(), handle,
                                          secrets=SECRET, on_error=lambda message, why: refused.append(why))
    async with consumer:
        assert await eventually(lambda: len(handled) == 2, 20)
    assert handled == [("acme/order-1", b'{"n":1}'), ("acme/order-2", b'{"n":2}')]
    assert refused == []
