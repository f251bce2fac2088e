"""Publishing events to 10 subscribed destinations, against the batch intake of the same intents,
on SQLite and PostgreSQL, as ratios measured in the same run.

A publish records its event and makes one intent per subscriber in one commit; the like-for-like
baseline is the library's batch intake of the same 10 intents (``Outbox.enqueue_each``: the same
destinations, payloads and durable commit per call, the intents named by the caller), which is
what a producer would do without events. Two pairs, each timed in the same round on a fresh
database:

1. one event per call (``Outbox.publish``: 10 intents a commit) against ``enqueue_each`` of 10;
2. 50 events per call (``Outbox.publish_each``: 500 intents a commit) against ``enqueue_each``
   of 500.

Reported: events/s and intents/s of each, and the fan-out's intents/s as a ratio to the intake's
(target: at least 0.8x), the median of the per-round ratios. Nothing here asserts on timing; the
exit status is non-zero only when a measurement is invalid (an intent missing).

    python tests/bench/bench_events.py [--events N] [--rounds R] [--quick] [--no-postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import harness
from bench_postgres import ADMIN_DSN, fresh_database
from harness import BenchError

from outbox import DestinationSpec, Outbox, Settings
from outbox.grants import GrantSpec

SUBSCRIBERS = 10
SCOPE = "acme"
TOPIC = "order.shipped"
PAYLOAD = {"order": 7, "note": "x" * 100}
BATCH_EVENTS = 50
TARGET = 0.8


@asynccontextmanager
async def outbox(dialect: str) -> AsyncIterator[Outbox]:
    """A fresh outbox with SUBSCRIBERS webhook destinations subscribed to ``order.*`` and a grant
    for SCOPE to all of them."""
    if dialect == "sqlite":
        directory = Path(tempfile.mkdtemp(prefix="bench-events-"))
        try:
            box = await Outbox.open(f"sqlite:///{directory / 'o.db'}")
            try:
                yield await _prepared(box)
            finally:
                await box.close()
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        return
    async with fresh_database(ADMIN_DSN) as dsn:
        box = await Outbox.open(dsn, settings=Settings(database_url=dsn, secrets_key_file=harness.key_file()))
        try:
            yield await _prepared(box)
        finally:
            await box.close()


async def _prepared(box: Outbox) -> Outbox:
    for n in range(SUBSCRIBERS):
        await box.put_destination(f"d{n}", DestinationSpec(
            url="http://127.0.0.1:9/hook", secret="whsec_" + "A" * 44, allow_private_network=True,
            subscriptions=[{"topic": "order.*"}]))
    await box.put_grant("all", GrantSpec(scope=SCOPE, destination="*"))
    return box


def _intents(event: int) -> list[dict[str, Any]]:
    """The intents one event stands for, as a producer without events would enqueue them."""
    return [{"destination": f"d{n}", "scope": SCOPE, "payload": PAYLOAD, "action_id": f"intake-{event}-d{n}"}
            for n in range(SUBSCRIBERS)]


def _event(event: int) -> dict[str, Any]:
    return {"scope": SCOPE, "topic": TOPIC, "payload": PAYLOAD, "event_id": f"e{event}"}


async def timed(calls: int, call: Callable[[int], Awaitable[Any]]) -> float:
    """Seconds for ``calls`` calls one after another (after a few untimed ones)."""
    for warm in range(3):
        await call(-1 - warm)
    began = time.perf_counter()
    for n in range(calls):
        await call(n)
    return time.perf_counter() - began


async def one_round(dialect: str, events: int) -> dict[str, float]:
    """Intents/s of each case on fresh databases."""
    rates: dict[str, float] = {}

    async def single_publish(box: Outbox, n: int) -> None:
        await box.publish(**_event(n))

    async def single_intake(box: Outbox, n: int) -> None:
        await box.enqueue_each(_intents(n))

    async def batch_publish(box: Outbox, n: int) -> None:
        await box.publish_each([_event(n * BATCH_EVENTS + k) for k in range(BATCH_EVENTS)])

    async def batch_intake(box: Outbox, n: int) -> None:
        await box.enqueue_each([i for k in range(BATCH_EVENTS) for i in _intents(n * BATCH_EVENTS + k)])

    cases: list[tuple[str, Callable[[Outbox, int], Awaitable[None]], int, int]] = [
        ("publish", single_publish, events, 1), ("intake", single_intake, events, 1),
        ("publish_batch", batch_publish, max(1, events // BATCH_EVENTS), BATCH_EVENTS),
        ("intake_batch", batch_intake, max(1, events // BATCH_EVENTS), BATCH_EVENTS)]
    for name, case, calls, per_call in cases:
        async with outbox(dialect) as box:
            seconds = await timed(calls, lambda n, box=box, case=case: case(box, n))  # type: ignore[misc]
            made = sum(n for _, _, n in await box.store.count_by_status())
            expected = (calls + 3) * per_call * SUBSCRIBERS
            if made != expected:
                raise BenchError(f"{dialect} {name}: {made} intents, not {expected}")
            rates[name] = calls * per_call * SUBSCRIBERS / seconds
    return rates


def report(dialect: str, rounds: list[dict[str, float]]) -> None:
    def median(name: str) -> float:
        return statistics.median(r[name] for r in rounds)

    def ratio(a: str, b: str) -> float:
        return statistics.median(r[a] / r[b] for r in rounds)

    print(f"\n{dialect}: {SUBSCRIBERS} subscribers, medians of {len(rounds)} rounds")
    for label, publish, intake, per_call in (("one event a call", "publish", "intake", 1),
                                             (f"{BATCH_EVENTS} events a call", "publish_batch", "intake_batch",
                                              BATCH_EVENTS)):
        fanned = ratio(publish, intake)
        print(f"  {label:<18} publish {median(publish) / SUBSCRIBERS:>9,.0f} events/s "
              f"{median(publish):>9,.0f} intents/s | intake {median(intake):>9,.0f} intents/s "
              f"({per_call * SUBSCRIBERS} a commit) | fan-out {fanned:.2f}x intake "
              f"({'meets' if fanned >= TARGET else 'below'} the {TARGET}x target)")


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=2000, help="events per single case (default 2000)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="200 events, 3 rounds")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    args = parser.parse_args()
    events, rounds = (200, 3) if args.quick else (args.events, args.rounds)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; library path, one caller, durable commits")
    try:
        for dialect in ("sqlite",) if args.no_postgres else ("sqlite", "postgres"):
            report(dialect, [await one_round(dialect, events) for _ in range(rounds)])
    except BenchError as exc:
        print(f"invalid measurement: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
