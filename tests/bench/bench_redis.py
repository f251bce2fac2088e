"""Durable Redis Streams delivery throughput, as a ratio to a bare XADD loop from the same run.

Every delivery is recorded before and after it is made (an ``attempt_started`` write, then the
outcome, each committed to SQLite) and the entry is added by the channel's script (a dedupe key
looked up, the entry added, the key set with its TTL). Absolute rates say more about the machine
than the library, so the same server is first driven by a bare redis-py loop at the same
concurrency, and the rest is reported as a ratio to it. One private redis-server (append-only
with ``appendfsync everysec``, its defaults otherwise) serves the whole run, in its own process;
every case writes a fresh stream:

1. baseline: one ``redis.asyncio.Redis`` client, CONCURRENCY tasks each awaiting a plain
   ``XADD`` of an entry with the channel's fields (the four identity fields, the two of the
   signature, the ~100-byte payload), N timed entries after untimed warm-up ones; the stream
   must then hold them all;
2. the channel alone: ``RedisChannel.send`` from CONCURRENCY tasks, and its ``send_many`` of
   CONCURRENCY entries at a time (one pipeline, as a worker's cycle hands them over), no store;
3. the outbox: N intents enqueued into a fresh SQLite file (untimed), then ``sender.Worker`` with
   ``worker_concurrency=CONCURRENCY`` and ``authority="allow-all"``, timed until every intent is
   delivered; the store must hold N delivered intents and N attempts, and the stream N entries,
   one per intent by their idempotency-key fields.

Printed per round and as medians: entries per second and ratios, with CPU time per entry of
this process and of the server. Nothing here asserts on timing. The exit status is non-zero only
when a measurement is invalid (a failed send, an undelivered intent, a wrong entry count).

    python tests/bench/bench_redis.py [--n N] [--rounds R] [--quick] [--uvloop]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import harness
from bench_delivery import SECRET, Cpu, check_delivered, own_cpu, payload, progress, time_worker
from harness import BenchError

CONCURRENCY = 64
DESTINATION = "stream"
SCOPE = "acme"
WARMUP = 4 * CONCURRENCY


class Server:
    """A private redis-server on a free port, its data in ``root``."""

    def __init__(self, root: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise BenchError("redis-server is not installed")
        self.port = harness.free_port()
        self.log = root / "redis.log"
        self.proc = harness.spawn([binary, "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(root),
                                   "--appendonly", "yes", "--appendfsync", "everysec", "--save", ""],
                                  cwd=root, log=self.log)

    def cpu(self) -> tuple[float, float | None]:
        return own_cpu(), harness.process_cpu(self.proc.pid)

    def alive(self) -> None:
        harness.check_alive(self.proc, self.log, "redis-server")

    async def ready(self) -> None:
        from redis.asyncio import Redis
        from redis.exceptions import RedisError

        deadline = time.monotonic() + 15
        while True:
            self.alive()
            try:
                async with Redis(port=self.port) as client:
                    await client.ping()
                return
            except RedisError:
                if time.monotonic() > deadline:
                    raise BenchError("redis-server did not answer") from None
                await asyncio.sleep(0.05)

    async def entries(self, stream: str) -> Counter[str]:
        """The stream's entries by their idempotency-key field."""
        from redis.asyncio import Redis

        async with Redis(port=self.port) as client:
            return Counter(fields.get(b"idempotency-key", b"").decode() for _, fields in await client.xrange(stream))


def fields(i: int) -> dict[str, str]:
    """An entry as the channel writes it (the values of one attempt's envelope and payload)."""
    import rfc8785

    body = rfc8785.dumps(payload(i)).decode()
    return {"idempotency-key": f"{SCOPE}/bare-{i}", "payload-digest": "sha256:" + "0" * 64,
            "outbox-attempt-id": "0190f5a8-0000-7000-8000-000000000000", "outbox-fence": "1",
            "webhook-timestamp": "1765152000", "webhook-signature": "v1," + "A" * 43 + "=", "payload": body}


async def bare(server: Server, stream: str, n: int) -> tuple[float, Cpu]:
    """Entries per second of a bare XADD loop, and its CPU per entry."""
    from redis.asyncio import Redis

    async with Redis(port=server.port, max_connections=CONCURRENCY) as client:
        async def one(i: int) -> bool:
            return bool(await client.xadd(stream, fields(i)))  # type: ignore[arg-type]

        await harness.fan_out(CONCURRENCY, 0, WARMUP, one)
        before = server.cpu()
        ok, seconds = await harness.fan_out(CONCURRENCY, WARMUP, WARMUP + n, one)
        used = Cpu.measure(before, server.cpu(), n)
    if ok != n or sum((await server.entries(stream)).values()) != WARMUP + n:
        raise BenchError(f"the bare loop added {ok} of {n} entries")
    return n / seconds, used


async def outbox(server: Server, root: Path, stream: str, n: int) -> tuple[Any, Any, list[Any]]:
    """An outbox on a fresh SQLite file with the destination, and ``n`` intents for it."""
    from outbox import Outbox, Settings
    from sender.redis import RedisSpec

    box = await Outbox.open(f"sqlite:///{harness.fresh_dir(root, 'box') / 'o.db'}",
                            settings=Settings(authority="allow-all", worker_concurrency=CONCURRENCY))
    destination, _ = await box.put_destination(DESTINATION, RedisSpec.model_validate({
        "channel": "redis", "host": "127.0.0.1", "port": server.port, "stream": stream, "secret": SECRET,
        "allow_private_network": True}))
    intents = []
    for lo in range(0, n, 1_000):
        intents += [r.intent for r in await box.enqueue_many(
            {"destination": DESTINATION, "scope": SCOPE, "payload": payload(i)} for i in range(lo, min(lo + 1_000, n)))]
    return box, destination, intents


