"""The Redis servers the Redis channel's tests write to.

- ``shared_redis``: the machine's Redis on 127.0.0.1:6379, shared with every other test run: a test
  writes only streams and keys of its own (``Names``: a random suffix) and deletes them after,
  never anything else (no FLUSHALL, no CONFIG SET).
- ``RedisServer``: a private ``redis-server`` on a free port, its data (an append-only file
  fsynced at every write, so an entry it acknowledged survives a SIGKILL) in a directory under
  the test's ``tmp_path``: the test that kills and restarts a server kills this one.

    server = RedisServer(tmp_path).start()
    server.stop()            # SIGKILL, as a crash
    server.start()           # the same port and data directory

A server that is missing or does not start FAILS the test under ``CI=true`` and skips it elsewhere.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError

from tests.conftest import free_port

SHARED = ("127.0.0.1", 6379)
#: How long a server may take to accept connections (milliseconds, here).
START_SECONDS = 15.0


def unavailable(message: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@dataclass
class Names:
    """Stream names of one test's own, each with the test's random suffix; ``cleanup`` deletes
    them and their dedupe keys."""

    suffix: str = field(default_factory=lambda: secrets.token_hex(6))
    made: list[str] = field(default_factory=list)

    def stream(self, name: str = "orders") -> str:
        stream = f"test-{name}-{self.suffix}"
        self.made.append(stream)
        return stream

    async def cleanup(self, client: Redis) -> None:
        for stream in self.made:
            keys = [key async for key in client.scan_iter(match=f"{{{stream}}}:*", count=1000)]
            await client.delete(stream, *keys)


@pytest.fixture
async def shared_redis() -> AsyncIterator[tuple[Redis, Names]]:
    """A client of the shared Redis and the names this test may use (deleted after)."""
    client = Redis(host=SHARED[0], port=SHARED[1])
    try:
        await client.ping()
    except (OSError, RedisError) as exc:  # the server is not there
        await client.aclose()
        unavailable(f"no Redis at {SHARED[0]}:{SHARED[1]}: {exc}")
    names = Names()
    try:
        yield client, names
    finally:
        await names.cleanup(client)
        await client.aclose()


class RedisServer:
    """A private redis-server on 127.0.0.1, append-only with an fsync per write; with ``tls`` (a
    certificate and its key, in PEM files), it takes TLS connections only, on ``port``."""

    def __init__(self, workdir: Path, *, tls: tuple[Path, Path] | None = None) -> None:
        self.port = free_port()
        self.data_dir = workdir / f"redis-{self.port}"
        self.log_path = workdir / f"redis-{self.port}.log"
        self.listen = ["--port", str(self.port)] if tls is None else [
            "--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(tls[0]), "--tls-key-file", str(tls[1]),
            "--tls-auth-clients", "no"]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            unavailable("redis-server is not installed")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [str(binary), "--bind", "127.0.0.1", *self.listen, "--dir", str(self.data_dir), "--appendonly", "yes",
             "--appendfsync", "always", "--save", "", "--protected-mode", "no"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        unavailable(f"redis-server did not start on port {self.port}: "
                    f"{self.log_path.read_text(errors='replace')[-2000:]}")
        return self

    def stop(self) -> None:
        """SIGKILL the server (what it had not written to its append-only file is lost) and wait."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(10)
        self.process = None

    def client(self) -> Redis:
        return Redis(host="127.0.0.1", port=self.port)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A running private RedisServer, killed after the test."""
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()
