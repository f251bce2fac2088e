"""Ordered delivery per key against unordered delivery, as a ratio from the same run.

The receiver, its process and the durable SQLite delivery are bench_delivery.py's. Each round
delivers N intents twice, each time into a fresh SQLite file, with one Worker at concurrency 64:

1. unordered: N intents to a destination with ``ordering: none``;
2. ordered: N intents to a destination with ``ordering: key``, interleaved over KEYS ordering
   keys (intent i has key i mod KEYS), so at most one intent of each key is in flight and the
   next of a key is claimed only once the one before it is delivered.

Printed: both rates and their ratio (target >= 0.8x). Beside it, the worst case of the claim:
claims of 64 from a backlog whose due order starts with HOT intents of one key (its first one
leased, so the rest wait behind it) before intents of other keys, timed against the same claim
on an unordered backlog of the same size: the claim walks the waiting intents of the hot key (one
index seek each) before it reaches claimable ones. Nothing here asserts on timing.

    python tests/bench/bench_ordering.py [--n N] [--keys K] [--hot H] [--rounds R]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import bench_delivery
import harness
from bench_delivery import CONCURRENCY, SCOPE, SECRET, check_delivered, fill, open_box, time_worker
from harness import BenchError

ORDERED = "ordered"
TARGET = 0.8
#: Claims timed per backlog in the hot-key check.
CLAIMS = 20


async def delivery_rate(workdir: Path, receiver: bench_delivery.Receiver, n: int, keys: int | None) -> float:
    """Deliveries per second of n intents, unordered (``keys`` None) or over ``keys`` ordering keys."""
    from outbox import DestinationSpec
    from sender import Worker

    box = await open_box(workdir / "ordering.db", receiver.hook)
    try:
        make: Callable[[int], dict[str, Any]] = bench_delivery.intent
        if keys is not None:
            await box.put_destination(ORDERED, DestinationSpec(
                url=receiver.hook, secret=SECRET, allow_private_network=True, ordering="key"))

            def make(i: int) -> dict[str, Any]:
                return {"destination": ORDERED, "scope": SCOPE, "ordering_key": f"k{i % keys}",
                        "payload": bench_delivery.payload(i)}

        await fill(box, 0, n, make)
        seconds, _, _ = await time_worker(box, Worker(box), n, receiver)
        await check_delivered(box, n)
    finally:
        await box.close()
    return n / seconds


async def claim_ms(workdir: Path, hook: str, hot: int, others: int, ordered: bool) -> float:
    """Median ms of a claim of CONCURRENCY from ``hot`` intents of one key (the first leased)
    due before ``others`` of distinct keys; each claim's leases are given back, untimed."""
    from outbox import DestinationSpec, Event, EventKind
    from outbox.model import Release

    box = await open_box(workdir / "claims.db", hook)
    try:
        await box.put_destination(ORDERED, DestinationSpec(
            url=hook, secret=SECRET, allow_private_network=True, ordering="key" if ordered else "none"))
        await fill(box, 0, hot + others, lambda i: {
            "destination": ORDERED, "scope": SCOPE, "payload": {"n": i},
            "ordering_key": "hot" if i < hot else f"k{i}"})
        now = box.clock.now()
        await box.store.claim("head", now=now, lease_until=now + timedelta(hours=1), limit=1)  # the hot key's first
        times: list[float] = []
        for _ in range(CLAIMS):
            began = time.perf_counter()
            claimed = await box.store.claim("w", now=now, lease_until=now + timedelta(hours=1), limit=CONCURRENCY)
            times.append(time.perf_counter() - began)
            if len(claimed) != CONCURRENCY:
                raise BenchError(f"a claim got {len(claimed)} intents, expected {CONCURRENCY}")
            # back to pending, as they were (their due time unchanged)
            await box.store.apply([Release(intent.key, intent.fence, intent.next_attempt_at,
                                           (Event(EventKind.RELEASED, now, "bench"),)) for intent in claimed])
    finally:
        await box.close()
    return statistics.median(times) * 1000


async def run(n: int, keys: int, hot: int, rounds: int) -> int:
    began = time.perf_counter()
    problems: list[str] = []
    print(f"ordering benchmark ({n:,} intents, ordered over {keys:,} keys vs unordered; concurrency {CONCURRENCY}, "
          f"{rounds} round{'s' * (rounds > 1)})")
    print(f"{harness.machine_summary()}\n", flush=True)
    ratios: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-ordering-") as tmp:
        root = Path(tmp)
        async with bench_delivery.running_receiver(root) as receiver:
            for round_ in range(1, rounds + 1):
                try:
                    unordered = await delivery_rate(harness.fresh_dir(root, "unordered"), receiver, n, None)
                    ordered = await delivery_rate(harness.fresh_dir(root, "ordered"), receiver, n, keys)
                except BenchError as exc:
                    problems.append(f"round {round_}: {exc}")
                    continue
                ratios.append(ordered / unordered)
                print(f"round {round_}: unordered {unordered:,.0f}/s, ordered over {keys:,} keys {ordered:,.0f}/s "
                      f"({ordered / unordered:.2f}x)", flush=True)
            try:
                flat = await claim_ms(harness.fresh_dir(root, "flat"), receiver.hook, hot, CONCURRENCY * 2, False)
                walked = await claim_ms(harness.fresh_dir(root, "hot"), receiver.hook, hot, CONCURRENCY * 2, True)
                print(f"\nclaim of {CONCURRENCY} behind one key's backlog of {hot:,} at the front of the due order: "
                      f"{walked:.1f} ms ordered, {flat:.1f} ms unordered (the worst case: the claim walks the "
                      f"waiting intents, one index seek each)")
            except BenchError as exc:
                problems.append(f"hot key: {exc}")
    if ratios:
        median, spread = harness.fmt_ratio(ratios)
        print(f"\nordered / unordered: {median}{f' ({spread})' if spread else ''}   target >= {TARGET}x")
    return harness.finish(began, problems)


def main(argv: list[str] | None = None) -> int:
    parser = harness.new_parser(__doc__)
    parser.add_argument("--n", type=int, default=20_000, help="intents per delivery run (20,000)")
    parser.add_argument("--keys", type=int, default=1_000, help="ordering keys of the ordered run (1,000)")
    parser.add_argument("--hot", type=int, default=10_000, help="the hot key's backlog in the claim check (10,000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (3)")
    args = parser.parse_args(argv)
    harness.require_positive(parser, args, ("n", "keys", "hot", "rounds"))
    return harness.run_main(run(args.n, args.keys, args.hot, args.rounds), uvloop=False)


if __name__ == "__main__":
    sys.exit(main())
