"""The idempotent RabbitMQ consumer against the real shared RabbitMQ (a queue and a dead-letter
exchange of each test's own, deleted after) and real record stores (memory, a SQLite file,
PostgreSQL). Messages are published as the RabbitMQ channel publishes them (``sender.envelope``).
Where a fault must land at one precise point (a consumer that dies before its ack), that one
call is replaced."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import pytest
from opentelemetry.trace import SpanKind

from receivers import IdempotentRabbitMQConsumer, MemoryRecordStore, State, tracing
from receivers.keys import identity
from receivers.messages import Refusal
from tests.conftest import SECRET, eventually
from tests.rabbitmq import URL, TcpProxy

from .brokers import Effects, FailingCompletions, Sent, require, sent, suffix
from .test_tracing import TRACEPARENT, Spans, assert_child, assert_continues_the_sender


class Rabbit:
    """A queue of the test's own whose rejected messages go to its own dead-letter queue."""

    def __init__(self, connection: aio_pika.abc.AbstractRobustConnection, name: str) -> None:
        self.connection, self.name, self.dead = connection, name, f"{name}.dead"

    async def declare(self) -> None:
        channel = await self.connection.channel()
        exchange = await channel.declare_exchange(self.dead, aio_pika.ExchangeType.FANOUT)
        dead = await channel.declare_queue(self.dead)
        await dead.bind(exchange)
        await channel.declare_queue(self.name, arguments={"x-dead-letter-exchange": self.dead})
        await channel.close()

    async def publish(self, *messages: Sent, message_id: bool = True) -> None:
        """Publish as the RabbitMQ channel does: body, headers, ``message_id`` = the key (persistent)."""
        channel = await self.connection.channel(publisher_confirms=True)
        for message in messages:
            await channel.default_exchange.publish(aio_pika.Message(
                message.body, headers=dict(message.headers), message_id=message.key if message_id else None,
                content_type="application/json", delivery_mode=aio_pika.DeliveryMode.PERSISTENT), self.name)
        await channel.close()

    async def count(self, name: str) -> int:
        """Messages ready in queue ``name`` (neither delivered nor unacknowledged)."""
        channel = await self.connection.channel()
        try:
            declared = await channel.declare_queue(name, passive=True)
            return declared.declaration_result.message_count or 0
        finally:
            await channel.close()

    async def consumer(self, store: Any, effects: Effects, *, connection: Any = None,
                       **options: Any) -> IdempotentRabbitMQConsumer:
        """A consumer on a channel of its own (of ``connection``, else the test's)."""
        channel = await (connection or self.connection).channel()
        queue = await channel.declare_queue(self.name, passive=True)
        return IdempotentRabbitMQConsumer(queue, store, effects.handle, on_error=effects.on_error, secrets=SECRET,
                                          retry_seconds=0.05, **options)


@pytest.fixture
async def rabbit() -> AsyncIterator[Rabbit]:
    require(5672, "RabbitMQ")
    connection = await aio_pika.connect_robust(URL)
    made = Rabbit(connection, f"test-consumer-{suffix()}")
    await made.declare()
    yield made
    channel = await connection.channel()
    for name in (made.name, made.dead):
        await channel.queue_delete(name)
    await channel.exchange_delete(made.dead)
    await connection.close()


def scoped(rabbit: Rabbit, key: str) -> str:
    return identity(rabbit.name, key)


async def test_each_key_runs_once_when_the_sender_published_it_twice(rabbit: Rabbit, new_store: Any) -> None:
    a, b, c = sent("a", {"invoice": 1}), sent("b", {"invoice": 2}), sent("c", {"invoice": 3})
    again = sent("a", {"invoice": 1}, fence=2)  # the sender's retry after an unknown outcome
    await rabbit.publish(a, b, again, c, b)
    effects = Effects(rabbit.name)
    async with await rabbit.consumer(new_store(), effects) as consumer:
        assert await eventually(lambda: len(effects.done) == 3, 20)
        store = consumer.store
        assert await eventually(lambda: _completed(store, [scoped(rabbit, k) for k in ("acme/a", "acme/b",
                                                                                       "acme/c")]), 20)
    assert effects.keys == ["acme/a", "acme/b", "acme/c"]
    assert effects.refused == []
    assert await rabbit.count(rabbit.name) == 0  # every copy acked: nothing handed back
    assert await rabbit.count(rabbit.dead) == 0


