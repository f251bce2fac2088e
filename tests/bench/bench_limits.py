"""Flow control's cost on PostgreSQL: three ``outbox worker`` processes drain one backlog to a
destination with no limit, and to the same destination with a generous ``rate_limit`` and
``max_in_flight`` that never bind, in the same run.

A limited destination's intents are claimed by ``outbox_claim_limited`` (migration 0013): each
claim locks the destination's bucket row, counts its leased intents and takes the tokens, so
the three processes' claims take turns on that row; an unlimited destination's claim reads
which destinations are limited and touches nothing more. This measures what that costs per
delivery, with bench_postgres.py's drain (a receiver in its own process, a fresh database per
drain, the workers held by a table lock until each one's first claim waits on it, timed to the
last delivery recorded, the store checked afterwards: N delivered, N attempts):

1. no limit: the destination as bench_postgres.py registers it;
2. ``rate_limit`` of 100,000 a second with a burst of 100,000: the bucket never empties;
3. ``max_in_flight`` of 100,000: never reached (each claim counts the destination's leases).

Nothing is held back, so any difference is the limiter's bookkeeping. The cases run in
interleaved rounds (their order rotating); each ratio is a limited drain's against the
unlimited one of the same round, and the figures are medians. Beside the rates, per
delivery: CPU time of the three worker processes together and of PostgreSQL's processes (from
/proc, as bench_postgres.py reads them). Nothing here asserts on timing; the exit status is
non-zero only when a measurement is invalid.

    python tests/bench/bench_limits.py [--n N] [--rounds R] [--concurrency C] [--quick]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import harness
from bench_delivery import Row, progress, render, running_receiver
from bench_postgres import ADMIN_DSN, Drain, drop_stale_databases, median_of, outbox_drain, server_facts, us
from harness import BenchError

from outbox.flow import RateLimit

PROCESSES = 3
#: Limits that never bind at these rates: the limiter does all its work and holds nothing back.
CASES = {"unlimited": {}, "rate_limit": {"rate_limit": RateLimit(per_second=100_000, burst=100_000)},
         "max_in_flight": {"max_in_flight": 100_000}}


async def run(args: argparse.Namespace) -> int:
    n = args.n or (1_000 if args.quick else 5_000)
    rounds = args.rounds or (1 if args.quick else 3)
    c = args.concurrency
    problems: list[str] = []
    began = time.perf_counter()
    facts = await server_facts(args.pg)
    await drop_stale_databases(args.pg)
    print(f"Flow control on PostgreSQL (N={n:,} per drain, {rounds} round{'s' * (rounds > 1)}, {PROCESSES} "
          f"worker processes of concurrency {c}, a fresh database per drain)")
    print(f"{harness.machine_summary()}; {facts}\n", flush=True)
    drains: dict[str, list[Drain]] = {key: [] for key in CASES}  # by case
    ratios: dict[str, list[float]] = {key: [] for key in CASES if key != "unlimited"}
    with tempfile.TemporaryDirectory(prefix="bench-limits-") as tmp:
        root = Path(tmp)
        async with running_receiver(root) as receiver:
            for round_ in range(1, rounds + 1):
                got: dict[str, Drain] = {}
                shift = (round_ - 1) % len(CASES)
                order = [*CASES][shift:] + [*CASES][:shift]
                for key in order:
                    workdir = harness.fresh_dir(root, key)
                    try:
                        got[key] = await outbox_drain(args.pg, receiver, n, c, PROCESSES, workdir,
                                                      f"/{key}-r{round_}", **CASES[key])
                    except BenchError as exc:
                        problems.append(f"round {round_}, {key}: {exc}")
                        print(f"round {round_}: {key}: FAILED: {exc}", flush=True)
                        continue
                    finally:
                        shutil.rmtree(workdir, ignore_errors=True)
                    drains[key].append(got[key])
                    progress(f"round {round_}", key, f"{got[key].rate:>9,.0f} deliveries/s")
                for key, kept in ratios.items():
                    if key in got and "unlimited" in got:
                        kept.append(got[key].rate / got["unlimited"].rate)
    rows = []
    for key, runs in drains.items():
        if runs:
            rows.append(Row(f"{key}, {PROCESSES} processes", f"{statistics.median(d.rate for d in runs):,.0f}",
                            "deliveries/s", "1.00x" if key == "unlimited" else ""))
            rows.append(Row("  worker CPU per delivery (all three)",
                            us(median_of([d.per_delivery_us(d.worker_cpu) for d in runs])), "us"))
            rows.append(Row("  PostgreSQL CPU per delivery",
                            us(median_of([d.per_delivery_us(d.postgres_cpu) for d in runs])), "us"))
    for key, kept in ratios.items():
        if kept:
            median, spread = harness.fmt_ratio(kept)
            rows.append(Row(f"{key} / unlimited, same round", "", "", median, spread, ">= 0.90x",
                            "met" if statistics.median(kept) >= 0.9 else "NOT MET"))
    print()
    print(render(rows, ("case", "value", "unit", "ratio", "spread", "target", "")))
    return harness.finish(began, problems)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = harness.new_parser(__doc__)
    add = parser.add_argument
    add("--n", type=int, help="intents per drain (5,000; --quick 1,000)")
    add("--rounds", type=int, help="rounds of both drains (3; --quick 1)")
    add("--concurrency", type=int, default=64, help="sends in flight per worker process (64)")
    add("--quick", action="store_true", help="a short run: N=1,000, one round")
    add("--pg", default=ADMIN_DSN, help=f"the server's administrative DSN ({ADMIN_DSN}; env OUTBOX_TEST_PG_DSN)")
    args = parser.parse_args(argv)
    harness.require_positive(parser, args, ("n", "rounds", "concurrency"))
    return args


def main(argv: list[str] | None = None) -> int:
    return harness.run_main(run(parse_args(argv)), uvloop=False)


if __name__ == "__main__":
    sys.exit(main())
