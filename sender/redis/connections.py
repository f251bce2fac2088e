"""One destination's connections to its Redis server: a redis-py pool whose connections are opened
through the SSRF guard, replaced when the destination changes.

redis-py opens a connection by resolving and connecting its host itself; ``GuardedConnection``
instead has ``sender.guard`` resolve the host, drop the addresses the guard refuses and connect
to one of the rest, and hands that socket to asyncio (TLS still verifies the server's
certificate against the host's name). So the check is on the address connected to, whatever
the DNS answers between a check and the connect. The pool reconnects a connection that broke
(the server closed it, or an attempt's answer was lost) before it is handed out again.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from redis.asyncio import Connection, ConnectionPool
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from outbox import Destination

from .. import credentials, guard
from .spec import RedisSpec


class GuardedConnection(Connection):
    """A redis-py connection whose socket ``sender.guard`` connects (``allow_private``: to any
    address), with TLS over it when ``tls`` is given, verified against the host's name."""

    def __init__(self, *, tls: ssl.SSLContext | None, allow_private: bool, **options: Any) -> None:
        super().__init__(**options)
        self._tls, self._allow_private = tls, allow_private

    async def _connect(self) -> None:
        timeout = self.socket_connect_timeout
        sock = await guard.connect(self.host, self.port, allow_private=self._allow_private, timeout=timeout or 10.0)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            async with asyncio.timeout(timeout):
                self._reader, self._writer = await asyncio.open_connection(
                    sock=sock, ssl=self._tls, server_hostname=self.host if self._tls is not None else None)
        except BaseException:
            sock.close()
            raise


@dataclass
class Client:
    """One destination's pool (as its settings and secrets read now) and its signing secrets."""

    spec: RedisSpec
    version: datetime  # the destination's updated_at it was made for
    secrets: tuple[str, ...] = field(repr=False)  # the destination's secrets it was made with
    signing: tuple[str, ...] = field(repr=False)
    password: str | None = field(repr=False)
    pool: ConnectionPool = field(repr=False)
    #: Sends holding it (from ``Clients.client`` to ``Clients.release``); a client retired
    #: (replaced) has its pool closed once the last one ends, so that closing it cuts no pipeline
    #: short, and whatever connection a send opened on it meanwhile is closed with it.
    in_flight: int = 0
    retired: bool = False


class Clients:
    """The pools of a channel's destinations, by destination id."""

    def __init__(self, *, tls_context: ssl.SSLContext | None = None) -> None:
        self._tls = tls_context  # None until first needed: the system's trusted CAs, verified
        self._clients: dict[str, Client] = {}

    async def client(self, destination: Destination) -> Client:
        """The destination's client, held until ``release``; a change of the destination (its
        ``updated_at``, or its secrets) replaces it, the old pool closed once its sends are
        answered. Raises ValidationError for settings stored before today's rules."""
        client = self._clients.get(destination.id)
        if client is not None and client.version == destination.updated_at and client.secrets == destination.secrets:
            client.in_flight += 1
            return client
        spec = RedisSpec.model_validate({**destination.settings, "channel": "redis",
                                         "allow_private_network": destination.allow_private_network})
        signing, password = credentials.split(destination.secrets)
        timeout = destination.timeout_seconds
        reading = timeout + (spec.wait_timeout_ms / 1000 if spec.wait_replicas is not None else 0)  # WAIT's reply
        pool = ConnectionPool(
            connection_class=GuardedConnection, host=spec.host, port=spec.port, db=spec.db, username=spec.username,
            password=password, socket_timeout=reading, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0),
            tls=self._context() if spec.tls else None,
            allow_private=destination.allow_private_network)
        self._clients[destination.id] = fresh = Client(spec, destination.updated_at, destination.secrets, signing,
                                                       password, pool)
        fresh.in_flight += 1
        if client is not None:
            client.retired = True
            if not client.in_flight:
                await client.pool.aclose()
        return fresh

    async def release(self, client: Client) -> None:
        """A send held by ``client`` ended; its pool closed if it was retired and this was its last."""
        client.in_flight -= 1
        if client.retired and not client.in_flight:
            await client.pool.aclose()

    def _context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    async def aclose(self) -> None:
        """Close every pool now (a send still under way closes its pool again when it ends)."""
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.retired = True
            await client.pool.aclose()