async def _completed(store: Any, identities: list[str]) -> bool:
    for name in identities:
        record = await store.get(name)
        if record is None or record.state is not State.COMPLETED:
            return False
    return True


async def test_a_consumer_that_dies_before_its_acks_runs_nothing_twice(rabbit: Rabbit, new_store: Any) -> None:
    messages = [sent(f"k{n}", {"n": n}) for n in range(5)]
    await rabbit.publish(*messages)
    effects = Effects(rabbit.name)
    doomed = await aio_pika.connect_robust(URL)
    first = await rabbit.consumer(new_store(), effects, connection=doomed)
    acked: list[bool] = []

    async def never(message: Any) -> None:  # the process dies once its completions are stored
        acked.append(message.redelivered)

    first._ack = never  # type: ignore[method-assign]
    await first.start()
    assert await eventually(lambda: len(acked) == 5, 20)
    await doomed.close()  # the broker requeues the five unacknowledged messages
    await first.stop()
    assert effects.keys == [m.key for m in messages]
    second = await rabbit.consumer(new_store(), effects)
    redelivered: list[bool] = []
    real_ack = second._ack

    async def ack(message: Any) -> None:
        redelivered.append(message.redelivered)
        await real_ack(message)

    second._ack = ack  # type: ignore[method-assign]
    async with second:
        assert await eventually(lambda: len(redelivered) == 5, 20)
    assert redelivered == [True] * 5
    assert effects.keys == [m.key for m in messages]  # the new consumer skipped every one
    assert await rabbit.count(rabbit.name) == 0


async def test_refused_messages_are_dead_lettered_and_never_run_nor_claim_their_key(
        rabbit: Rabbit, new_store: Any) -> None:
    forged = sent("x", {"amount": 1}, signing=("whsec_" + "Wg" * 22,))  # signed, not with the destination's secret
    tampered = sent("y", {"amount": 2})  # signed as sent, but its payload-digest names another payload
    other = sent("y", {"amount": 200}).headers["payload-digest"]
    tampered = Sent(tampered.key, tampered.body, {**tampered.headers, "payload-digest": other})
    keyless = sent("z", {"amount": 3})
    keyless = Sent(keyless.key, keyless.body, {k: v for k, v in keyless.headers.items() if k != "idempotency-key"})
    genuine = sent("x", {"amount": 1})
    await rabbit.publish(forged, tampered, keyless)
    effects = Effects(rabbit.name)
    async with await rabbit.consumer(new_store(), effects) as consumer:
        assert await eventually(lambda: len(effects.refused) == 3, 20)
        assert await eventually(lambda: _count_is(rabbit, rabbit.dead, 3), 20)
        assert await consumer.store.get(scoped(rabbit, "acme/x")) is None  # the forgery claimed nothing
        await rabbit.publish(genuine)
        assert await eventually(lambda: effects.keys == ["acme/x"], 20)
    assert [r.reason for r in effects.refused] == [Refusal.INVALID_SIGNATURE, Refusal.DIGEST_MISMATCH,
                                                   Refusal.MISSING_KEY]
    assert await rabbit.count(rabbit.dead) == 3


async def _count_is(rabbit: Rabbit, name: str, count: int) -> bool:
    return await rabbit.count(name) == count


