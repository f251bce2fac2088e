"""Idempotent Kafka consumer throughput, as ratios to a bare consumer loop from the same run.

N records, shaped as the sender produces them (a unique ``idempotency-key``, the
``payload-digest`` of a small canonical JSON payload, attempt id and fence headers), are produced
once to a noida-db broker (tests/kafka.py) on loopback, over PARTITIONS partitions. Then, in
interleaved rounds, each case reads them all as a new consumer group from the earliest offset:

1. bare: an ``AIOKafkaConsumer`` loop, ``getmany`` (BATCH records at most), a trivial handler
   per record, one offset commit per batch (the baseline);
2. ``receivers.IdempotentConsumer`` with the same handler and batch size over each record store:
   memory, a SQLite file (WAL, ``synchronous=FULL``), PostgreSQL (a throwaway database; the case
   is skipped when none answers).

A case's time runs from the first fetch that returned records to the offset commit that covered
the last one (the group join is left out), taken from the same two calls of the Kafka consumer in
every case, and so is the process's CPU time per record (the Kafka client's work, the consumer's
and, on SQLite, the writer thread's; not the PostgreSQL server's): a case's CPU less the bare
loop's is what deduplication costs in Python. Every case must hand each record to its handler
exactly once. A ratio is the median of the per-round ratios to that round's bare figure. Targets
are printed beside the figures; nothing here asserts on timing. The exit status is non-zero only
when a measurement is invalid.

    python tests/bench/bench_consumer.py [--n N] [--rounds R] [--quick]
"""

from __future__ import annotations

import asyncio
import hashlib
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness
import rfc8785
from harness import BenchError

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for tests.kafka and tests.pg

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from receivers import IdempotencyContext, IdempotentConsumer, MemoryRecordStore, PostgresRecordStore, SqliteRecordStore
from receivers.wire import KAFKA_ATTEMPT_ID, KAFKA_FENCE, KAFKA_IDEMPOTENCY_KEY, KAFKA_PAYLOAD_DIGEST
from tests import pg
from tests.kafka import Broker

TOPIC = "bench"
PARTITIONS = 4
BATCH = 500
NOTE = "x" * 60


class Clocked:
    """Times a Kafka consumer's first fetch that returned records and the commit that covered
    ``n`` records, in wall and in process CPU time (it only observes the two calls)."""

    def __init__(self, consumer: AIOKafkaConsumer, n: int) -> None:
        self.n = n
        self.began: float | None = None
        self.ended: float | None = None
        self.cpu_began = self.cpu_ended = 0.0
        self.committed: dict[Any, int] = {}
        self.done = asyncio.Event()
        getmany, commit = consumer.getmany, consumer.commit

        async def timed_getmany(*args: Any, **kwargs: Any) -> Any:
            batch = await getmany(*args, **kwargs)
            if batch and self.began is None:
                self.began, self.cpu_began = time.perf_counter(), time.process_time()
            return batch

        async def timed_commit(offsets: dict[Any, int]) -> None:
            await commit(offsets)
            self.committed.update(offsets)
            if sum(self.committed.values()) >= self.n and self.ended is None:
                self.ended, self.cpu_ended = time.perf_counter(), time.process_time()
                self.done.set()

        consumer.getmany, consumer.commit = timed_getmany, timed_commit

    @property
    def rate(self) -> float:
        assert self.began is not None and self.ended is not None
        return self.n / (self.ended - self.began)

    @property
    def cpu_us(self) -> float:
        """Process CPU time per record, in microseconds."""
        return (self.cpu_ended - self.cpu_began) / self.n * 1e6


def new_consumer(bootstrap: str) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(TOPIC, bootstrap_servers=bootstrap, group_id=f"bench-{uuid.uuid4().hex[:8]}",
                            enable_auto_commit=False, auto_offset_reset="earliest")


async def produce(bootstrap: str, n: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True,
                                linger_ms=5)
    await producer.start()
    try:
        sent = []
        for i in range(n):
            key = f"order-{i:08d}"
            value = rfc8785.dumps({"order": i, "note": NOTE})
            headers = [(KAFKA_IDEMPOTENCY_KEY, key.encode()),
                       (KAFKA_PAYLOAD_DIGEST, ("sha256:" + hashlib.sha256(value).hexdigest()).encode()),
                       (KAFKA_ATTEMPT_ID, uuid.uuid4().hex.encode()), (KAFKA_FENCE, b"1")]
            sent.append(await producer.send(TOPIC, value, key=key.encode(), headers=headers))
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


async def bare(bootstrap: str, n: int) -> Clocked:
    """The baseline loop: what any at-least-once consumer does, without deduplication."""
    consumer = new_consumer(bootstrap)
    clock = Clocked(consumer, n)
    handled = 0
    await consumer.start()
    try:
        while not clock.done.is_set():
            batch = await consumer.getmany(timeout_ms=1000, max_records=BATCH)
            for records in batch.values():
                for _ in records:
                    handled += 1
            if batch:
                await consumer.commit({tp: records[-1].offset + 1 for tp, records in batch.items()})
    finally:
        await consumer.stop()
    if handled != n:
        raise BenchError(f"the bare loop handled {handled} records, not {n}")
    return clock


