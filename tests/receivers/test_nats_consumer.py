"""The idempotent NATS JetStream consumer against the real shared NATS server (a stream and a
durable pull consumer of each test's own, deleted after) and real record stores (memory, a SQLite
file, PostgreSQL). Messages are published as the NATS channel publishes them (``sender.envelope``
headers, ``Nats-Msg-Id`` = the key). Where a fault must land at one precise point (a consumer that
dies before its ack), that one call is replaced."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from opentelemetry.trace import SpanKind

from receivers import IdempotentJetStreamConsumer, MemoryRecordStore, tracing
from receivers.keys import identity
from receivers.messages import Refusal
from tests.conftest import SECRET, eventually
from tests.nats import SHARED as URL
from tests.nats import NatsServer

from .brokers import Effects, FailingCompletions, Sent, require, sent, suffix
from .test_tracing import TRACEPARENT, Spans, assert_child, assert_continues_the_sender


class Jet:
    """A stream of the test's own with one durable pull consumer (explicit acks)."""

    def __init__(self, connection: Any, name: str) -> None:
        self.connection, self.js = connection, connection.jetstream()
        self.stream, self.subject, self.durable = name, f"{name}.orders", f"{name}-billing"

    async def declare(self, ack_wait: float = 30) -> None:
        await self.js.add_stream(name=self.stream, subjects=[f"{self.stream}.>"])
        await self.js.add_consumer(self.stream, ConsumerConfig(
            durable_name=self.durable, ack_policy=AckPolicy.EXPLICIT, ack_wait=ack_wait,
            deliver_policy=DeliverPolicy.ALL, filter_subject=self.subject))

    async def publish(self, *messages: Sent, message_id: bool = True) -> None:
        """Publish as the NATS channel does; without ``message_id`` a copy is kept, as one published
        again after the stream's duplicate window is."""
        for message in messages:
            extra = {"Nats-Msg-Id": message.key} if message_id else {}
            await self.js.publish(self.subject, message.body, headers={**message.headers, **extra})

    async def unsettled(self) -> int:
        """Messages the durable consumer has not had acknowledged or terminated yet."""
        info = await self.js.consumer_info(self.stream, self.durable)
        return int(info.num_pending or 0) + int(info.num_ack_pending or 0)

    def consumer(self, store: Any, effects: Effects, *, js: Any = None, **options: Any) -> IdempotentJetStreamConsumer:
        return IdempotentJetStreamConsumer(js or self.js, self.stream, self.durable, store, effects.handle,
                                           on_error=effects.on_error, secrets=SECRET, retry_seconds=0.05, **options)


async def _jet(ack_wait: float = 30) -> AsyncIterator[Jet]:
    require(4222, "NATS")
    connection = await nats.connect(URL)
    made = Jet(connection, f"test-consumer-{suffix()}")
    await made.declare(ack_wait)
    yield made
    await made.js.delete_stream(made.stream)
    await connection.close()


@pytest.fixture
async def jet() -> AsyncIterator[Jet]:
    async for made in _jet():
        yield made


@pytest.fixture
async def quick_jet() -> AsyncIterator[Jet]:
    """A consumer whose unacknowledged messages are delivered again after two seconds."""
    async for made in _jet(ack_wait=2):
        yield made


async def _published(jet: Jet, message: Sent) -> bool:
    """Publish ``message`` (its ``Nats-Msg-Id`` makes a retried publish one message); False when
    JetStream does not answer yet."""
    try:
        await jet.publish(message)
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
        return False
    return True


def scoped(jet: Jet, key: str) -> str:
    return identity(jet.durable, key)


async def _unsettled_is(jet: Jet, count: int) -> bool:
    return await jet.unsettled() == count


async def test_each_key_runs_once_when_the_sender_published_it_twice(jet: Jet, new_store: Any) -> None:
    a, b, c = sent("a", {"invoice": 1}), sent("b", {"invoice": 2}), sent("c", {"invoice": 3})
    again = sent("a", {"invoice": 1}, fence=2)  # the sender's retry after an unknown outcome
    await jet.publish(a, b)
    await jet.publish(again, c, b, message_id=False)
    effects = Effects(jet.durable)
    async with jet.consumer(new_store(), effects):
        assert await eventually(lambda: _unsettled_is(jet, 0), 20)  # all five acknowledged
    assert effects.keys == ["acme/a", "acme/b", "acme/c"]
    assert effects.refused == []