async def test_a_failing_handler_is_retried_then_runs_once(rabbit: Rabbit, new_store: Any) -> None:
    message, other = sent("flaky", {"n": 1}), sent("steady", {"n": 2})
    await rabbit.publish(message, other)
    effects = Effects(rabbit.name, fail={"acme/flaky": 2})
    async with await rabbit.consumer(new_store(), effects):
        assert await eventually(lambda: sorted(effects.keys) == ["acme/flaky", "acme/steady"], 20)
    assert effects.calls == {"acme/flaky": 3, "acme/steady": 1}
    assert await rabbit.count(rabbit.name) == 0 and await rabbit.count(rabbit.dead) == 0


async def test_a_message_is_acked_only_once_its_completion_is_durable(rabbit: Rabbit, new_store: Any) -> None:
    message = sent("k", {"n": 1})
    await rabbit.publish(message)
    effects = Effects(rabbit.name)
    events: list[str] = []
    consumer = await rabbit.consumer(FailingCompletions(new_store(), 2, events), effects)
    real_ack = consumer._ack

    async def ack(delivered: Any) -> None:
        events.append("acked")
        await real_ack(delivered)

    consumer._ack = ack  # type: ignore[method-assign]
    async with consumer:
        assert await eventually(lambda: "acked" in events, 20)
    assert events == ["completion failed", "completion failed", f"completed {scoped(rabbit, message.key)}", "acked"]
    assert effects.calls == {message.key: 1}
    assert await rabbit.count(rabbit.name) == 0


async def test_a_key_in_progress_elsewhere_waits_for_it(rabbit: Rabbit) -> None:
    store = MemoryRecordStore()
    message = sent("busy", {"n": 1})
    effects = Effects(rabbit.name)
    consumer = await rabbit.consumer(store, effects)
    async with consumer:
        now = consumer.clock()
        held = await store.claim(scoped(rabbit, message.key), message.headers["payload-digest"], fence=None, now=now,
                                 lease_until=now + consumer.lease, expires_at=now + consumer.retention)
        await rabbit.publish(message)
        assert await eventually(lambda: consumer._failures.get(message.key, 0) >= 2, 20)  # asked, requeued, asked
        assert effects.calls == {}
        await store.release(scoped(rabbit, message.key), held.epoch)  # type: ignore[union-attr]
        assert await eventually(lambda: effects.keys == [message.key], 20)
    assert await rabbit.count(rabbit.name) == 0


async def test_stop_hands_back_what_was_fetched_and_not_started(rabbit: Rabbit, new_store: Any) -> None:
    messages = [sent(f"k{n}", {"n": n}) for n in range(3)]
    await rabbit.publish(*messages)
    effects = Effects(rabbit.name)
    started = asyncio.Event()
    go = asyncio.Event()

    async def slow(message: Any, context: Any) -> None:
        started.set()
        await go.wait()
        await effects.handle(message, context)

    consumer = await rabbit.consumer(new_store(), effects)
    consumer.handler = slow
    await consumer.start()
    await asyncio.wait_for(started.wait(), 20)
    stopping = asyncio.ensure_future(consumer.stop())
    go.set()
    await stopping
    assert effects.keys == ["acme/k0"]  # the one in flight finished; the other two went back
    assert await eventually(lambda: _count_is(rabbit, rabbit.name, 2), 20)
    async with await rabbit.consumer(new_store(), effects):
        assert await eventually(lambda: len(effects.keys) == 3, 20)
    assert sorted(effects.keys) == [m.key for m in messages]


async def test_the_options_are_checked() -> None:
    class Queue:
        name = "q"

    with pytest.raises(ValueError, match="prefetch"):
        IdempotentRabbitMQConsumer(Queue(), MemoryRecordStore(), Effects("q").handle, prefetch=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="whsec_"):
        IdempotentRabbitMQConsumer(Queue(), MemoryRecordStore(), Effects("q").handle, secrets="hunter2")  # type: ignore[arg-type]


