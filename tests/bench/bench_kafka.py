"""Durable Kafka delivery throughput, as a ratio to a bare aiokafka producer loop from the same run.

Every delivery is recorded before and after it is made (an ``attempt_started`` write, then the
outcome, each committed to SQLite) and the record is produced with ``acks=all`` by the
idempotent producer the channel keeps for its destination. Absolute rates say more about the
machine than the library, so the same broker is first driven by a bare aiokafka producer loop at
the same concurrency (the Kafka ceiling of this machine), and the worker's rate is reported as a
ratio to it. One noida-db broker (``tests/kafka.py``) serves the whole run, in its own process;
every case of every round produces to a fresh topic of PARTITIONS partitions, deleted once the
next case begins (noida-db writes out all it holds in the background after a burst of records,
so the broker's CPU per record would otherwise grow with every case before):

1. baseline: one ``AIOKafkaProducer`` with the channel's options (``acks=all``, the idempotent
   producer, ``linger_ms=0``), CONCURRENCY tasks each awaiting ``producer.send`` and then its
   result, N timed records (after untimed warm-up ones): the intents' ~100-byte JSON payloads,
   keyed by a fresh action id, with the channel's four headers (idempotency key, payload digest,
   attempt id, fence); the topic must then hold exactly the warm-up and N records;
2. the outbox: N intents for a kafka destination (``allow_private_network``) enqueued into a fresh
   SQLite file (untimed), then ``sender.Worker`` with ``worker_concurrency=CONCURRENCY`` and
   ``authority="allow-all"``, timed until every intent is delivered; the store must hold N
   delivered intents and N attempts, and the topic (read back in full by a plain consumer)
   exactly N records, one per intent, by their idempotency-key headers. The worker starts its
   producer within the timed run (the bare loop starts its own untimed), as a fresh worker would;
3. ordered: as 2, the destination registered with ``ordering: key`` and the intents carrying one of
   KEYS ordering keys, interleaved (intent i has key i % KEYS), reported as a ratio to 2 from the
   same round; the topic must also hold each key's records in enqueue order (one partition per
   key, the payloads' ``order`` rising with the offset). Cases 2 and 3 swap places every other
   round, so drift over a run does not favour either.

   Where the worker's time goes, measured in the same round: the kafka channel alone
   (``KafkaChannel.send`` at the same concurrency, no store: the channel's own ceiling; and its
   ``send_many`` of CONCURRENCY records at a time, as a worker's cycle hands them over) and the
   worker with a no-op channel (claims, checks, attempt and outcome writes, no Kafka).

Printed per round and as medians: records per second, ratios, and CPU time per record of this
process (event loop, SQLite writer thread) and of the broker. Targets are printed beside the
ratios; nothing here asserts on timing. The exit status is non-zero only when a measurement is
invalid (a failed send, an undelivered intent, a wrong record count or order, a dead broker).

    python tests/bench/bench_kafka.py [--n N] [--rounds R] [--concurrency C] [--quick] [--uvloop]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
from bench_delivery import (
    SECRET,
    Cpu,
    NoopChannel,
    check_delivered,
    counted,
    fill,
    own_cpu,
    payload,
    progress,
    scalar,
    time_worker,
)
from bench_email import median_us
from harness import BenchError

#: The project root, for ``tests.kafka`` (the broker the Kafka tests run).
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

CONCURRENCY = 64
DESTINATION = "stream"
SCOPE = "acme"
PARTITIONS = 6
KEYS = 1_000
#: Untimed records per in-flight send before a bare or channel-alone loop's timed ones.
WARMUP_PER_SLOT = 4
TIMEOUT_SECONDS = 10.0  # the destination's timeout_seconds (its default), the bare producer's request timeout
READ_SECONDS = 60.0  # reading a topic back in full


# -- the broker ---------------------------------------------------------------------------------


class KafkaPeer:
    """The broker as ``time_worker`` watches it: its CPU, and whether it still runs."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker

    def cpu(self) -> tuple[float, float | None]:
        """(this process's CPU seconds, the broker's)."""
        process = self.broker.process
        return own_cpu(), None if process is None else harness.process_cpu(process.pid)

    def alive(self) -> None:
        if not self.broker.running:
            raise BenchError(f"the broker is not running:\n{harness.log_tail(self.broker.log_path)}")