async def test_a_consumer_that_dies_before_its_acks_runs_nothing_twice(quick_jet: Jet, new_store: Any) -> None:
    jet = quick_jet
    messages = [sent(f"k{n}", {"n": n}) for n in range(5)]
    await jet.publish(*messages)
    effects = Effects(jet.durable)
    doomed = await nats.connect(URL)
    first = jet.consumer(new_store(), effects, js=doomed.jetstream())
    stored: list[object] = []

    async def never(message: Any) -> None:  # the process dies once its completions are stored
        stored.append(message)

    first._ack = never  # type: ignore[method-assign]
    await first.start()
    assert await eventually(lambda: len(stored) == 5, 20)
    await first.stop()
    await doomed.close()
    assert effects.keys == [m.key for m in messages]
    second = jet.consumer(new_store(), effects)
    deliveries: list[int] = []
    real_ack = second._ack

    async def ack(message: Any) -> None:
        deliveries.append(message.metadata.num_delivered)
        await real_ack(message)

    second._ack = ack  # type: ignore[method-assign]
    async with second:
        assert await eventually(lambda: len(deliveries) == 5, 20)  # after the ack wait
        assert await eventually(lambda: _unsettled_is(jet, 0), 20)
    assert deliveries == [2] * 5
    assert effects.keys == [m.key for m in messages]  # the new consumer skipped every one


async def test_refused_messages_are_terminated_and_never_run_nor_claim_their_key(jet: Jet, new_store: Any) -> None:
    forged = sent("x", {"amount": 1}, signing=("whsec_" + "Wg" * 22,))  # signed, not with the destination's secret
    tampered = sent("y", {"amount": 2})  # signed as sent, but its payload-digest names another payload
    other = sent("y", {"amount": 200}).headers["payload-digest"]
    tampered = Sent(tampered.key, tampered.body, {**tampered.headers, "payload-digest": other})
    keyless = sent("z", {"amount": 3})
    keyless = Sent(keyless.key, keyless.body, {k: v for k, v in keyless.headers.items() if k != "idempotency-key"})
    await jet.publish(forged, tampered, keyless)
    effects = Effects(jet.durable)
    async with jet.consumer(new_store(), effects) as consumer:
        assert await eventually(lambda: len(effects.refused) == 3, 20)
        assert await eventually(lambda: _unsettled_is(jet, 0), 20)  # terminated: never delivered again
        assert await consumer.store.get(scoped(jet, "acme/x")) is None  # the forgery claimed nothing
        await jet.publish(sent("x", {"amount": 1}), message_id=False)  # the genuine one
        assert await eventually(lambda: effects.keys == ["acme/x"], 20)
    assert [r.reason for r in effects.refused] == [Refusal.INVALID_SIGNATURE, Refusal.DIGEST_MISMATCH,
                                                   Refusal.MISSING_KEY]


async def test_a_failing_handler_is_retried_then_runs_once(jet: Jet, new_store: Any) -> None:
    await jet.publish(sent("flaky", {"n": 1}), sent("steady", {"n": 2}))
    effects = Effects(jet.durable, fail={"acme/flaky": 2})
    async with jet.consumer(new_store(), effects):
        assert await eventually(lambda: sorted(effects.keys) == ["acme/flaky", "acme/steady"], 20)
        assert await eventually(lambda: _unsettled_is(jet, 0), 20)
    assert effects.calls == {"acme/flaky": 3, "acme/steady": 1}


async def test_a_message_is_acked_only_once_its_completion_is_durable(jet: Jet, new_store: Any) -> None:
    message = sent("k", {"n": 1})
    await jet.publish(message)
    effects = Effects(jet.durable)
    events: list[str] = []
    consumer = jet.consumer(FailingCompletions(new_store(), 2, events), effects)
    real_ack = consumer._ack

    async def ack(delivered: Any) -> None:
        events.append("acked")
        await real_ack(delivered)

    consumer._ack = ack  # type: ignore[method-assign]
    async with consumer:
        assert await eventually(lambda: "acked" in events, 20)
        assert await eventually(lambda: _unsettled_is(jet, 0), 20)
    assert events == ["completion failed", "completion failed", f"completed {scoped(jet, message.key)}", "acked"]
    assert effects.calls == {message.key: 1}


async def test_a_key_in_progress_elsewhere_waits_for_it(jet: Jet) -> None:
    store = MemoryRecordStore()
    message = sent("busy", {"n": 1})
    effects = Effects(jet.durable)
    consumer = jet.consumer(store, effects)
    async with consumer:
        now = consumer.clock()
        held = await store.claim(scoped(jet, message.key), message.headers["payload-digest"], fence=None, now=now,
                                 lease_until=now + consumer.lease, expires_at=now + consumer.retention)
        await jet.publish(message)
        assert await eventually(lambda: consumer._failures.get(message.key, 0) >= 2, 20)  # asked, nak'd, asked
        assert effects.calls == {}
        await store.release(scoped(jet, message.key), held.epoch)  # type: ignore[union-attr]
        assert await eventually(lambda: effects.keys == [message.key], 20)
        assert await eventually(lambda: _unsettled_is(jet, 0), 20)


