"""The RabbitMQ the tests publish to: the machine's shared broker (127.0.0.1:5672, guest/guest),
which other test runs use at the same time. Each test works under names of its own (a random
suffix) and deletes what it declared; none stops, restarts or purges anything else.

    rabbit = await Rabbit.open()               # (the ``rabbit`` fixture, tests/conftest.py)
    await rabbit.bind("orders")                # a queue bound to the test's exchange for "orders"
    [message] = await rabbit.messages()        # what the queue holds, read by a plain aio-pika consumer

``TcpProxy`` stands between the channel and the broker, forwarding bytes both ways until it is
told to ``drop`` (every connection closed, none accepted) and later to ``accept`` again: a broker
gone and back, without touching the shared one. ``answering.clear()`` holds the broker's bytes
(its confirms) back while the client's still go in; ``drop_at_publish`` drops every connection
once a chunk carrying a ``basic.publish`` has been forwarded. With ``tls`` it terminates TLS.

A broker that does not answer within ``START_SECONDS`` FAILS the test under ``CI=true`` and skips
it elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import ssl
import time
from typing import Any

import aio_pika
import pytest

HOST = "127.0.0.1"
PORT = int(os.environ.get("RABBITMQ_PORT", "5672"))
URL = f"amqp://guest:guest@{HOST}:{PORT}/"
#: How long the broker may take to accept connections (RabbitMQ takes 20-60 s to start on CI).
START_SECONDS = 60.0


def unavailable(message: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


class Rabbit:
    """A test's exchange and queues on the shared broker, deleted by ``aclose``."""

    def __init__(self, connection: aio_pika.abc.AbstractConnection, channel: aio_pika.abc.AbstractChannel) -> None:
        self.connection, self.channel = connection, channel
        self.suffix = secrets.token_hex(4)
        self.exchange = f"outbox-test-{self.suffix}"
        self.queue = f"outbox-test-{self.suffix}"
        self._queues: list[str] = []
        self._exchanges: list[str] = []

    @classmethod
    async def open(cls) -> Rabbit:
        """Connected to the shared broker, waiting up to ``START_SECONDS`` for it."""
        connection = await connect(time.monotonic() + START_SECONDS)
        return cls(connection, await connection.channel())

    async def declare_exchange(self, name: str | None = None) -> str:
        """A direct exchange (the test's own by default), durable."""
        name = name or self.exchange
        await self.channel.declare_exchange(name, aio_pika.ExchangeType.DIRECT, durable=True)
        self._exchanges.append(name)
        return name

    async def declare_queue(self, name: str | None = None, **arguments: Any) -> str:
        name = name or self.queue
        await self.channel.declare_queue(name, durable=True, arguments=arguments or None)
        self._queues.append(name)
        return name

    async def bind(self, routing_key: str, *, queue: str | None = None, **arguments: Any) -> str:
        """The test's queue (declared), bound to the test's exchange (declared) for ``routing_key``."""
        if self.exchange not in self._exchanges:
            await self.declare_exchange()
        name = queue or self.queue
        if name not in self._queues:
            await self.declare_queue(name, **arguments)
        await (await self.channel.get_queue(name)).bind(self.exchange, routing_key)
        return name

    async def messages(self, queue: str | None = None) -> list[aio_pika.abc.AbstractIncomingMessage]:
        """Every message the queue holds, taken off it (acknowledged)."""
        found = await self.channel.get_queue(queue or self.queue)
        got = []
        while (message := await found.get(no_ack=True, fail=False)) is not None:
            got.append(message)
        return got

    async def aclose(self) -> None:
        for queue in self._queues:
            with contextlib.suppress(Exception):
                await self.channel.queue_delete(queue)
        for exchange in self._exchanges:
            with contextlib.suppress(Exception):
                await self.channel.exchange_delete(exchange)
        await self.connection.close()


async def connect(deadline: float) -> aio_pika.abc.AbstractConnection:
    """A connection to the shared broker, retried until ``deadline`` (monotonic)."""
    while True:
        try:
            return await aio_pika.connect(URL, timeout=5)
        except (OSError, aio_pika.exceptions.AMQPError, TimeoutError) as exc:
            if time.monotonic() > deadline:
                unavailable(f"no RabbitMQ at {HOST}:{PORT}: {exc!r}")
            await asyncio.sleep(0.5)


class TcpProxy:
    """Forwards ``127.0.0.1:port`` to the broker until ``drop``; ``tls``: it terminates TLS."""

    def __init__(self, *, tls: ssl.SSLContext | None = None, upstream_port: int = PORT) -> None:
        self.tls, self.upstream_port = tls, upstream_port
        self.port = 0
        self.connections = 0
        self.open = 0  # the connections being forwarded now (closed by neither end)
        self.answering = asyncio.Event()  # set: the broker's bytes are forwarded
        self.answering.set()
        self.drop_at_publish = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> TcpProxy:
        await self.accept()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.drop()

    async def accept(self) -> None:
        """Listen (again, on the same port) and forward every connection accepted."""
        self._server = await asyncio.start_server(self._serve, HOST, self.port, ssl=self.tls, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def drop(self) -> None:
        """Close every connection and stop listening: the broker is gone for the channel."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(HOST, self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        self.open += 1
        try:
            await asyncio.gather(self._requests(reader, up_writer), self._answers(up_reader, writer),
                                 return_exceptions=True)
        finally:
            self.open -= 1
            for end in (writer, up_writer):
                end.transport.abort()
                self._writers.discard(end)

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
                if self.drop_at_publish and PUBLISH in data:
                    self.drop_at_publish = False
                    await self.drop()
        finally:
            writer.transport.abort()

    async def _answers(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                await self.answering.wait()
                writer.write(data)
                await writer.drain()
        finally:
            writer.transport.abort()


#: The start of a ``basic.publish`` method frame's payload: class 60 (basic), method 40 (publish).
PUBLISH = b"\x00\x3c\x00\x28"
