"""A busy application on the service's SQLite file: what the delivering worker costs its
transactions, against the same application with no worker running, in the same run.

THREADS threads, each on its own sqlite3 connection (the README's setup: a 30 s busy timeout,
transactions begun IMMEDIATE), commit transactions of a row of their own and an intent
(``Producer.enqueue``) as fast as they can; in one phase an ``outbox worker`` delivers what they
commit to a receiver in this process, in the other nothing runs beside them. Each transaction is
timed from its first statement to its commit's return: mostly the wait for the write lock, which
SQLite does not hand out in turn (a waiter sleeps and retries, up to 100 ms at a time). Reported
per phase: transactions a second, the medians, 99th percentiles and maxima of those times, how
many took longer than sqlite3's default busy timeout (5 s) would have waited, and with the worker
how long the last delivery came after the last commit. Nothing here asserts on timing; the exit
status is non-zero only when a measurement is invalid (a transaction refused, a delivery missing).
The worker's store cycles that gave up waiting for the lock (its own busy timeout) are counted
from its log: each is retried, nothing is lost, its deliveries come later.

    python tests/bench/bench_busy.py [--transactions N] [--rounds R] [--quick]
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import harness
from bench_wake import Receiver, Store, pct, prepare
from harness import BenchError

from outbox import Producer

THREADS = 8
#: sqlite3's default busy timeout: a transaction that waited longer would have been refused.
DEFAULT_TIMEOUT = 5.0


@dataclass
class Phase:
    """One phase of a round: its transactions' times (seconds), its wall time and its lateness."""

    times: list[float] = field(default_factory=list)
    seconds: float = 0.0
    drained_after: float | None = None  # last delivery after the last commit (with a worker)
    failed_cycles: int = 0  # the worker's store cycles that did not get the lock in time


def app(store: Store, producer: Producer, name: str, count: int, into: list[float], errors: list[str]) -> None:
    """One application thread: ``count`` transactions of a row and an intent."""
    conn = sqlite3.connect(store.url.removeprefix("sqlite:///"), timeout=30, isolation_level="IMMEDIATE")
    try:
        for n in range(count):
            order = f"{name}-{n}"
            began = time.monotonic()
            conn.execute("INSERT INTO orders (id, note) VALUES (?, ?)", (order, "x" * 100))
            producer.enqueue(conn, destination="hook", scope="acme", action_id=order, payload={"order": order})
            conn.commit()
            into.append(time.monotonic() - began)
    except Exception as exc:  # (a refusal makes the measurement invalid)
        errors.append(f"{name}: {type(exc).__name__}: {exc}")
    finally:
        conn.close()


def run_app(store: Store, tag: str, per_thread: int) -> tuple[Phase, list[str], float]:
    """THREADS threads of ``per_thread`` transactions; the phase, the keys, when the last commit was."""
    phase, errors, producer = Phase(), [], Producer()
    threads = [threading.Thread(target=app, args=(store, producer, f"{tag}{t}", per_thread, phase.times, errors))
               for t in range(THREADS)]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    phase.seconds = time.monotonic() - began
    if errors:
        raise BenchError(f"{len(errors)} thread(s) failed: {errors[0]}")
    return phase, [f"acme/{tag}{t}-{n}" for t in range(THREADS) for n in range(per_thread)], time.monotonic()


@contextmanager
def worker(store: Store, workdir: Path, phase: Phase) -> Iterator[None]:
    """``outbox worker`` on the store; on leaving, ``phase`` counts the store cycles it logged
    as failed (its own busy timeout, OUTBOX_SQLITE_BUSY_TIMEOUT_MS, run out)."""
    log = workdir / "worker.log"
    with harness.serving([str(Path(sys.executable).parent / "outbox"), "worker"], cwd=workdir, log=log,
                         env=store.env()) as proc:
        time.sleep(1.0)  # (its start and first claim)
        harness.check_alive(proc, log, "outbox worker")
        yield
        harness.check_alive(proc, log, "outbox worker")
    phase.failed_cycles = log.read_text(errors="replace").count("a store cycle failed")


async def one_round(root: Path, receiver: Receiver, per_thread: int, round_no: int,
                    phases: dict[str, list[Phase]]) -> None:
    workdir = harness.fresh_dir(root, "busy")
    store = Store("sqlite", f"sqlite:///{workdir / 'outbox.db'}")
    await prepare(store, receiver)
    for name in ("alone", "with a worker") if round_no % 2 == 0 else ("with a worker", "alone"):
        tag = f"r{round_no}{'w' if name != 'alone' else 'a'}"
        if name == "alone":
            phase, _, _ = await asyncio.to_thread(run_app, store, tag, per_thread)
        else:
            counted = Phase()
            with worker(store, workdir, counted):
                phase, keys, last_commit = await asyncio.to_thread(run_app, store, tag, per_thread)
                arrived = [await asyncio.to_thread(receiver.wait, key, 120.0) for key in keys]
                phase.drained_after = max(arrived) - last_commit
            phase.failed_cycles = counted.failed_cycles
        phases[name].append(phase)


def fmt_s(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms" if seconds < 1 else f"{seconds:,.2f} s"


async def main() -> int:
    parser = harness.new_parser(__doc__)
    parser.add_argument("--transactions", type=int, default=400, help="transactions per thread per phase (400)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (3)")
    parser.add_argument("--quick", action="store_true", help="--transactions 50 --rounds 1")
    args = parser.parse_args()
    harness.require_positive(parser, args, ["transactions", "rounds"])
    per_thread, rounds = (50, 1) if args.quick else (args.transactions, args.rounds)
    began = time.perf_counter()
    problems: list[str] = []
    print(f"bench_busy: {THREADS} threads x {per_thread} transactions a phase, {rounds} rounds")
    print(harness.machine_summary())
    phases: dict[str, list[Phase]] = {"alone": [], "with a worker": []}
    root = Path(tempfile.mkdtemp(prefix="bench-busy-"))
    try:
        with Receiver() as receiver:
            for round_no in range(rounds):
                try:
                    await one_round(root, receiver, per_thread, round_no, phases)
                except BenchError as exc:
                    problems.append(str(exc))
                print(f"round {round_no + 1}/{rounds} done", file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    lines = [["phase", "transactions/s", "median", "p99", "max", f"over {DEFAULT_TIMEOUT:.0f} s",
              "last delivery after last commit", "worker cycles refused"]]
    rates: dict[str, float] = {}
    for name, done in phases.items():
        if not done:
            continue
        times = [t for phase in done for t in phase.times]
        rates[name] = statistics.median(len(phase.times) / phase.seconds for phase in done)
        late = [phase.drained_after for phase in done if phase.drained_after is not None]
        lines.append([name, f"{rates[name]:,.0f}", fmt_s(statistics.median(times)), fmt_s(pct(times, 0.99)),
                      fmt_s(max(times)), str(sum(t > DEFAULT_TIMEOUT for t in times)),
                      fmt_s(statistics.median(late)) if late else "",
                      str(sum(phase.failed_cycles for phase in done)) if late else ""])
    print(harness.render_table(lines, right={1, 2, 3, 4, 5, 6, 7}))
    if len(rates) == 2:
        print(f"transactions/s with a worker delivering: {rates['with a worker'] / rates['alone']:.2f}x alone")
    return harness.finish(began, problems)


if __name__ == "__main__":
    sys.exit(harness.run_main(main(), uvloop=False))