async def idempotent(bootstrap: str, n: int, store: Any) -> Clocked:
    consumer = new_consumer(bootstrap)
    clock = Clocked(consumer, n)
    calls: dict[str, int] = {}

    async def handle(record: Any, context: IdempotencyContext) -> None:
        calls[context.key] = calls.get(context.key, 0) + 1

    async with IdempotentConsumer(consumer, store, handle, max_batch=BATCH):
        await asyncio.wait_for(clock.done.wait(), 600)
    if len(calls) != n or any(count != 1 for count in calls.values()):
        raise BenchError(f"{len(calls)} keys handled, {sum(calls.values())} calls, for {n} records")
    return clock


@dataclass(frozen=True)
class Case:
    label: str
    #: Yields a fresh, unopened record store (None: the bare loop).
    store: Callable[[Path], AbstractAsyncContextManager[Any]] | None
    #: The ratio to the bare loop this case aims at.
    target: float = 1.0


@asynccontextmanager
async def memory(workdir: Path) -> AsyncIterator[Any]:
    yield MemoryRecordStore()


@asynccontextmanager
async def sqlite(workdir: Path) -> AsyncIterator[Any]:
    yield SqliteRecordStore(harness.fresh_dir(workdir, "sqlite") / "records.db")


@asynccontextmanager
async def postgres(workdir: Path) -> AsyncIterator[Any]:
    async with pg.database() as dsn:
        yield PostgresRecordStore(dsn)


CASES = [Case("bare consumer loop", None), Case("idempotent, memory", memory, 0.20),
         Case("idempotent, SQLite", sqlite, 0.10), Case("idempotent, PostgreSQL", postgres, 0.10)]


async def one(case: Case, bootstrap: str, n: int, workdir: Path) -> Clocked:
    if case.store is None:
        return await bare(bootstrap, n)
    async with case.store(workdir) as store:
        return await idempotent(bootstrap, n, store)


def postgres_answers() -> bool:
    return pg._unreachable(pg.ADMIN_DSN) is None


async def run(n: int, rounds: int) -> int:
    began = time.perf_counter()
    problems: list[str] = []
    cases = [case for case in CASES if case.store is not postgres or postgres_answers()]
    print(f"idempotent consumer benchmark (N={n:,} records over {PARTITIONS} partitions, batches of {BATCH}, "
          f"{rounds} round(s))")
    print(harness.machine_summary())
    if len(cases) < len(CASES):
        print(f"PostgreSQL at {pg.ADMIN_DSN} does not answer: its case is left out")
    rates: dict[str, list[float]] = {case.label: [] for case in cases}
    cpus: dict[str, list[float]] = {case.label: [] for case in cases}
    ratios: dict[str, list[float]] = {case.label: [] for case in cases}
    with tempfile.TemporaryDirectory(prefix="bench-consumer-") as tmp:
        workdir = Path(tmp)
        broker = Broker("noida", workdir).start()
        try:
            await broker.create_topic(TOPIC, partitions=PARTITIONS)
            await produce(broker.bootstrap, n)
            for round_ in range(1, rounds + 1):
                baseline = None
                for case in cases:
                    try:
                        clock = await one(case, broker.bootstrap, n, workdir)
                    except (BenchError, TimeoutError) as exc:
                        problems.append(f"round {round_}, {case.label}: {exc!r}")
                        continue
                    rate = clock.rate
                    cpus[case.label].append(clock.cpu_us)
                    baseline = rate if case.store is None else baseline
                    rates[case.label].append(rate)
                    if baseline:
                        ratios[case.label].append(rate / baseline)
                    print(f"round {round_}: {case.label:<24} {rate:>10,.0f} records/s  {clock.cpu_us:6.1f} us CPU "
                          "per record", flush=True)
        finally:
            broker.stop()
    lines = [["case", "records/s", "CPU us/record", "ratio", "spread", "target"]]
    for case in cases:
        median, spread = harness.fmt_ratio(ratios[case.label])
        rate = f"{statistics.median(rates[case.label]):,.0f}" if rates[case.label] else "-"
        cpu = f"{statistics.median(cpus[case.label]):.1f}" if cpus[case.label] else "-"
        lines.append([case.label, rate, cpu, median if case.store else "1.00x", spread if case.store else "",
                      f">= {case.target:.2f}x" if case.store else "baseline"])
    print(f"\nidempotent consumer vs bare loop (N={n:,}; median of {rounds} round(s))")
    print(harness.render_table(lines, right={1, 2, 3}))
    return harness.finish(began, problems)


def main(argv: list[str] | None = None) -> int:
    parser = harness.new_parser(__doc__)
    parser.add_argument("--n", type=int, default=100_000, help="records per case (default 100,000)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--quick", action="store_true", help="20,000 records, one round")
    args = parser.parse_args(argv)
    harness.require_positive(parser, args, ["n", "rounds"])
    n, rounds = (20_000, 1) if args.quick else (args.n, args.rounds)
    return harness.run_main(run(n, rounds), uvloop=False)


if __name__ == "__main__":
    sys.exit(main())