async def channel_alone(server: Server, root: Path, stream: str, n: int, *, batched: bool) -> tuple[float, Cpu]:
    """Entries per second of the channel without a store: ``send`` from CONCURRENCY tasks, or
    ``send_many`` of CONCURRENCY entries at a time."""
    from outbox.ids import uuid7
    from sender.channel import Send
    from sender.redis import RedisChannel

    box, destination, intents = await outbox(server, root, stream, n + WARMUP)
    await box.close()
    channel = RedisChannel()
    failures: Counter[str] = Counter()
    try:
        if batched:
            async def chunk(i: int) -> bool:
                sends = [Send(intent, destination, uuid7(), 1) for intent in intents[i:i + CONCURRENCY]]
                results = await channel.send_many(sends)
                return all(r.outcome.value == "delivered" for r in results)

            for lo in range(0, WARMUP, CONCURRENCY):
                await chunk(lo)
            before = server.cpu()
            began = time.perf_counter()
            ok = sum([await chunk(lo) for lo in range(WARMUP, WARMUP + n, CONCURRENCY)])
            seconds = time.perf_counter() - began
            good = ok == len(range(WARMUP, WARMUP + n, CONCURRENCY))
        else:
            one, failures = harness.channel_sends(channel, destination, intents)  # (counts the sends' failures)
            await harness.fan_out(CONCURRENCY, 0, WARMUP, one)
            before = server.cpu()
            done, seconds = await harness.fan_out(CONCURRENCY, WARMUP, WARMUP + n, one)
            good = done == n
        used = Cpu.measure(before, server.cpu(), n)
    finally:
        await channel.aclose()
    if not good or set((await server.entries(stream)).values()) != {1}:
        raise BenchError(f"the channel did not add every entry exactly once: {failures.most_common(3)}")
    return n / seconds, used


async def worker_run(server: Server, root: Path, stream: str, n: int) -> tuple[float, Cpu]:
    """Entries per second of the outbox's worker, from enqueued to every intent delivered."""
    from sender import Worker

    box, _, _ = await outbox(server, root, stream, n)
    try:
        worker = Worker(box, concurrency=CONCURRENCY)
        seconds, _, used = await time_worker(box, worker, n, server)
        await worker.aclose()
        await check_delivered(box, n)
    finally:
        await box.close()
    found = await server.entries(stream)
    if len(found) != n or set(found.values()) != {1}:
        raise BenchError(f"the stream holds {sum(found.values())} entries for {len(found)} keys, expected {n}")
    return n / seconds, used


def us(cpu: Cpu) -> str:
    return f"{cpu.own_us:.0f} us own, {cpu.receiver_us or 0:.0f} us server"


async def run(args: argparse.Namespace) -> int:
    began = time.perf_counter()
    n, rounds = args.n or (2_000 if args.quick else 20_000), args.rounds or (1 if args.quick else 3)
    print(f"bench_redis: N={n}, {rounds} round(s), concurrency {CONCURRENCY}\n{harness.machine_summary()}")
    ratios: dict[str, list[float]] = {"send": [], "send_many": [], "worker": []}
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-redis-") as tmp:
        root = Path(tmp)
        server = Server(root)
        try:
            await server.ready()
            for number in range(rounds):
                stage = f"round {number + 1}"
                try:
                    base, cpu = await bare(server, f"bare-{number}", n)
                    progress(stage, "bare XADD loop", f"{base:,.0f}/s ({us(cpu)})")
                    for name, measure in (
                            ("send", lambda s: channel_alone(server, root, s, n, batched=False)),
                            ("send_many", lambda s: channel_alone(server, root, s, n, batched=True)),
                            ("worker", lambda s: worker_run(server, root, s, n))):
                        rate, cpu = await measure(f"{name}-{number}")
                        ratios[name].append(rate / base)
                        progress(stage, f"{name} (ratio to bare)", f"{rate:,.0f}/s  {rate / base:.2f}x ({us(cpu)})")
                except BenchError as exc:
                    problems.append(f"{stage}: {exc}")
        finally:
            harness.stop_process(server.proc)
    for name, found in ratios.items():
        if found:
            median, spread = harness.fmt_ratio(found)
            print(f"median {name:<10} {median} {spread}".rstrip())
    if ratios["worker"]:
        print(f"(the worker's rate over the channel's send_many alone: "
              f"{statistics.median(ratios['worker']) / statistics.median(ratios['send_many']):.2f})")
    return harness.finish(began, problems)


def main(argv: list[str] | None = None) -> int:
    parser = harness.new_parser(__doc__)
    parser.add_argument("--n", type=int, help="entries per case per round (20,000; --quick 2,000)")
    parser.add_argument("--rounds", type=int, help="rounds (3; --quick 1)")
    parser.add_argument("--quick", action="store_true", help="a short run")
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop")
    args = parser.parse_args(argv)
    harness.require_positive(parser, args, ("n", "rounds"))
    return harness.run_main(run(args), uvloop=args.uvloop)


if __name__ == "__main__":
    sys.exit(main())