async def test_stop_hands_back_what_was_fetched_and_not_started(jet: Jet, new_store: Any) -> None:
    messages = [sent(f"k{n}", {"n": n}) for n in range(3)]
    await jet.publish(*messages)
    effects = Effects(jet.durable)
    started, go = asyncio.Event(), asyncio.Event()

    async def slow(message: Any, context: Any) -> None:
        started.set()
        await go.wait()
        await effects.handle(message, context)

    consumer = jet.consumer(new_store(), effects)
    consumer.handler = slow
    await consumer.start()
    await asyncio.wait_for(started.wait(), 20)
    stopping = asyncio.ensure_future(consumer.stop())
    go.set()
    await stopping
    assert effects.keys == ["acme/k0"]  # the one in flight finished; the other two went back at once (nak)
    async with jet.consumer(new_store(), effects):
        assert await eventually(lambda: len(effects.keys) == 3, 20)  # well before the 30 s ack wait
    assert sorted(effects.keys) == [m.key for m in messages]


async def test_the_durable_consumer_must_ack_explicitly(jet: Jet) -> None:
    await jet.js.add_consumer(jet.stream, ConsumerConfig(durable_name="no-acks", ack_policy=AckPolicy.NONE))
    consumer = IdempotentJetStreamConsumer(jet.js, jet.stream, "no-acks", MemoryRecordStore(),
                                           Effects("no-acks").handle, secrets=SECRET)
    with pytest.raises(ValueError, match="ack_policy explicit"):
        await consumer.start()


async def test_each_message_is_a_consumer_span_in_the_senders_trace(jet: Jet) -> None:
    spans = Spans()  # a provider of the test's own, its finished spans kept
    message = sent("traced", {"n": 1})
    message = Sent(message.key, message.body, {**message.headers, "traceparent": TRACEPARENT})
    await jet.publish(message, message, message_id=False)
    effects = Effects(jet.durable)

    async def handle(delivered: Any, context: Any) -> None:
        with spans.app_tracer.start_as_current_span("book"):
            await effects.handle(delivered, context)

    consumer = jet.consumer(MemoryRecordStore(), effects, tracer_provider=spans.provider)
    consumer.handler = handle
    async with consumer:
        first, duplicate = await spans.until(2, SpanKind.CONSUMER)
    (book,) = spans.named("book")
    assert_child(book, first)
    for span in (first, duplicate):
        assert_continues_the_sender(span)
        assert span.name == f"process {jet.subject}"
        assert span.attributes is not None and span.attributes["messaging.system"] == "nats"
        assert span.attributes[tracing.IDEMPOTENCY_KEY] == message.key
    assert first.attributes is not None and duplicate.attributes is not None
    assert (first.attributes[tracing.OUTCOME], duplicate.attributes[tracing.OUTCOME]) == ("claimed", "replayed")
    assert first.attributes["messaging.nats.stream_sequence"] == 1


async def test_a_server_restart_mid_stream_loses_nothing_and_runs_nothing_twice(tmp_path: Path) -> None:
    """A private nats-server, killed while the consumer works and started again on the same
    store: every message published before and after is handled, each once."""
    server = NatsServer(tmp_path).start()
    connection = None
    try:
        connection = await nats.connect(server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
        jet = Jet(connection, f"restart-{suffix()}")
        await jet.declare(ack_wait=2)
        before, after = ([sent(f"k{n}", {"n": n}) for n in range(start, start + 20)] for start in (0, 20))
        await jet.publish(*before)
        effects = Effects(jet.durable)
        async with jet.consumer(MemoryRecordStore(), effects, max_batch=5):
            assert await eventually(lambda: len(effects.done) >= 5, 20)
            server.stop()
            server.start()
            assert await eventually(lambda: connection.is_connected, 30)
            for message in after:  # JetStream answers once it has recovered its streams
                assert await eventually(lambda message=message: _published(jet, message), 30)
            assert await eventually(lambda: len(effects.done) == 40, 30), effects.keys
            assert await eventually(lambda: _unsettled_is(jet, 0), 30)
        assert sorted(effects.keys) == sorted(m.key for m in before + after)
        assert set(effects.calls.values()) == {1}
    finally:
        if connection is not None:
            await connection.close()
        server.stop()