def start_broker(root: Path) -> Any:
    """A noida-db broker on loopback, as the Kafka tests start it (``tests.kafka.Broker``)."""
    import importlib

    import pytest

    kafka = importlib.import_module("tests.kafka")  # (not a typed import: mypy would check the tests' conftest)
    try:
        return kafka.Broker("noida", root).start()
    except (pytest.skip.Exception, pytest.fail.Exception) as exc:  # how tests.kafka says it could not start
        raise BenchError(str(exc)) from None


def producer_options(bootstrap: str) -> dict[str, Any]:
    """The options ``KafkaChannel`` gives its producer for a destination with the defaults."""
    return {"bootstrap_servers": [bootstrap], "acks": "all", "enable_idempotence": True, "linger_ms": 0,
            "max_request_size": 1_048_576, "request_timeout_ms": int(TIMEOUT_SECONDS * 1000)}


@dataclass
class Topic:
    """What a topic holds, read back from its start to its end offsets."""

    records: list[Any]  # aiokafka ConsumerRecords, by partition and offset
    end_offsets: int  # the sum of its partitions' end offsets


async def read_topic(bootstrap: str, topic: str, *, values: bool = True) -> Topic:
    """Every record of ``topic`` (a plain consumer, no group) up to the end offsets it had when
    asked; with ``values`` false only the end offsets are summed."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest", max_partition_fetch_bytes=4 * 1_048_576)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]  # as every topic here is created
        ends = await consumer.end_offsets(partitions)
        total = sum(ends.values())
        records: list[Any] = []
        if values and total:
            consumer.assign(partitions)
            await consumer.seek_to_beginning(*partitions)
            deadline = time.monotonic() + READ_SECONDS
            while [tp for tp in partitions if await consumer.position(tp) < ends[tp]]:
                if time.monotonic() > deadline:
                    raise BenchError(f"reading {topic} back: {len(records)} of {total} records in {READ_SECONDS:.0f} s")
                for got in (await consumer.getmany(timeout_ms=500, max_records=10_000)).values():
                    records.extend(got)
            records.sort(key=lambda r: (r.partition, r.offset))
        return Topic(records, total)
    finally:
        await consumer.stop()


async def drop_topics(bootstrap: str, names: list[str]) -> None:
    """Delete topics: noida-db writes out everything it holds in the background after a burst of
    records, so the topics of earlier cases would make later ones pay more for the broker's CPU."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics(names)
    finally:
        await admin.close()


# -- the loops ------------------------------------------------------------------------------------


@dataclass
class Run:
    rate: float  # records per second
    cpu: Cpu
    claims: int = 0  # store.claim calls the worker made (outbox cases)
    claimed: int = 0  # intents they returned
    warnings: dict[str, int] = field(default_factory=dict)  # the sender's log warnings, by their first words
    commits: int | None = None  # SQLite write transactions (group commits) the store ran, if countable
    jobs: int = 0  # writes they carried


def value(i: int) -> bytes:
    """The record value of intent i: its payload as canonical JSON (as the store keeps it)."""
    from outbox.digest import canonical_json

    return canonical_json(payload(i))


def headers(key: str, digest: str, attempt_id: str) -> list[tuple[str, bytes]]:
    """The channel's four headers (``KafkaChannel.send``), fence 1."""
    from receivers import wire

    return [(wire.KAFKA_IDEMPOTENCY_KEY, key.encode()), (wire.KAFKA_PAYLOAD_DIGEST, digest.encode()),
            (wire.KAFKA_ATTEMPT_ID, attempt_id.encode()), (wire.KAFKA_FENCE, b"1")]


