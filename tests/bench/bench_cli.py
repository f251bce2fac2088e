"""How long the ``outbox`` command takes to start: its ``--help``, a subcommand's help and a
shell's completion request, against ``python -c pass`` in the same run (the interpreter's own
start, the floor under every figure), rounds interleaved, medians of wall time.

The target is ``outbox --help`` and a completion request under 150 ms on these machines; the
ratio against ``python -c pass`` is what to compare across machines and loads. Nothing here
asserts on timing.

    python tests/bench/bench_cli.py [--rounds R] [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET_MS = 150
OUTBOX = shutil.which("outbox", path=str(Path(sys.executable).parent)) or "outbox"
COMPLETE = {"_OUTBOX_COMPLETE": "bash_complete", "COMP_WORDS": "outbox re", "COMP_CWORD": "1"}
CASES: dict[str, tuple[list[str], dict[str, str]]] = {
    "python -c pass": ([sys.executable, "-c", "pass"], {}),
    "outbox --help": ([OUTBOX, "--help"], {}),
    "outbox destinations put --help": ([OUTBOX, "destinations", "put", "--help"], {}),
    "completion of 'outbox re'": ([OUTBOX], COMPLETE),
}


def once(argv: list[str], env: dict[str, str]) -> float:
    """Seconds for one run of ``argv`` to its exit."""
    began = time.perf_counter()
    subprocess.run(argv, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, help="interleaved rounds (15; --quick 3)")
    parser.add_argument("--quick", action="store_true", help="3 rounds: a check that it runs")
    args = parser.parse_args()
    args.rounds = args.rounds or (3 if args.quick else 15)
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for argv, env in CASES.values():  # warm the file cache and the bytecode
        once(argv, env)
    for _ in range(args.rounds):
        for name, (argv, env) in CASES.items():
            times[name].append(once(argv, env))
    floor = statistics.median(times["python -c pass"])
    print(f"bench_cli: {args.rounds} rounds, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    print(f"{'case':<32} {'median':>9} {'x python':>9}  target")
    for name, samples in times.items():
        median = statistics.median(samples)
        target = "" if name.startswith("python") else f"<= {TARGET_MS} ms"
        print(f"{name:<32} {median * 1000:>6.0f} ms {median / floor:>8.1f}x  {target}")


if __name__ == "__main__":
    main()
