"""Idempotent RabbitMQ and NATS JetStream consumers' throughput, as ratios to a bare consume-and-ack
loop from the same run, on the shared servers (RabbitMQ 127.0.0.1:5672, NATS 127.0.0.1:4222).

N messages, shaped as the broker channels publish them (``sender.envelope``: the canonical JSON
payload, a unique ``idempotency-key``, its ``payload-digest``, attempt id and fence headers), are
published once per broker: to a fanout exchange bound to one queue per case and round (RabbitMQ),
to a stream read by one durable pull consumer per case and round (NATS). In interleaved rounds:

1. bare: the broker's own loop at the same window (RabbitMQ ``basic.consume`` with prefetch
   BATCH and an ack per message; NATS ``fetch(BATCH)`` and an ack per message), a trivial handler;
2. ``IdempotentRabbitMQConsumer`` / ``IdempotentJetStreamConsumer`` with the same handler and
   window over the memory record store (the engine's cost, not a database's).

A case's time runs from its start to the ack of its N-th message (closing it is left out). Every case must hand each
message to its handler exactly once. A ratio is the median of the per-round ratios to that
round's bare figure; nothing asserts on timing. The queues, exchange and stream are deleted after.

    python tests/bench/bench_queue_consumers.py [--n N] [--rounds R] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for tests.receivers.brokers

import aio_pika
import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from receivers import IdempotencyContext, IdempotentJetStreamConsumer, IdempotentRabbitMQConsumer, MemoryRecordStore
from tests.receivers.brokers import sent

AMQP = "amqp://guest:guest@127.0.0.1:5672/"
NATS = "nats://127.0.0.1:4222"
BATCH = 100
NOTE = "x" * 60


class BenchError(Exception):
    """A measurement that is not valid (a message handled twice or never)."""


class Counted:
    """Counts handled and acknowledged messages; ``done`` once ``n`` are acknowledged."""

    def __init__(self, n: int) -> None:
        self.n, self.handled, self.acked = n, 0, 0
        self.done = asyncio.Event()
        self.ended = 0.0

    async def handle(self, message: Any, context: IdempotencyContext | None = None) -> None:
        self.handled += 1

    def ack(self) -> None:
        self.acked += 1
        if self.acked == self.n:
            self.ended = time.perf_counter()
            self.done.set()


def counting(consumer: Any, counted: Counted) -> None:
    """Count the idempotent consumer's acks (it only observes the call)."""
    ack = consumer._ack

    async def counted_ack(message: Any) -> None:
        await ack(message)
        counted.ack()

    consumer._ack = counted_ack


async def timed(run: Callable[[Counted], Awaitable[None]], n: int) -> float:
    counted = Counted(n)
    began = time.perf_counter()
    await run(counted)
    elapsed = counted.ended - began  # to the N-th ack: closing the consumer is left out
    if counted.handled != n:
        raise BenchError(f"{counted.handled} messages handled, not {n}")
    return n / elapsed


# -- RabbitMQ ----------------------------------------------------------------------------------

async def rabbitmq(n: int, rounds: int) -> list[tuple[float, float]]:
    connection = await aio_pika.connect_robust(AMQP)
    channel = await connection.channel(publisher_confirms=True)
    name = f"bench-consumers-{uuid.uuid4().hex[:8]}"
    exchange = await channel.declare_exchange(name, aio_pika.ExchangeType.FANOUT, auto_delete=True)
    queues = [f"{name}-{r}-{case}" for r in range(rounds) for case in ("bare", "idempotent")]
    for queue in queues:
        await (await channel.declare_queue(queue)).bind(exchange)
    try:
        for start in range(0, n, 500):
            messages = [_message(i) for i in range(start, min(n, start + 500))]
            await asyncio.gather(*(exchange.publish(aio_pika.Message(m.body, headers=dict(m.headers), message_id=m.key),
                                                    "") for m in messages))

        async def bare(queue_name: str, counted: Counted) -> None:
            consuming = await connection.channel()
            await consuming.set_qos(prefetch_count=BATCH)
            queue = await consuming.declare_queue(queue_name, passive=True)

            async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                await counted.handle(message)
                await message.ack()
                counted.ack()

            await queue.consume(on_message)
            await counted.done.wait()
            await consuming.close()

        async def idempotent(queue_name: str, counted: Counted) -> None:
            consuming = await connection.channel()
            queue = await consuming.declare_queue(queue_name, passive=True)
            consumer = IdempotentRabbitMQConsumer(queue, MemoryRecordStore(), counted.handle, prefetch=BATCH)
            counting(consumer, counted)
            async with consumer:
                await counted.done.wait()
            await consuming.close()

        results = []
        for r in range(rounds):
            base = await timed(lambda c, r=r: bare(f"{name}-{r}-bare", c), n)
            mine = await timed(lambda c, r=r: idempotent(f"{name}-{r}-idempotent", c), n)
            print(f"round {r + 1}: RabbitMQ bare {base:,.0f}/s, idempotent {mine:,.0f}/s", flush=True)
            results.append((base, mine))
        return results
    finally:
        for queue in queues:
            await channel.queue_delete(queue)
        await channel.exchange_delete(name)
        await connection.close()