async def timed_loop(peer: KafkaPeer, n: int, concurrency: int, one: Callable[[int], Any]) -> tuple[float, Cpu]:
    """``one(i)`` for WARMUP_PER_SLOT * concurrency untimed records, then n timed ones, from
    ``concurrency`` tasks: (records per second, CPU per record). BenchError if any failed."""
    warmup = WARMUP_PER_SLOT * concurrency
    await harness.fan_out(concurrency, 0, warmup, one)
    cpu = peer.cpu()
    ok, seconds = await harness.fan_out(concurrency, warmup, warmup + n, one)
    used = Cpu.measure(cpu, peer.cpu(), n)
    if ok != n:
        raise BenchError(f"{n - ok} of {n} timed records failed")
    return n / seconds, used


async def batch_loop(peer: KafkaPeer, n: int, size: int, channel: Any, destination: Any, intents: list[Any],
                     failures: Counter[str]) -> tuple[float, Cpu]:
    """``channel.send_many`` of ``size`` intents at a time, one batch after another, for
    WARMUP_PER_SLOT * size untimed records, then n timed ones: (records per second, CPU per
    record). BenchError if any failed."""
    from outbox.ids import uuid7
    from sender.channel import Send

    async def batch(start: int, end: int) -> int:
        results = await channel.send_many([Send(intents[i], destination, uuid7(), 1) for i in range(start, end)])
        for result in results:
            if result.outcome.value != "delivered":
                failures[result.error or result.outcome.value] += 1
        return sum(result.outcome.value == "delivered" for result in results)

    warmup = WARMUP_PER_SLOT * size
    for start in range(0, warmup, size):
        await batch(start, start + size)
    cpu, began, ok = peer.cpu(), time.perf_counter(), 0
    for start in range(warmup, warmup + n, size):
        ok += await batch(start, min(start + size, warmup + n))
    seconds = time.perf_counter() - began
    used = Cpu.measure(cpu, peer.cpu(), n)
    if ok != n:
        raise BenchError(f"{n - ok} of {n} timed records failed")
    return n / seconds, used


