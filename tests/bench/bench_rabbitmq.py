"""Durable RabbitMQ delivery throughput, as a ratio to a bare aio-pika publisher-confirm loop from
the same run.

Every delivery is recorded before and after it is made (an ``attempt_started`` write, then the
outcome, each committed to SQLite) and the message is published persistent, ``mandatory``, and
confirmed by the broker. Absolute rates say more about the machine than the library, so the
machine's RabbitMQ (shared: a queue of the run's own per case, deleted after) is first driven by a
bare aio-pika loop at the same concurrency (the broker's ceiling here), and the worker's rate is
reported as a ratio to it:

1. baseline: one aio-pika connection and channel with publisher confirms, CONCURRENCY tasks each
   publishing a persistent, mandatory message (the intents' ~100-byte JSON payload, a message id,
   the channel's four headers) and awaiting its confirm, N timed messages after untimed warm-up
   ones; the queue must then hold exactly the warm-up and N messages;
2. the channel alone: ``RabbitChannel.send`` at the same concurrency, no store (the channel's
   own ceiling), N timed messages after warm-up ones, the same check;
3. the outbox: N intents for a rabbitmq destination enqueued into a fresh SQLite file (untimed),
   then ``sender.Worker`` with ``worker_concurrency=CONCURRENCY``, timed until every intent is
   delivered (the worker connects within the timed run, as a fresh worker would); the store must
   hold N delivered intents and N attempts, and the queue exactly N messages.

Printed per round and as medians: messages per second, the ratios, and this process's CPU time per
message. Nothing here asserts on timing; the exit status is non-zero only when a measurement is
invalid (a failed publish, an undelivered intent, a wrong message count).

    python tests/bench/bench_rabbitmq.py [--n N] [--rounds R] [--concurrency C] [--quick]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aio_pika
import harness
from bench_delivery import SECRET, Cpu, check_delivered, fill, own_cpu, payload, time_worker
from harness import BenchError

URL = "amqp://guest:guest@127.0.0.1:5672/"
CONCURRENCY = 64
DESTINATION = "bus"
SCOPE = "acme"
WARMUP_PER_SLOT = 4
TIMEOUT_SECONDS = 10.0


class Broker:
    """The shared broker as ``time_worker`` watches it: only this process's CPU (the broker's
    serves other work beside this run)."""

    def cpu(self) -> tuple[float, float | None]:
        return own_cpu(), None

    def alive(self) -> None:
        pass


async def fresh_queue(channel: aio_pika.abc.AbstractChannel) -> str:
    name = f"outbox-bench-{secrets.token_hex(4)}"
    await channel.declare_queue(name, durable=True)
    return name


async def held(channel: aio_pika.abc.AbstractChannel, queue: str) -> int:
    declared = await channel.declare_queue(queue, passive=True)
    count: int = declared.declaration_result.message_count
    return count


async def timed(concurrency: int, n: int, one: Callable[[int], Awaitable[bool]]) -> tuple[float, Cpu]:
    """``one(i)`` for WARMUP_PER_SLOT * concurrency untimed messages, then n timed ones, from
    ``concurrency`` tasks: (messages per second, CPU per message). BenchError if any failed."""
    warmup = WARMUP_PER_SLOT * concurrency
    await harness.fan_out(concurrency, 0, warmup, one)
    before = own_cpu()
    ok, seconds = await harness.fan_out(concurrency, warmup, warmup + n, one)
    used = Cpu.measure((before, None), (own_cpu(), None), n)
    if ok != n:
        raise BenchError(f"{n - ok} of {n} timed messages failed")
    return n / seconds, used


async def bare(control: aio_pika.abc.AbstractChannel, n: int, concurrency: int) -> tuple[float, Cpu]:
    """The bare aio-pika loop: messages per second, CPU per message."""
    queue = await fresh_queue(control)
    connection = await aio_pika.connect(URL)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        exchange = channel.default_exchange

        async def one(i: int) -> bool:
            await exchange.publish(aio_pika.Message(
                value(i), content_type="application/json", delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                message_id=f"{SCOPE}/{uuid.uuid4()}", timestamp=datetime.now(UTC),
                headers={"idempotency-key": f"{SCOPE}/{i}", "payload-digest": "sha256:" + "0" * 64,
                         "outbox-attempt-id": str(uuid.uuid4()), "outbox-fence": "1"}),
                routing_key=queue, mandatory=True, timeout=TIMEOUT_SECONDS)
            return True

        rate, used = await timed(concurrency, n, one)
        total = WARMUP_PER_SLOT * concurrency + n
        if (found := await held(control, queue)) != total:
            raise BenchError(f"bare loop: the queue holds {found} messages, expected {total}")
        return rate, used
    finally:
        await connection.close()
        await control.queue_delete(queue)


def value(i: int) -> bytes:
    import rfc8785

    return rfc8785.dumps(payload(i))


def spec(queue: str) -> Any:
    from sender.rabbitmq import RabbitSpec

    return RabbitSpec.model_validate({
        "channel": "rabbitmq", "url": "amqp://guest@127.0.0.1:5672/", "password": "guest", "allow_insecure": True,
        "allow_private_network": True, "exchange": "", "routing_key": queue, "timeout_seconds": TIMEOUT_SECONDS,
        "secret": SECRET})


async def channel_alone(control: aio_pika.abc.AbstractChannel, n: int, concurrency: int) -> tuple[float, Cpu]:
    """``RabbitChannel.send`` with no store around it, ``concurrency`` sends in flight on one
    destination's channel: messages per second, CPU per message."""
    from outbox import Destination, Intent, OnUnknown, Status
    from outbox.digest import payload_digest
    from outbox.ids import uuid7
    from sender.rabbitmq import RabbitChannel

    queue = await fresh_queue(control)
    now = datetime.now(UTC)
    destination = Destination(
        id=DESTINATION, channel="rabbitmq", settings=spec(queue).settings(), secrets=(SECRET, "guest"),
        idempotent=False, retention_seconds=86_400, on_unknown=OnUnknown.ALWAYS, timeout_seconds=TIMEOUT_SECONDS,
        requires_approval=False, allow_private_network=True, disabled=False, created_at=now, updated_at=now)
    total = WARMUP_PER_SLOT * concurrency + n
    intents = [Intent(seq=i + 1, action_id=uuid7(), scope=SCOPE, destination=DESTINATION, channel="rabbitmq",
                      payload_json=value(i).decode(), payload_digest=payload_digest(payload(i)),
                      status=Status.LEASED, attempts=0, max_attempts=10, next_attempt_at=now, not_before=None,
                      expires_at=None, lease_owner="bench", lease_expires_at=now, fence=1, created_at=now,
                      updated_at=now, last_error=None) for i in range(total)]
    channel = RabbitChannel()
    one, failures = harness.channel_sends(channel, destination, intents)
    try:
        rate, used = await timed(concurrency, n, one)
        if (found := await held(control, queue)) != total:
            raise BenchError(f"channel alone: the queue holds {found} messages, expected {total}")
        return rate, used
    except BenchError as exc:
        raise BenchError(f"{exc}: {dict(failures)}") from None
    finally:
        await channel.aclose()
        await control.queue_delete(queue)


