"""The idempotent consumer's Python per record, in instructions counted under callgrind.

The consumer's loop is fed records from memory (no broker, no network; records shaped as the
sender produces them, over 4 partitions, batches of 500) with a trivial handler and the memory
record store, so what is counted is the consumer's own Python: reading headers, the key, fence and
digest checks, the rounds, the claims and completions with the store's decisions, the handler's
call. Each count runs in a child process under ``valgrind --tool=callgrind``, which counts the
same instructions however loaded the machine is; a figure is the difference between two sizes
(SMALL and LARGE records), so start-up cancels, less the same difference for a bare loop over the
same records. ``--against DIR`` counts a second checkout too (``git archive main | tar -x -C DIR``),
in the same run. ``--quick`` (500 and 2,000 records) is a smoke run: at that size one garbage
collection more or less in a run moves the figure by several thousand. The exit status is
non-zero only when a count is invalid (no valgrind, a child that failed or handled a record other
than once).

    python tests/bench/bench_consumer_python.py [--small N] [--large N] [--against DIR] [--quick]
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

TOPIC = "bench"
PARTITIONS = 4
BATCH = 500
HERE = Path(__file__).resolve().parents[2]


def records(n: int) -> dict[Any, list[Any]]:
    import rfc8785
    from aiokafka.structs import ConsumerRecord, TopicPartition

    from receivers.wire import KAFKA_ATTEMPT_ID, KAFKA_FENCE, KAFKA_IDEMPOTENCY_KEY, KAFKA_PAYLOAD_DIGEST

    out: dict[Any, list[Any]] = {TopicPartition(TOPIC, p): [] for p in range(PARTITIONS)}
    for i in range(n):
        key = f"order-{i:08d}"
        value = rfc8785.dumps({"order": i, "note": "x" * 60})
        headers = ((KAFKA_IDEMPOTENCY_KEY, key.encode()),
                   (KAFKA_PAYLOAD_DIGEST, ("sha256:" + hashlib.sha256(value).hexdigest()).encode()),
                   (KAFKA_ATTEMPT_ID, uuid.uuid4().hex.encode()), (KAFKA_FENCE, b"1"))
        tp = TopicPartition(TOPIC, i % PARTITIONS)
        part = out[tp]
        part.append(ConsumerRecord(TOPIC, tp.partition, len(part), 0, 0, key.encode(), value, None, len(key),
                                   len(value), headers))
    return out


class Fed:
    """What ``IdempotentConsumer`` uses of an ``AIOKafkaConsumer``, its records given from memory."""

    def __init__(self, data: dict[Any, list[Any]], n: int) -> None:
        self._group_id = "bench"
        self._enable_auto_commit = False
        self.data = data
        self.position = {tp: 0 for tp in data}
        self.paused: set[Any] = set()
        self.n = n
        self.committed: dict[Any, int] = {}
        self.done = asyncio.Event()

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def assignment(self) -> set[Any]:
        return set(self.data)

    def seek(self, tp: Any, offset: int) -> None:
        self.position[tp] = offset

    def pause(self, tp: Any) -> None:
        self.paused.add(tp)

    def resume(self, tp: Any) -> None:
        self.paused.discard(tp)

    async def getmany(self, timeout_ms: int = 0, max_records: int = BATCH) -> dict[Any, list[Any]]:
        batch, left = {}, max_records
        for tp, rows in self.data.items():
            at = self.position[tp]
            taken = [] if tp in self.paused or left <= 0 else rows[at:at + min(left, BATCH // PARTITIONS)]
            if taken:
                batch[tp], self.position[tp] = taken, at + len(taken)
                left -= len(taken)
        if not batch and timeout_ms:
            await asyncio.sleep(timeout_ms / 1000)
        return batch

    async def commit(self, offsets: dict[Any, int]) -> None:
        self.committed.update(offsets)
        if sum(self.committed.values()) >= self.n:
            self.done.set()


async def child(n: int, kind: str) -> None:
    """One counted run: ``n`` records through the idempotent consumer, or through the bare loop."""
    fed = Fed(records(n), n)
    if kind == "bare":
        while not fed.done.is_set():
            batch = await fed.getmany(max_records=BATCH)
            await fed.commit({tp: rows[-1].offset + 1 for tp, rows in batch.items()})
        return
    import logging

    from receivers import IdempotencyContext, IdempotentConsumer, MemoryRecordStore

    logging.disable(logging.WARNING)  # the warning that no secrets= were given
    calls: dict[str, int] = {}

    async def handle(record: Any, context: IdempotencyContext) -> None:
        calls[context.key] = calls.get(context.key, 0) + 1

    async with IdempotentConsumer(fed, MemoryRecordStore(), handle, max_batch=BATCH):
        await fed.done.wait()
    if len(calls) != n or set(calls.values()) != {1}:
        raise SystemExit(f"{len(calls)} keys handled, {sum(calls.values())} calls, for {n} records")


def count(checkout: Path, n: int, kind: str) -> int:
    """Instructions of one child run under callgrind, with ``checkout``'s receivers."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
                           __file__, "--child", str(n), kind], env=env, capture_output=True, text=True,
                          timeout=3600)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"{kind} x{n} with {checkout}: exit {done.returncode}: {done.stderr[-1000:]}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import harness

    if argv is None and sys.argv[1:2] == ["--child"]:
        asyncio.run(child(int(sys.argv[2]), sys.argv[3]))
        return 0
    parser = harness.new_parser(__doc__)
    parser.add_argument("--small", type=int, default=2_000, help="records in the small run (default 2,000)")
    parser.add_argument("--large", type=int, default=10_000, help="records in the large run (default 10,000)")
    parser.add_argument("--against", help="a second checkout to count beside this one (e.g. main's)")
    parser.add_argument("--quick", action="store_true", help="500 and 2,000 records")
    args = parser.parse_args(argv)
    harness.require_positive(parser, args, ["small", "large"])
    small, large = (500, 2_000) if args.quick else (args.small, args.large)
    if large <= small:
        parser.error("--large must be more than --small")
    began = time.perf_counter()
    if shutil.which("valgrind") is None:
        return harness.finish(began, ["valgrind is not installed: nothing was counted"])
    checkouts = {"this": HERE, **({"against": Path(args.against).resolve()} if args.against else {})}
    print(f"idempotent consumer's Python per record, under callgrind ({small:,} and {large:,} records, "
          f"memory store, batches of {BATCH})")
    problems: list[str] = []
    try:
        bare = count(HERE, large, "bare") - count(HERE, small, "bare")
        lines = [["checkout", "instructions/record"]]
        for label, checkout in checkouts.items():
            used = count(checkout, large, "memory") - count(checkout, small, "memory")
            lines.append([f"{label} ({checkout})", f"{(used - bare) / (large - small):,.0f}"])
        print(harness.render_table(lines, right={1}))
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        problems.append(str(exc))
    return harness.finish(began, problems)


if __name__ == "__main__":
    sys.exit(main())