async def baseline(peer: KafkaPeer, topic: str, n: int, concurrency: int) -> Run:
    """A bare aiokafka producer: ``concurrency`` tasks, each ``await (await producer.send(...))``."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError

    from outbox.digest import payload_digest
    from outbox.ids import intent_key, uuid7

    total = WARMUP_PER_SLOT * concurrency + n
    action_ids = [uuid7() for _ in range(total)]
    records = [(action_ids[i].encode(), value(i),
                headers(intent_key(SCOPE, action_ids[i]), payload_digest(payload(i)), uuid7())) for i in range(total)]
    failures: Counter[str] = Counter()
    producer = AIOKafkaProducer(**producer_options(peer.broker.bootstrap))
    await producer.start()
    try:

        async def one(i: int) -> bool:
            key, body, extra = records[i]
            try:
                await (await producer.send(topic, body, key=key, headers=extra))
                return True
            except KafkaError as exc:
                failures[type(exc).__name__] += 1
                return False

        try:
            rate, used = await timed_loop(peer, n, concurrency, one)
        except BenchError as exc:
            raise BenchError(f"baseline: {exc}: {dict(failures)}") from None
    finally:
        await producer.stop()
    held = (await read_topic(peer.broker.bootstrap, topic, values=False)).end_offsets
    if held != total:
        raise BenchError(f"baseline: topic {topic} holds {held} records, expected {total}")
    return Run(rate, used)


def destination_spec(bootstrap: str, topic: str, ordered: bool) -> Any:
    from sender.kafka import KafkaSpec

    return KafkaSpec.model_validate({
        "channel": "kafka", "bootstrap_servers": [bootstrap], "topic": topic, "allow_private_network": True,
        "timeout_seconds": TIMEOUT_SECONDS, "secret": SECRET, **({"ordering": "key"} if ordered else {})})


async def channel_alone(peer: KafkaPeer, topic: str, n: int, concurrency: int, *, batched: bool = False) -> Run:
    """``KafkaChannel.send`` with no store around it: ``concurrency`` sends in flight on one
    channel (one producer), each a record like the worker's (the channel's own ceiling); or,
    ``batched``, ``send_many`` of ``concurrency`` records at a time, one batch after another."""
    from datetime import UTC, datetime

    from outbox import Destination, Intent, OnUnknown, Status
    from outbox.digest import payload_digest
    from outbox.ids import uuid7
    from sender.kafka import KafkaChannel

    now = datetime.now(UTC)
    spec = destination_spec(peer.broker.bootstrap, topic, ordered=False)
    destination = Destination(
        id=DESTINATION, channel="kafka", settings=spec.settings(), secrets=(SECRET,), idempotent=False,
        retention_seconds=86_400, on_unknown=OnUnknown.ALWAYS, timeout_seconds=TIMEOUT_SECONDS,
        requires_approval=False, allow_private_network=True, disabled=False, created_at=now, updated_at=now)
    total = WARMUP_PER_SLOT * concurrency + n
    intents = [Intent(seq=i + 1, action_id=uuid7(), scope=SCOPE, destination=DESTINATION, channel="kafka",
                      payload_json=value(i).decode(), payload_digest=payload_digest(payload(i)),
                      status=Status.LEASED, attempts=0, max_attempts=10, next_attempt_at=now, not_before=None,
                      expires_at=None, lease_owner="bench", lease_expires_at=now, fence=1, created_at=now,
                      updated_at=now, last_error=None) for i in range(total)]
    channel = KafkaChannel()
    one, failures = harness.channel_sends(channel, destination, intents)
    try:
        rate, used = await (batch_loop(peer, n, concurrency, channel, destination, intents, failures) if batched
                            else timed_loop(peer, n, concurrency, one))
    except BenchError as exc:
        raise BenchError(f"channel alone: {exc}: {dict(failures)}") from None
    finally:
        await channel.aclose()
    held = (await read_topic(peer.broker.bootstrap, topic, values=False)).end_offsets
    if held != total:
        raise BenchError(f"channel alone: topic {topic} holds {held} records, expected {total}")
    return Run(rate, used)


def ordered_claim_present() -> bool:
    """Whether the SQLite claim leaves out intents waiting behind an earlier one of their key."""
    from outbox.store.sqlite import SQL

    return "ordering_key" in SQL["due_seqs"]


def check_topic(got: Topic, keys: dict[str, str], n: int, ordered: bool) -> None:
    """BenchError unless the topic holds exactly one record per intent (``keys``: idempotency
    key to ordering key or None), and, ``ordered``, each key's records in enqueue order."""
    from receivers import wire

    if got.end_offsets != n or len(got.records) != n:
        raise BenchError(f"the topic holds {got.end_offsets} records ({len(got.records)} read), expected exactly {n}")
    seen = Counter(dict(r.headers)[wire.KAFKA_IDEMPOTENCY_KEY].decode() for r in got.records)
    if set(seen) != set(keys) or max(seen.values()) != 1:
        twice = sum(1 for c in seen.values() if c > 1)
        raise BenchError(f"the topic's records are not one per intent: {len(set(seen) - set(keys))} unknown keys, "
                         f"{len(set(keys) - set(seen))} intents missing, {twice} produced more than once")
    if not ordered:
        return
    by_key: dict[bytes, list[tuple[int, int, int]]] = defaultdict(list)
    for r in got.records:  # sorted by (partition, offset)
        by_key[r.key].append((r.partition, r.offset, json.loads(r.value)["order"]))
    if len(by_key) != KEYS:
        raise BenchError(f"the topic's records carry {len(by_key)} record keys, expected the {KEYS} ordering keys")
    out_of_order = [k for k, rs in by_key.items() if [o for _, _, o in rs] != sorted(o for _, _, o in rs)]
    split = [k for k, rs in by_key.items() if len({p for p, _, _ in rs}) > 1]
    if out_of_order or split:
        raise BenchError(f"{len(out_of_order)} of {KEYS} keys have records out of enqueue order (e.g. "
                         f"{[k.decode() for k in out_of_order[:3]]}); {len(split)} keys span partitions")


