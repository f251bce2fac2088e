"""aiokafka's connections through the SSRF guard, for the producers of the Kafka channel.

A destination without ``allow_private_network`` never opens a TCP connection to an address the
guard refuses, whether its bootstrap servers name it or the brokers of its
metadata do (a hostile broker can name any address). aiokafka opens its connections itself and
has no hook for it (kafkajs has a socket factory, librdkafka a connect callback), so this module
puts one where every connection of aiokafka's is made, its connection factory
``aiokafka.client.create_conn``: for a guarded producer the broker's name is resolved and
connected by ``sender.guard`` (the address connected to is the one checked), and aiokafka is
handed that socket. Which producer a connection is for is in a context variable, set around each
send and so inherited by the tasks aiokafka starts for the producer; aiokafka used by anything
else in the process connects as it always does. Importing this module installs the factory.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import aiokafka.client
from aiokafka.conn import AIOKafkaConnection, create_conn

from .. import guard


@dataclass
class Guard:
    """The SSRF guard of one destination's producer, which every connection it opens goes
    through; it keeps what it refused, for the attempt to say so."""

    timeout: float
    refused: dict[tuple[str, int], str] = field(default_factory=dict)

    async def connect(self, host: str, port: int) -> socket.socket:
        try:
            return await guard.connect(host, port, allow_private=False, timeout=self.timeout)
        except guard.PrivateAddressRefused as exc:
            self.refused[(host, port)] = exc.explain()
            raise


#: The guard of the producer whose work runs in this context: set around each send, and so
#: inherited by the tasks aiokafka starts for the producer. None: not guarded.
GUARD: ContextVar[Guard | None] = ContextVar("kafka_guard", default=None)


class _Connected:
    """The running loop as one guarded AIOKafkaConnection sees it while it connects: its
    ``create_connection`` takes the socket the guard connected instead of resolving and connecting
    the broker's name again; TLS still verifies the certificate against that name."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        self._loop = loop
        self._sock: socket.socket | None = sock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loop, name)

    async def create_connection(self, factory: Callable[[], asyncio.Protocol], host: str, port: int, *,
                                ssl: ssl.SSLContext | None = None) -> tuple[asyncio.Transport, asyncio.Protocol]:
        sock, self._sock = self._sock, None  # the transport owns it from here, closing it on failure
        assert sock is not None, "one connection per socket"
        return await self._loop.create_connection(factory, sock=sock, ssl=ssl,
                                                  server_hostname=host if ssl is not None else None)

    def close_unused(self) -> None:
        if self._sock is not None:
            self._sock.close()


async def _create_conn(host: str, port: int, **options: Any) -> AIOKafkaConnection:
    """aiokafka's connection factory, through which it opens every connection (bootstrap servers
    and the brokers metadata names), with the SSRF guard of the producer it connects for."""
    checking = GUARD.get()
    if checking is None:
        return await create_conn(host, port, **options)
    connected = _Connected(asyncio.get_running_loop(), await checking.connect(host, port))
    conn = AIOKafkaConnection(host, port, **options)
    conn._loop = connected
    try:
        await conn.connect()
    finally:
        conn._loop = connected._loop
        connected.close_unused()
    return conn


aiokafka.client.create_conn = _create_conn