async def outbox(control: aio_pika.abc.AbstractChannel, workdir: Path, n: int, concurrency: int) -> tuple[float, Cpu]:
    """The worker: deliveries per second, CPU per delivery."""
    from outbox import Outbox, Settings
    from sender import Worker

    queue = await fresh_queue(control)
    box = await Outbox.open(f"sqlite:///{workdir / f'{queue}.db'}",
                            settings=Settings(authority="allow-all", worker_concurrency=concurrency))
    try:
        await box.put_destination(DESTINATION, spec(queue))
        await fill(box, 0, n, lambda i: {"destination": DESTINATION, "scope": SCOPE, "payload": payload(i)})
        worker = Worker(box)
        seconds, _, used = await time_worker(box, worker, n, Broker())
        await worker.aclose()
        await check_delivered(box, n)
        if (found := await held(control, queue)) != n:
            raise BenchError(f"outbox: the queue holds {found} messages, expected {n}")
        return n / seconds, used
    finally:
        await box.close()
        await control.queue_delete(queue)


async def run(args: argparse.Namespace) -> int:
    began = time.perf_counter()
    n = args.n or (2_000 if args.quick else 20_000)
    rounds = args.rounds or (1 if args.quick else 3)
    concurrency = args.concurrency
    problems: list[str] = []
    rates: dict[str, list[float]] = {"bare": [], "channel": [], "outbox": []}
    cpus: dict[str, list[float]] = {"bare": [], "channel": [], "outbox": []}
    try:
        control_connection = await aio_pika.connect(URL, timeout=10)
    except (OSError, aio_pika.exceptions.AMQPError, TimeoutError) as exc:
        print(f"INVALID: no RabbitMQ at {URL}: {exc!r}", file=sys.stderr)
        return 1
    control = await control_connection.channel()
    print(f"RabbitMQ at 127.0.0.1:5672 (shared), N={n:,} per case, {rounds} round(s), concurrency {concurrency}")
    with tempfile.TemporaryDirectory(prefix="bench-rabbitmq-", dir=args.dir) as where:
        workdir = Path(where)
        try:
            for number in range(1, rounds + 1):
                for label, case in (("bare", bare(control, n, concurrency)),
                                    ("channel", channel_alone(control, n, concurrency)),
                                    ("outbox", outbox(control, workdir, n, concurrency))):
                    try:
                        rate, used = await case
                    except BenchError as exc:
                        problems.append(f"round {number}, {label}: {exc}")
                        continue
                    rates[label].append(rate)
                    cpus[label].append(used.own_us)
                    print(f"round {number}: {label:<8} {rate:>9,.0f} msg/s, CPU/message {used.own_us:,.0f} us here")
        finally:
            await control_connection.close()
    if not problems:  # each round's ratio to its own bare loop (the shared broker's load drifts between rounds)
        for label in ("bare", "channel", "outbox"):
            ratios = [rate / bare for rate, bare in zip(rates[label], rates["bare"], strict=True)]
            print(f"median {label:<8} {statistics.median(rates[label]):>9,.0f} msg/s, "
                  f"{statistics.median(ratios):.2f} of the bare loop (rounds: {', '.join(f'{r:.2f}' for r in ratios)})"
                  f", CPU/message {statistics.median(cpus[label]):,.0f} us here")
    return harness.finish(began, problems)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = harness.new_parser(__doc__)
    add = parser.add_argument
    add("--n", type=int, help="messages per case per round (20,000; --quick 2,000)")
    add("--rounds", type=int, help="rounds, each every case (3; --quick 1)")
    add("--concurrency", type=int, default=CONCURRENCY, help=f"publishes in flight in every case ({CONCURRENCY})")
    add("--quick", action="store_true", help="a short run: N=2,000, one round")
    add("--dir", help="where the databases go (the fsync cost depends on the filesystem)")
    args = parser.parse_args(argv)
    harness.require_positive(parser, args, ("n", "rounds", "concurrency"))
    return args


def main(argv: list[str] | None = None) -> int:
    return harness.run_main(run(parse_args(argv)), uvloop=False)


if __name__ == "__main__":
    sys.exit(main())