async def test_each_message_is_a_consumer_span_in_the_senders_trace(rabbit: Rabbit) -> None:
    spans = Spans()  # a provider of the test's own, its finished spans kept
    message = sent("traced", {"n": 1})
    message = Sent(message.key, message.body, {**message.headers, "traceparent": TRACEPARENT})
    await rabbit.publish(message, message)
    effects = Effects(rabbit.name)

    async def handle(delivered: Any, context: Any) -> None:
        with spans.app_tracer.start_as_current_span("book"):
            await effects.handle(delivered, context)

    consumer = await rabbit.consumer(MemoryRecordStore(), effects, tracer_provider=spans.provider)
    consumer.handler = handle
    async with consumer:
        first, duplicate = await spans.until(2, SpanKind.CONSUMER)
    (book,) = spans.named("book")
    assert_child(book, first)
    for span in (first, duplicate):
        assert_continues_the_sender(span)
        assert span.name == f"process {rabbit.name}"
        assert span.attributes is not None and span.attributes["messaging.system"] == "rabbitmq"
        assert span.attributes[tracing.IDEMPOTENCY_KEY] == message.key
    assert first.attributes is not None and duplicate.attributes is not None
    assert (first.attributes[tracing.OUTCOME], duplicate.attributes[tracing.OUTCOME]) == ("claimed", "replayed")


async def test_stop_claims_nothing_more_of_the_batch_in_flight(rabbit: Rabbit) -> None:
    """A batch naming a key twice is settled in two runs; stopping during the first, the second
    goes back to the broker without a claim transaction."""
    a, b, c = sent("a", {"n": 1}), sent("b", {"n": 2}), sent("c", {"n": 3})
    store = MemoryRecordStore()
    claims: list[int] = []
    claim_many = store.claim_many

    async def counted(requests: Any, **options: Any) -> Any:
        claims.append(len(requests))
        return await claim_many(requests, **options)

    store.claim_many = counted  # type: ignore[method-assign]
    effects = Effects(rabbit.name)
    started, go = asyncio.Event(), asyncio.Event()

    async def slow(message: Any, context: Any) -> None:
        started.set()
        await go.wait()
        await effects.handle(message, context)

    consumer = await rabbit.consumer(store, effects, max_batch=4)
    consumer.handler = slow
    await rabbit.publish(a, b, a, c)  # there before the consumer starts: one batch of four
    await consumer.start()
    await asyncio.wait_for(started.wait(), 20)
    stopping = asyncio.ensure_future(consumer.stop())
    go.set()
    await stopping
    assert effects.keys == ["acme/a"]
    assert len(claims) == 1  # the first run's claims only
    assert await eventually(lambda: _count_is(rabbit, rabbit.name, 3), 20)


async def test_a_dropped_connection_mid_stream_loses_nothing_and_runs_nothing_twice(
        rabbit: Rabbit, new_store: Any) -> None:
    """Through a proxy in front of the shared broker, whose connections the test drops while a
    handler runs (the shared server itself is never touched)."""
    messages = [sent(f"k{n}", {"n": n}) for n in range(30)]
    await rabbit.publish(*messages)
    effects = Effects(rabbit.name)
    dropped = asyncio.Event()

    async def handle(message: Any, context: Any) -> None:
        if context.key == "acme/k10":  # the connection drops while this one's handler runs
            await dropped.wait()
        await effects.handle(message, context)

    async with TcpProxy() as proxy:
        connection = await aio_pika.connect_robust(f"amqp://guest:guest@127.0.0.1:{proxy.port}/",
                                                   reconnect_interval=0.2)
        try:
            consumer = await rabbit.consumer(new_store(), effects, connection=connection, prefetch=5)
            consumer.handler = handle
            async with consumer:
                assert await eventually(lambda: len(effects.done) == 10, 20)
                await proxy.drop()  # unacknowledged deliveries go back to the queue
                dropped.set()
                await proxy.accept()  # and the robust connection comes back
                assert await eventually(lambda: len(effects.done) == 30 and _drained(rabbit), 30), effects.keys
        finally:
            await connection.close()
    assert sorted(effects.keys) == sorted(m.key for m in messages)
    assert set(effects.calls.values()) == {1}


async def _drained(rabbit: Rabbit) -> bool:
    return await rabbit.count(rabbit.name) == 0