async def outbox_delivery(workdir: Path, peer: KafkaPeer, topic: str, n: int, concurrency: int, *,
                          ordered: bool = False, noop: bool = False) -> Run:
    """Enqueue n intents (untimed), run a Worker until every one is delivered, check the store
    and the topic. ``ordered``: an ordering destination, KEYS keys; ``noop``: nothing is produced."""
    from outbox import Outbox, Settings
    from sender import Worker

    def make(i: int) -> dict[str, Any]:
        extra = {"ordering_key": f"key-{i % KEYS:04d}"} if ordered else {}
        return {"destination": DESTINATION, "scope": SCOPE, "payload": payload(i), **extra}

    settings = Settings(authority="allow-all", worker_concurrency=concurrency)
    async with await Outbox.open(f"sqlite:///{workdir / 'outbox.db'}", settings=settings) as box:
        await box.put_destination(DESTINATION, destination_spec(peer.broker.bootstrap, topic, ordered))
        await fill(box, 0, n, make)
        store: Any = box.store
        keys: dict[str, str] = dict(await store._read(
            lambda conn: conn.execute("SELECT intent_key, ordering_key FROM intents").fetchall()))
        worker = Worker(box, channels={"kafka": NoopChannel()} if noop else None)
        async with counted(box) as (calls, sender_log):
            seconds, _, used = await time_worker(box, worker, n, peer)
        await check_delivered(box, n)
        if worker.stale_writes:
            raise BenchError(f"the worker had {worker.stale_writes} fenced writes rejected")
        if await scalar(box, "SELECT count(*) FROM intents WHERE ordering_key IS NOT NULL") != (n if ordered else 0):
            raise BenchError("the intents do not carry the ordering keys they were enqueued with")
    if noop:
        held = (await read_topic(peer.broker.bootstrap, topic, values=False)).end_offsets
        if held:
            raise BenchError(f"the no-op worker's topic holds {held} records")
    else:
        check_topic(await read_topic(peer.broker.bootstrap, topic), keys, n, ordered)
    return Run(n / seconds, used, calls["claims"], calls["claimed"], dict(sender_log.counts),
               calls.get("commits"), calls["jobs"])


# -- running and reporting ------------------------------------------------------------------------


def cpu_text(cpu: Cpu) -> str:
    broker = "?" if cpu.receiver_us is None else f"{cpu.receiver_us:,.0f}"
    return f"CPU/record {cpu.own_us:,.0f} us here, {broker} us broker"


@dataclass
class Case:
    label: str
    runs: list[Run] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)  # per round, against the case its label names

    def line(self, target: tuple[str, float] | None = None) -> tuple[str, ...]:
        median, spread = harness.fmt_ratio(self.ratios) if self.ratios else ("1.00x", "")
        verdict = "" if target is None or not self.ratios else (
            "met" if statistics.median(self.ratios) >= target[1] else "NOT MET")
        return (self.label, f"{statistics.median(r.rate for r in self.runs):,.0f}", median, spread,
                median_us([r.cpu.own_us for r in self.runs]), median_us([r.cpu.receiver_us for r in self.runs]),
                "" if target is None else target[0], verdict)


