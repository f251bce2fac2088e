"""Durable NATS JetStream delivery throughput, as a ratio to a bare nats-py publish loop from the
same run.

Every delivery is recorded before and after it is made (an ``attempt_started`` write, then the
outcome, each committed to SQLite) and published with its PubAck awaited. Absolute rates say
more about the machine than the library, so the same server is first driven by a bare loop at the
same concurrency (the JetStream ceiling of this machine), and the other cases are reported as a
ratio to it. One private ``nats-server -js`` (``tests/nats.py``: its own port and store
directory) serves the whole run; every case publishes to a fresh stream (file storage, the
default duplicate window), deleted after it:

1. baseline: one nats-py connection, CONCURRENCY tasks each awaiting ``js.publish`` of a message
   like the channel's (the ~100-byte JSON payload, the envelope's headers and ``Nats-Msg-Id``),
   N timed messages after untimed warm-up ones; the stream must then hold them all;
2. the channel alone: ``NatsChannel.send`` at the same concurrency (no store: the channel's own
   ceiling), and its ``send_many`` of CONCURRENCY messages at a time, as a worker's cycle hands
   them over;
3. the outbox: N intents for a nats destination enqueued into a fresh SQLite file (untimed), then
   ``sender.Worker`` with ``worker_concurrency=CONCURRENCY``, timed until every intent is
   delivered; the store must hold N delivered intents and the stream N messages, one per intent.

Printed per round and as medians: messages per second and ratios to the baseline, with the CPU
per message of this process and of the server. Nothing here asserts on timing; the exit status
is non-zero only when a measurement is invalid (a failed send, an undelivered intent, a wrong
message count, a dead server).

    python tests/bench/bench_nats.py [--n N] [--rounds R] [--concurrency C] [--quick]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import harness
from bench_delivery import SECRET, Cpu, check_delivered, fill, payload, time_worker
from harness import BenchError

#: The project root, for ``tests.nats`` (the servers the NATS tests run).
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

CONCURRENCY = 64
DESTINATION = "events"
SCOPE = "acme"
WARMUP_PER_SLOT = 4
TIMEOUT_SECONDS = 10.0


def nats_tests() -> Any:
    return importlib.import_module("tests.nats")  # (not a typed import: mypy would check the tests' conftest)


class NatsPeer:
    """The server as ``time_worker`` watches it: its CPU, and whether it still runs."""

    def __init__(self, server: Any) -> None:
        self.server = server

    def cpu(self) -> tuple[float, float | None]:
        from bench_delivery import own_cpu

        process = self.server.process
        return own_cpu(), None if process is None else harness.process_cpu(process.pid)

    def alive(self) -> None:
        if self.server.process is None or self.server.process.poll() is not None:
            raise BenchError(f"the server is not running:\n{harness.log_tail(self.server.log_path)}")


@dataclass
class Run:
    rate: float  # messages per second
    cpu: Cpu


async def made_stream(peer: NatsPeer, case: str) -> tuple[str, str]:
    """A fresh stream for one case: (its name, its subject)."""
    from nats.js.api import StreamConfig

    name = f"bench_{case}_{harness.free_port()}"
    client = await nats_tests().connect(peer.server.url)
    try:
        await client.jetstream().add_stream(StreamConfig(name=name, subjects=[f"{name}.events"]))
    finally:
        await client.close()
    return name, f"{name}.events"


async def held_and_dropped(peer: NatsPeer, name: str) -> int:
    """How many messages the stream holds; then it is deleted."""
    client = await nats_tests().connect(peer.server.url)
    try:
        js = client.jetstream()
        held: int = (await js.stream_info(name)).state.messages
        await js.delete_stream(name)
        return held
    finally:
        await client.close()


def intents(n: int) -> list[Any]:
    from outbox import Intent, Status
    from outbox.digest import canonical_json, payload_digest
    from outbox.ids import uuid7

    now = datetime.now(UTC)
    return [Intent(seq=i + 1, action_id=uuid7(), scope=SCOPE, destination=DESTINATION, channel="nats",
                   payload_json=canonical_json(payload(i)).decode(), payload_digest=payload_digest(payload(i)),
                   status=Status.LEASED, attempts=0, max_attempts=10, next_attempt_at=now, not_before=None,
                   expires_at=None, lease_owner="bench", lease_expires_at=now, fence=1, created_at=now,
                   updated_at=now, last_error=None) for i in range(n)]


def destination(subject: str, server: str) -> Any:
    from outbox import Destination, OnUnknown
    from sender.nats import NatsSpec

    now = datetime.now(UTC)
    spec = NatsSpec.model_validate({"channel": "nats", "servers": [server], "subject": subject, "secret": SECRET,
                                    "allow_private_network": True, "timeout_seconds": TIMEOUT_SECONDS})
    return Destination(
        id=DESTINATION, channel="nats", settings=spec.settings(), secrets=(SECRET,), idempotent=False,
        retention_seconds=86_400, on_unknown=OnUnknown.ALWAYS, timeout_seconds=TIMEOUT_SECONDS,
        requires_approval=False, allow_private_network=True, disabled=False, created_at=now, updated_at=now)


async def timed(peer: NatsPeer, n: int, concurrency: int, one: Any) -> Run:
    warmup = WARMUP_PER_SLOT * concurrency
    await harness.fan_out(concurrency, 0, warmup, one)
    cpu = peer.cpu()
    ok, seconds = await harness.fan_out(concurrency, warmup, warmup + n, one)
    if ok != n:
        raise BenchError(f"{n - ok} of {n} timed messages failed")
    return Run(n / seconds, Cpu.measure(cpu, peer.cpu(), n))


async def baseline(peer: NatsPeer, n: int, concurrency: int) -> Run:
    """A bare nats-py loop: ``concurrency`` tasks, each ``await js.publish(...)``."""
    from outbox.ids import uuid7
    from sender.channel import Send
    from sender.nats.channel import message

    name, subject = await made_stream(peer, "bare")
    total = WARMUP_PER_SLOT * concurrency + n
    messages = [message(Send(intent, destination(subject, peer.server.address), uuid7(), 1), (SECRET,), 0, None)
                for intent in intents(total)]
    client = await nats_tests().connect(peer.server.url)
    js = client.jetstream(timeout=TIMEOUT_SECONDS)
    failures: Counter[str] = Counter()

    async def one(i: int) -> bool:
        body, headers = messages[i]
        try:
            await js.publish(subject, body, headers=headers)
            return True
        except Exception as exc:  # counted, and the run is invalid
            failures[type(exc).__name__] += 1
            return False

    try:
        run = await timed(peer, n, concurrency, one)
    except BenchError as exc:
        raise BenchError(f"baseline: {exc}: {dict(failures)}") from None
    finally:
        await client.close()
    if (held := await held_and_dropped(peer, name)) != total:
        raise BenchError(f"baseline: the stream holds {held} messages, expected {total}")
    return run


async def channel_alone(peer: NatsPeer, n: int, concurrency: int, *, batched: bool) -> Run:
    """``NatsChannel.send`` at ``concurrency`` in flight, or ``send_many`` of ``concurrency`` at a time."""
    from outbox.ids import uuid7
    from sender.channel import Send
    from sender.nats import NatsChannel

    name, subject = await made_stream(peer, "batch" if batched else "alone")
    target = destination(subject, peer.server.address)
    total = WARMUP_PER_SLOT * concurrency + n
    made = intents(total)
    channel = NatsChannel()
    try:
        if batched:
            async def one_batch(start: int, end: int) -> int:
                results = await channel.send_many([Send(made[i], target, uuid7(), 1) for i in range(start, end)])
                return sum(r.outcome.value == "delivered" for r in results)

            warmup = WARMUP_PER_SLOT * concurrency
            for start in range(0, warmup, concurrency):
                await one_batch(start, start + concurrency)
            cpu, ok = peer.cpu(), 0
            began = time.perf_counter()
            for start in range(warmup, total, concurrency):
                ok += await one_batch(start, min(start + concurrency, total))
            seconds = time.perf_counter() - began
            if ok != n:
                raise BenchError(f"send_many: {n - ok} of {n} timed messages failed")
            run = Run(n / seconds, Cpu.measure(cpu, peer.cpu(), n))
        else:
            one, failures = harness.channel_sends(channel, target, made)
            try:
                run = await timed(peer, n, concurrency, one)
            except BenchError as exc:
                raise BenchError(f"channel alone: {exc}: {dict(failures)}") from None
    finally:
        await channel.aclose()
    if (held := await held_and_dropped(peer, name)) != total:
        raise BenchError(f"channel alone: the stream holds {held} messages, expected {total}")
    return run


async def outbox_delivery(workdir: Path, peer: NatsPeer, n: int, concurrency: int) -> Run:
    from outbox import Outbox, Settings
    from sender import Worker
    from sender.nats import NatsSpec

    name, subject = await made_stream(peer, "outbox")
    settings = Settings(authority="allow-all", worker_concurrency=concurrency)
    async with await Outbox.open(f"sqlite:///{workdir / f'{name}.db'}", settings=settings) as box:
        await box.put_destination(DESTINATION, NatsSpec.model_validate({
            "channel": "nats", "servers": [peer.server.address], "subject": subject, "secret": SECRET,
            "allow_private_network": True, "timeout_seconds": TIMEOUT_SECONDS}))
        await fill(box, 0, n, lambda i: {"destination": DESTINATION, "scope": SCOPE, "payload": payload(i)})
        seconds, _, used = await time_worker(box, Worker(box), n, peer)
        await check_delivered(box, n)
    if (held := await held_and_dropped(peer, name)) != n:
        raise BenchError(f"outbox: the stream holds {held} messages, expected one per intent, {n}")
    return Run(n / seconds, used)


def cpu_text(cpu: Cpu) -> str:
    server = "?" if cpu.receiver_us is None else f"{cpu.receiver_us:,.0f}"
    return f"CPU/message {cpu.own_us:,.0f} us here, {server} us server"


async def run(args: argparse.Namespace) -> int:
    n = args.n or (2_000 if args.quick else 20_000)
    rounds = args.rounds or (1 if args.quick else 3)
    labels = ("bare js.publish loop", "NatsChannel.send alone", "NatsChannel.send_many alone", "outbox Worker")
    rates: dict[str, list[float]] = {label: [] for label in labels}
    ratios: dict[str, list[float]] = {label: [] for label in labels[1:]}
    with tempfile.TemporaryDirectory(prefix="bench-nats-", dir=args.dir) as root:
        workdir = Path(root)
        try:
            server = nats_tests().NatsServer(workdir).start()
        except Exception as exc:  # how tests.nats says it could not start (pytest's skip or fail)
            raise BenchError(str(exc)) from None
        peer = NatsPeer(server)
        print(harness.machine_summary())
        print(f"{n:,} messages per case, {rounds} round(s), concurrency {args.concurrency}, nats-server on "
              f"{server.address}")
        try:
            for number in range(1, rounds + 1):
                bare = await baseline(peer, n, args.concurrency)
                runs = {labels[0]: bare,
                        labels[1]: await channel_alone(peer, n, args.concurrency, batched=False),
                        labels[2]: await channel_alone(peer, n, args.concurrency, batched=True),
                        labels[3]: await outbox_delivery(workdir, peer, n, args.concurrency)}
                for label, got in runs.items():
                    rates[label].append(got.rate)
                    if label in ratios:
                        ratios[label].append(got.rate / bare.rate)
                    print(f"round {number}: {label:<30} {got.rate:>9,.0f}/s  "
                          f"{got.rate / bare.rate:5.2f}x  {cpu_text(got.cpu)}")
        finally:
            server.stop()
    print("\nmedians:")
    for label in labels:
        shown = f"{harness.fmt_ratio(ratios[label])[0]} of the bare loop" if label in ratios else "baseline"
        print(f"  {label:<30} {statistics.median(rates[label]):>9,.0f}/s  {shown}")
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = harness.new_parser(__doc__)
    add = parser.add_argument
    add("--n", type=int, help="messages per case per round (20,000; --quick 2,000)")
    add("--rounds", type=int, help="rounds, each every case (3; --quick 1)")
    add("--concurrency", type=int, default=CONCURRENCY, help=f"sends in flight in every case ({CONCURRENCY})")
    add("--quick", action="store_true", help="a short run: N=2,000, one round")
    add("--dir", help="where the databases and the server's store go")
    args = parser.parse_args(argv)
    harness.require_positive(parser, args, ("n", "rounds", "concurrency"))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return harness.run_main(run(args), uvloop=False)


if __name__ == "__main__":
    sys.exit(main())
