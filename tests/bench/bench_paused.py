"""How long a healthy destination's intent waits behind a receiver that has stopped answering,
without and with pausing silent destinations (the worker's circuit breakers), in the same run.

N intents go to a destination whose receiver takes each request and never answers, so every
send holds a slot until its 1 s timeout; then one intent goes to a healthy destination. A Worker
at concurrency 16 runs until the healthy intent is delivered. Printed per round: that wait with
``circuit_failures=0`` (never pause) and with the default (pause after 5 sends without an
answer), and the ratio of the two. The receiver is bench_delivery.py's, in its own process.

    python tests/bench/bench_paused.py [--n N] [--rounds R] [--quick]
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import bench_delivery
import harness
from harness import BenchError

CONCURRENCY = 16
TIMEOUT_SECONDS = 1.0
WAIT_LIMIT_SECONDS = 600.0


async def healthy_wait(workdir: Path, receiver: bench_delivery.Receiver, n: int, circuit_failures: int) -> float:
    """Seconds from the worker's start until the healthy intent is delivered."""
    from outbox import DestinationSpec, Outbox, Settings, Status
    from sender import Worker

    settings = Settings(database_url=f"sqlite:///{workdir / 'outbox.db'}", authority="allow-all",
                        worker_concurrency=CONCURRENCY, circuit_failures=circuit_failures, poll_seconds=0.1,
                        drain_seconds=0)  # the silent sends left at the end are cut, not waited for
    async with await Outbox.open(settings=settings) as box:
        for name, url in (("silent", receiver.base + bench_delivery.SILENT_PATH), ("healthy", receiver.hook)):
            await box.put_destination(name, DestinationSpec(
                url=url, secret=bench_delivery.SECRET, allow_private_network=True, timeout_seconds=TIMEOUT_SECONDS))
        await box.enqueue_many({"destination": "silent", "scope": "acme", "payload": {"n": i}} for i in range(n))
        await box.enqueue(destination="healthy", scope="acme", action_id="healthy", payload={})
        worker = Worker(box)
        began = time.perf_counter()
        task = asyncio.create_task(worker.run())
        try:
            while (await box.get("healthy")).status is not Status.DELIVERED:
                if task.done() or time.perf_counter() - began > WAIT_LIMIT_SECONDS:
                    raise BenchError(f"the healthy intent was not delivered (circuit_failures={circuit_failures})")
                await asyncio.sleep(0.05)
            return time.perf_counter() - began
        finally:
            worker.stop()
            await task


async def run(n: int, rounds: int) -> int:
    began = time.perf_counter()
    problems: list[str] = []
    print(f"paused destinations benchmark ({n:,} intents to a silent receiver, {TIMEOUT_SECONDS:.0f} s timeout, "
          f"then one to a healthy one; concurrency {CONCURRENCY}, {rounds} round{'s' * (rounds > 1)})")
    print(f"{harness.machine_summary()}\n", flush=True)
    logging.getLogger("outbox.sender").setLevel(logging.ERROR)  # a warning per silent intent is the point
    ratios: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-paused-") as tmp:
        root = Path(tmp)
        port = harness.free_port()
        log = root / "receiver.log"
        cmd = [sys.executable, bench_delivery.__file__, "--serve-receiver", str(port)]
        with harness.serving(cmd, cwd=root, log=log) as proc:
            receiver = bench_delivery.Receiver(proc, f"http://127.0.0.1:{port}", log)
            await receiver.wait_ready()
            for round_ in range(1, rounds + 1):
                try:
                    never = await healthy_wait(harness.fresh_dir(root, "never"), receiver, n, 0)
                    paused = await healthy_wait(harness.fresh_dir(root, "paused"), receiver, n, 5)
                except BenchError as exc:
                    problems.append(f"round {round_}: {exc}")
                    continue
                ratios.append(never / paused)
                print(f"round {round_}: healthy intent delivered after {never:.1f} s never pausing, "
                      f"{paused:.1f} s pausing silent destinations ({never / paused:.0f}x sooner)", flush=True)
    if ratios:
        print(f"\nmedian: {statistics.median(ratios):.0f}x sooner with pausing")
    return harness.finish(began, problems)


def main(argv: list[str] | None = None) -> int:
    parser = harness.new_parser(__doc__)
    parser.add_argument("--n", type=int, help="intents to the silent receiver (300; 100 with --quick)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds (1)")
    parser.add_argument("--quick", action="store_true", help="100 intents to the silent receiver: a third of the wait")
    args = parser.parse_args(argv)
    harness.require_positive(parser, args, ("n", "rounds"))
    n = args.n if args.n is not None else (100 if args.quick else 300)
    return harness.run_main(run(n, args.rounds), uvloop=False)


if __name__ == "__main__":
    sys.exit(main())