async def run(args: argparse.Namespace) -> int:
    n = args.n or (2_000 if args.quick else 20_000)
    rounds = args.rounds or (1 if args.quick else 3)
    concurrency = args.concurrency
    problems: list[str] = []
    began = time.perf_counter()
    loop_name = "uvloop" if args.uvloop else "asyncio"
    ordered_claim = ordered_claim_present()
    print(f"kafka benchmark (N={n:,} records per case per round, {rounds} round{'s' * (rounds > 1)}, "
          f"{concurrency} in flight; topics of {PARTITIONS} partitions, acks=all, idempotent producer; "
          "store WAL, synchronous=FULL (its default))")
    print(f"{harness.machine_summary()}, worker and producers on the {loop_name} loop, noida-db broker "
          f"in its own process; the store's claim {'honours' if ordered_claim else 'DOES NOT YET honour'} "
          f"ordering keys; load average {os.getloadavg()[0]:.2f} at the start\n", flush=True)

    base = Case(f"bare aiokafka producer -> noida ({concurrency} in flight)")
    alone = Case("  apart: the kafka channel alone, no store (x bare)")
    batches = Case(f"  apart: the channel alone, send_many of {concurrency} (x bare)")
    plain = Case(f"outbox Worker, durable kafka ({concurrency} in flight; x bare)")
    keyed = Case(f"outbox Worker, ordering key, {KEYS:,} keys (x unordered)")
    keyed_base = Case("  the same, ordered (x bare)")
    idle = Case("  apart: the Worker with a no-op channel (x bare)")
    with tempfile.TemporaryDirectory(prefix="bench-kafka-", dir=args.dir) as tmp:
        root = Path(tmp)
        try:
            broker = start_broker(root)
        except BenchError as exc:
            return harness.finish(began, [f"the broker: {exc}"])
        peer = KafkaPeer(broker)
        made: list[str] = []  # the topic of the case running now
        try:
            for round_ in range(1, rounds + 1):
                stage = f"round {round_}"
                workdir = harness.fresh_dir(root, "round")
                try:

                    async def topic(case: str, r: int = round_) -> str:
                        if made:  # the previous case's, checked by now
                            await drop_topics(broker.bootstrap, made)
                            made.clear()
                        made.append(f"bench-{case}-{r}")
                        await broker.create_topic(made[-1], partitions=PARTITIONS)
                        return made[-1]

                    b = await baseline(peer, await topic("bare"), n, concurrency)
                    base.runs.append(b)
                    progress(stage, f"bare aiokafka producer, {concurrency} in flight",
                             f"{b.rate:>7,.0f} records/s; {cpu_text(b.cpu)}")
                    a = await channel_alone(peer, await topic("channel"), n, concurrency)
                    alone.runs.append(a)
                    alone.ratios.append(a.rate / b.rate)
                    progress(stage, "kafka channel alone, no store",
                             f"{a.rate:>7,.0f} records/s ({a.rate / b.rate:.2f}x bare); {cpu_text(a.cpu)}")
                    m = await channel_alone(peer, await topic("batches"), n, concurrency, batched=True)
                    batches.runs.append(m)
                    batches.ratios.append(m.rate / b.rate)
                    progress(stage, f"kafka channel alone, send_many of {concurrency}",
                             f"{m.rate:>7,.0f} records/s ({m.rate / b.rate:.2f}x bare); {cpu_text(m.cpu)}")
                    got: dict[bool, Run] = {}
                    for ordered in ((False, True) if round_ % 2 else (True, False)):
                        sub = harness.fresh_dir(workdir, "ordered" if ordered else "unordered")
                        got[ordered] = await outbox_delivery(sub, peer, await topic("ordered" if ordered else "plain"),
                                                             n, concurrency, ordered=ordered)
                        o = got[ordered]
                        versus = f"{o.rate / b.rate:.2f}x bare" + (
                            f", {o.rate / got[False].rate:.2f}x unordered" if ordered and False in got else "")
                        what = f"ordering key, {KEYS:,} keys" if ordered else "unordered"
                        progress(stage, f"outbox Worker, {what}",
                                 f"{o.rate:>7,.0f} records/s ({versus}); {cpu_text(o.cpu)}; "
                                 f"{o.claimed / max(1, o.claims):.1f} intents per claim")
                    if round_ % 2 == 0:
                        progress(stage, "ordering key against unordered",
                                 f"{got[True].rate / got[False].rate:>7.2f}x")
                    plain.runs.append(got[False])
                    plain.ratios.append(got[False].rate / b.rate)
                    keyed.runs.append(got[True])
                    keyed.ratios.append(got[True].rate / got[False].rate)
                    keyed_base.runs.append(got[True])
                    keyed_base.ratios.append(got[True].rate / b.rate)
                    if not args.skip_noop:
                        nothing = await outbox_delivery(harness.fresh_dir(workdir, "noop"), peer, await topic("noop"),
                                                        n, concurrency, noop=True)
                        idle.runs.append(nothing)
                        idle.ratios.append(nothing.rate / b.rate)
                        progress(stage, "outbox Worker, no-op channel",
                                 f"{nothing.rate:>7,.0f} records/s ({nothing.rate / b.rate:.2f}x bare); "
                                 f"{cpu_text(nothing.cpu)}")
                    for label, o in (("unordered", got[False]), ("ordered", got[True])):
                        if o.warnings:
                            print(f"worker warnings, {stage}, {label}: {o.warnings}", flush=True)
                except BenchError as exc:
                    problems.append(f"{stage}: {exc}")
                    print(f"{stage}: FAILED: {exc}", flush=True)
                finally:
                    shutil.rmtree(workdir, ignore_errors=True)
            peer.alive()
        except BenchError as exc:
            problems.append(str(exc))
        finally:
            broker.stop()

    print(f"\nkafka benchmark (N={n:,}; median of {rounds} round{'s' * (rounds > 1)}, ratio per round against "
          "the case named in brackets; CPU per record in microseconds)")
    lines: list[tuple[str, ...]] = [("case", "records/s", "ratio", "spread", "CPU here", "CPU broker", "target", "")]
    if base.runs:
        lines.append(base.line())
    if plain.runs:
        lines.append(plain.line((">= 0.3x", 0.3)))
    if keyed.runs:
        lines.append(keyed.line((">= 0.8x", 0.8)))
        lines.append(keyed_base.line())
    if alone.runs:
        lines.append(alone.line())
    if batches.runs:
        lines.append(batches.line())
    if idle.runs:
        lines.append(idle.line())
    print(harness.render_table(lines, right={1, 2, 4, 5}))
    print(f"load average {os.getloadavg()[0]:.2f} at the end (this machine has {os.cpu_count()} CPUs: other work "
          "running beside the benchmark shows in every case, the bare loop's least)")
    for label, case in (("unordered", plain), ("ordered", keyed), ("no-op channel", idle)):
        if case.runs:
            r = case.runs[-1]
            commits = "" if r.commits is None else (
                f"; {r.commits:,} SQLite commits carrying {r.jobs:,} writes ({r.commits / n:.2f} commits and "
                f"{r.jobs / n:.2f} writes per delivery, {r.commits * r.rate / n:,.0f} commits/s)")
            print(f"worker, last round, {label}: {r.claims:,} claims for {r.claimed:,} intents "
                  f"({r.claimed / max(1, r.claims):.1f} per claim){commits}")
    if not ordered_claim:
        print("note: the store's claim does not consult ordering keys yet, so the ordered case measures the "
              "unordered claim with keyed records; its order check may fail until the ordered claim lands")
    return harness.finish(began, problems)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = harness.new_parser(__doc__)
    add = parser.add_argument
    add("--n", type=int, help="records per case per round (20,000; --quick 2,000)")
    add("--rounds", type=int, help="rounds, each every case (3; --quick 1)")
    add("--concurrency", type=int, default=CONCURRENCY, help=f"sends in flight in every case ({CONCURRENCY})")
    add("--quick", action="store_true", help="a short run: N=2,000, one round")
    add("--uvloop", action="store_true", help="run the worker and the producers on uvloop")
    add("--skip-noop", action="store_true", help="skip the worker with a no-op channel")
    add("--dir", help="where the databases and the broker's log go (the fsync cost depends on the filesystem)")
    args = parser.parse_args(argv)
    harness.require_positive(parser, args, ("n", "rounds", "concurrency"))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return harness.run_main(run(args), uvloop=args.uvloop)


if __name__ == "__main__":
    sys.exit(main())
