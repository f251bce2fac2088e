"""What the benchmark scripts beside this file share: server subprocesses, load, CPU and reporting.

``bench_enqueue.py``, ``bench_delivery.py`` and ``bench_receivers.py`` each start servers in
subprocesses, drive them from pooled aiohttp workers and print a table of ratios; this module
holds that machinery once, so that the scripts keep only what they measure. They run as scripts
(``python tests/bench/bench_X.py``), which puts this directory on ``sys.path`` for
``import harness``; pytest collects nothing here (the name does not match ``test_*.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from itertools import count
from pathlib import Path
from typing import Any

import aiohttp

SERVER_START_SECONDS = 30.0
SERVER_STOP_SECONDS = 10.0
REQUEST_TIMEOUT_SECONDS = 30.0
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class BenchError(Exception):
    """The measurement is invalid (not merely slow)."""


# -- server subprocesses -----------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file, or a note saying there are none."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def key_file() -> Path:
    """The key file that seals the benchmarks' destination secrets on PostgreSQL (which needs one
    from the operator), made once per run."""
    global _key_file
    if _key_file is None:
        from outbox.keyring import generate_key, write_keys

        _key_file = Path(tempfile.mkdtemp(prefix="bench-key-")) / "secrets.key"
        write_keys(_key_file, [generate_key()], replace=False)
    return _key_file


_key_file: Path | None = None


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any ``OUTBOX_*`` variable, plus ``extra``; a PostgreSQL
    database URL comes with the run's secrets key file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    if extra.get("OUTBOX_DATABASE_URL", "").startswith("postgres"):
        env["OUTBOX_SECRETS_KEY_FILE"] = str(key_file())
    return {**env, **extra}


def spawn(cmd: list[str], *, cwd: Path, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``cmd`` with its output in ``log``, in ``clean_env()`` unless ``env`` is given."""
    with log.open("wb") as sink:
        return subprocess.Popen(cmd, env=clean_env() if env is None else env, cwd=cwd, stdout=sink,
                                stderr=subprocess.STDOUT)


def stop_process(proc: subprocess.Popen[bytes]) -> bool:
    """SIGTERM a running process, SIGKILL it after SERVER_STOP_SECONDS; True if it was killed."""
    if proc.poll() is not None:
        return False
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(SERVER_STOP_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return True
    return False


@contextmanager
def serving(
    cmd: list[str], *, cwd: Path, log: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run a server subprocess, and always stop it: SIGTERM, then SIGKILL after a timeout."""
    proc = spawn(cmd, cwd=cwd, log=log, env=env)
    try:
        yield proc
    finally:
        stop_process(proc)


def check_alive(proc: subprocess.Popen[bytes] | None, log: Path, name: str) -> None:
    """Raise BenchError, with the tail of ``log``, if the process ``name`` is not running."""
    if proc is None or proc.poll() is not None:
        code = None if proc is None else proc.returncode
        raise BenchError(f"{name} exited with status {code}:\n{log_tail(log)}")


async def wait_ready(url: str, alive: Callable[[], None], log: Path, late: str | None = None) -> None:
    """Poll ``url`` until it answers 200, calling ``alive`` between tries; BenchError when late."""
    deadline = time.monotonic() + SERVER_START_SECONDS
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as session:
        while True:
            alive()
            try:
                async with session.get(url) as response:
                    if response.status == 200:
                        return
            except (TimeoutError, aiohttp.ClientError):
                pass
            if time.monotonic() > deadline:
                said = late or f"{url} did not answer 200"
                raise BenchError(f"{said} in {SERVER_START_SECONDS:.0f} s:\n{log_tail(log)}")
            await asyncio.sleep(0.05)


def process_cpu(pid: int) -> float | None:
    """User + system CPU seconds of a process, all its threads (Linux /proc), else None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


# -- load --------------------------------------------------------------------------------------


def client_session(limit: int) -> aiohttp.ClientSession:
    """A pooled aiohttp session: ``limit`` connections, REQUEST_TIMEOUT_SECONDS per request."""
    connector = aiohttp.TCPConnector(limit=limit)
    return aiohttp.ClientSession(connector=connector,
                                 timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS))


async def fan_out(workers: int, first: int, stop: int, one: Callable[[int], Awaitable[bool]]) -> tuple[int, float]:
    """``one(i)`` for i in first..stop-1 from ``workers`` tasks: (how many were True, seconds)."""
    tickets = count(first)
    ok = 0

    async def worker() -> None:
        nonlocal ok
        while (i := next(tickets)) < stop:
            if await one(i):  # not `ok += await ...`: that reads ok before awaiting
                ok += 1

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return ok, time.perf_counter() - began


# -- running and reporting ---------------------------------------------------------------------


def channel_sends(channel: Any, destination: Any, intents: Sequence[Any]
                  ) -> tuple[Callable[[int], Awaitable[bool]], Counter[str]]:
    """For a channel measured alone: a ``fan_out`` task sending ``intents[i]`` through ``channel``
    (True when delivered), and the failures it counts by error."""
    from outbox.ids import uuid7

    failures: Counter[str] = Counter()

    async def one(i: int) -> bool:
        result = await channel.send(intents[i], destination, attempt_id=uuid7(), fence=1)
        if result.outcome.value == "delivered":
            return True
        failures[result.error or result.outcome.value] += 1
        return False

    return one, failures


def fresh_dir(root: Path, name: str) -> Path:
    """A new empty directory under ``root``, named ``name-`` and a random suffix."""
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))


def machine_summary() -> str:
    """CPUs, SQLite and Python versions, for the second line of a benchmark's header."""
    return f"{os.cpu_count()} CPUs, SQLite {sqlite3.sqlite_version}, Python {platform.python_version()}"


def fmt_ratio(ratios: list[float], places: int = 2) -> tuple[str, str]:
    """(median, spread) of per-round ratios as text; the spread only with two rounds or more."""
    if not ratios:
        return "", ""
    median = f"{statistics.median(ratios):.{places}f}x"
    spread = f"{min(ratios):.2f}-{max(ratios):.2f}x" if len(ratios) > 1 else ""
    return median, spread


def render_table(lines: Sequence[Sequence[str]], right: Collection[int]) -> str:
    """Lines of cells (the header first) as aligned columns; the ``right`` ones right-aligned."""
    widths = [max(len(line[c]) for line in lines) for c in range(len(lines[0]))]
    out = []
    for line in lines:
        cells = [cell.rjust(width) if column in right else cell.ljust(width)
                 for column, (cell, width) in enumerate(zip(line, widths, strict=True))]
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)


def new_parser(doc: str | None) -> argparse.ArgumentParser:
    """An argument parser described by the first paragraph of a script's docstring."""
    return argparse.ArgumentParser(description=doc.split("\n\n")[0] if doc else None)


def require_positive(parser: argparse.ArgumentParser, args: argparse.Namespace, names: Sequence[str]) -> None:
    """``parser.error`` for the first of the options ``names`` (attribute names) given below 1."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive")


def finish(began: float, problems: list[str]) -> int:
    """Print the total time and each problem (to stderr); the exit status: 1 if any problem."""
    print(f"total time {time.perf_counter() - began:.0f} s")
    for problem in problems:
        print(f"INVALID: {problem}", file=sys.stderr)
    return 1 if problems else 0


def run_main(main: Coroutine[Any, Any, int], uvloop: bool) -> int:
    """Run ``main`` to completion on uvloop or on the default asyncio loop."""
    if uvloop:
        import uvloop as loop

        return loop.run(main)
    return asyncio.run(main)