def _message(i: int) -> Any:
    return sent(f"order-{i:08d}", {"order": i, "note": NOTE}, signing=())


# -- NATS JetStream ----------------------------------------------------------------------------

async def jetstream(n: int, rounds: int) -> list[tuple[float, float]]:
    connection = await nats.connect(NATS)
    js = connection.jetstream()
    stream = f"bench-consumers-{uuid.uuid4().hex[:8]}"
    await js.add_stream(name=stream, subjects=[f"{stream}.>"])
    try:
        for start in range(0, n, 500):
            await asyncio.gather(*(js.publish(f"{stream}.orders", m.body, headers=m.headers)
                                   for m in (_message(i) for i in range(start, min(n, start + 500)))))

        async def durable(label: str) -> str:
            await js.add_consumer(stream, ConsumerConfig(durable_name=label, ack_policy=AckPolicy.EXPLICIT,
                                                         deliver_policy=DeliverPolicy.ALL, ack_wait=60))
            return label

        async def bare(label: str, counted: Counted) -> None:
            subscription = await js.pull_subscribe_bind(await durable(label), stream)
            while not counted.done.is_set():
                try:
                    messages = await subscription.fetch(BATCH, timeout=1.0)
                except nats.errors.TimeoutError:
                    continue
                for message in messages:
                    await counted.handle(message)
                    await message.ack()
                    counted.ack()
            await subscription.unsubscribe()

        async def idempotent(label: str, counted: Counted) -> None:
            consumer = IdempotentJetStreamConsumer(js, stream, await durable(label), MemoryRecordStore(),
                                                   counted.handle, max_batch=BATCH)
            counting(consumer, counted)
            async with consumer:
                await counted.done.wait()

        results = []
        for r in range(rounds):
            base = await timed(lambda c, r=r: bare(f"bare-{r}", c), n)
            mine = await timed(lambda c, r=r: idempotent(f"idempotent-{r}", c), n)
            print(f"round {r + 1}: NATS bare {base:,.0f}/s, idempotent {mine:,.0f}/s", flush=True)
            results.append((base, mine))
        return results
    finally:
        await js.delete_stream(stream)
        await connection.close()


def report(broker: str, results: list[tuple[float, float]]) -> None:
    ratio = statistics.median(mine / base for base, mine in results)
    print(f"{broker:9} bare {statistics.median(b for b, _ in results):>9,.0f}/s   idempotent (memory) "
          f"{statistics.median(m for _, m in results):>9,.0f}/s   ratio {ratio:.2f}x")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="3,000 messages, one round")
    args = parser.parse_args()
    n, rounds = (3_000, 1) if args.quick else (args.n, args.rounds)
    import logging

    logging.getLogger("receivers.messages").setLevel(logging.ERROR)  # no secrets here, on purpose
    rabbit, jet = await rabbitmq(n, rounds), await jetstream(n, rounds)
    print(f"\nidempotent queue consumers vs bare loops (N={n:,}; median of {rounds} round(s); window {BATCH})")
    report("RabbitMQ", rabbit)
    report("NATS", jet)


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except BenchError as exc:
        sys.exit(f"invalid measurement: {exc}")
