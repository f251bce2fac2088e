"""The NATS servers the tests use: the machine's shared one (JetStream on 127.0.0.1:4222), where
each test makes a stream of its own and deletes it after, and private ``nats-server -js``
processes on a free port with their own store directory, for a test that kills or reconfigures
one (the shared server is never stopped).

    async with Stream.made() as stream:       # stream.name, stream.subject on the shared server
        ...
    server = NatsServer(tmp_path).start()     # a private server; server.url
    server.stop()                             # SIGKILL, as a crash
    server.start()                            # the same port and store directory

``InfoProxy`` stands in front of a server as a hostile one would: it forwards every byte, except
that the server's INFO advertises another address as a server of its cluster (``connect_urls``)
and, given ``strip_tls``, no longer says the server requires TLS (as an attacker on the path would);
it keeps what the client sent (``sent``), and can hold the server's bytes back (``pause()``).

A server that does not answer FAILS the test under ``CI=true`` and skips it elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.js.api import StreamConfig

from tests.conftest import free_port

SHARED = "nats://127.0.0.1:4222"
#: How long a server may take to accept connections (a private one takes milliseconds; CI may be slow).
START_SECONDS = 20.0


def unavailable(message: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


async def connect(url: str = SHARED) -> Client:
    """A plain client of ``url`` (the tests' own look at what a stream holds)."""
    try:
        return await nats.connect(url, connect_timeout=5, allow_reconnect=False, max_reconnect_attempts=1)
    except Exception as exc:  # any failure to reach it: the server is not there
        unavailable(f"no NATS server answers at {url}: {exc!r}")
        raise


@dataclass
class Stream:
    """A stream of the test's own (a random name) storing ``subject``, on the server at ``url``."""

    name: str
    subject: str
    url: str

    @classmethod
    @contextlib.asynccontextmanager
    async def made(cls, url: str = SHARED, **config: Any) -> AsyncIterator[Stream]:
        """A new stream, deleted when the block ends."""
        name = f"outbox_test_{secrets.token_hex(6)}"
        stream = cls(name, f"{name}.orders", url)
        client = await connect(url)
        try:
            await client.jetstream().add_stream(StreamConfig(name=name, subjects=[stream.subject], **config))
        finally:
            await client.close()
        try:
            yield stream
        finally:  # (on a connection of its own: the server may have been restarted meanwhile)
            client = await connect(url)
            with contextlib.suppress(Exception):
                await client.jetstream().delete_stream(name)
            await client.close()

    async def messages(self) -> list[Any]:
        """Every message the stream holds, in order (read by sequence, no consumer left behind)."""
        client = await connect(self.url)
        try:
            js = client.jetstream()
            state = (await js.stream_info(self.name)).state
            return [await js.get_msg(self.name, seq) for seq in range(state.first_seq, state.last_seq + 1)
                    if state.messages]
        finally:
            await client.close()


class NatsServer:
    """One private ``nats-server -js`` on 127.0.0.1, its store under ``workdir``."""

    def __init__(self, workdir: Path, *, extra: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.address = f"127.0.0.1:{self.port}"
        self.store = workdir / f"nats-{self.port}"
        self.log_path = workdir / f"nats-{self.port}.log"
        self.extra = extra
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> NatsServer:
        """Start the server and wait until it accepts connections."""
        binary = shutil.which("nats-server")
        if binary is None:
            unavailable("nats-server is not installed")
        assert binary is not None
        self.store.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [binary, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.store), *self.extra],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        unavailable(f"nats-server did not start on port {self.port}: {self.log_path.read_text(errors='replace')}")
        return self

    def stop(self) -> None:
        """Kill the server (SIGKILL, as a crash would) and wait for it to be gone."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        self.process = None


class InfoProxy:
    """A TCP proxy on ``host`` in front of the server at ``target`` (host, port) that rewrites the
    server's INFO lines to advertise ``advertised`` (host:port) as a server of its cluster, and
    can drop every connection (``drop()``)."""

    def __init__(self, target: tuple[str, int], host: str, advertised: str, *, strip_tls: bool = False) -> None:
        self.target, self.host, self.advertised, self.strip_tls = target, host, advertised, strip_tls
        self.rewritten = 0
        self.connections = 0
        self.closed = 0  # the connections the client closed
        self.sent = bytearray()  # every byte the clients sent
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def __aenter__(self) -> InfoProxy:
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        self.drop()
        with contextlib.suppress(Exception):
            await self._server.wait_closed()

    @property
    def open(self) -> int:
        """The connections the client has not closed."""
        return self.connections - self.closed

    def pause(self) -> None:
        """Hold back the server's bytes (a new connection waits for its INFO) until ``resume()``."""
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def drop(self) -> None:
        """Close every connection the proxy carries (as a server gone)."""
        for writer in list(self._writers):
            writer.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers |= {writer, up_writer}

        async def down() -> None:  # the server's lines, INFO rewritten (after a TLS upgrade, its bytes as they come)
            while line := await up_reader.readline():
                await self._flowing.wait()
                if line.startswith(b"INFO "):
                    info = json.loads(line[5:])
                    info["connect_urls"] = [self.advertised]
                    tls = info.get("tls_required", False)
                    if self.strip_tls:
                        info.pop("tls_required", None)
                    line = b"INFO " + json.dumps(info).encode() + b"\r\n"
                    self.rewritten += 1
                    if tls:
                        writer.write(line)
                        while data := await up_reader.read(65536):
                            writer.write(data)
                            await writer.drain()
                        return
                writer.write(line)
                await writer.drain()

        async def up() -> None:
            while data := await reader.read(65536):
                self.sent += data
                up_writer.write(data)
                await up_writer.drain()
            self.closed += 1

        with contextlib.suppress(Exception):
            await asyncio.gather(down(), up())
        for w in (writer, up_writer):
            w.close()
            self._writers.discard(w)
