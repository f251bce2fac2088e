"""The RabbitMQ channel's links: one AMQP connection and one channel with publisher confirms per
destination (as its settings read now), opened by its first send through the SSRF guard, shared
by every send to it, and replaced when it closes or the destination changes.

aiormq (the AMQP layer aio-pika is built on, installed with it) is used directly: its connection
takes a transport factory, through which the guard connects the socket itself; its channel
publishes with ``mandatory`` and reports a returned message as ``PublishError``."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import quote

import aiormq
from aiormq.abc import AbstractChannel
from aiormq.connection import TransportFactory
from aiormq.exceptions import (
    AMQPError,
    ChannelClosed,
    ChannelNotFoundEntity,
    ConnectionClosed,
    ProbableAuthenticationError,
)
from yarl import URL

from outbox import Destination, Outcome, Submission

from .. import credentials, guard
from ..channel import SendResult
from .spec import RabbitSpec


class Refused(Exception):
    """An attempt that ended before its message was published: nothing was submitted. ``answered``:
    the broker said why (credentials, a missing exchange), so its circuit does not count it."""

    def __init__(self, stage: str, outcome: Outcome, error: str, *, answered: bool = False) -> None:
        super().__init__(error)
        self.stage, self.outcome, self.error, self.answered = stage, outcome, error, answered

    def result(self) -> SendResult:
        return SendResult(Submission.NOT_SUBMITTED, self.outcome, error=self.error, stage=self.stage,
                          answered=self.answered)


class GuardedTransport(TransportFactory):
    """aiormq's transport, connected by ``sender.guard`` (the address connected to is the one
    checked); TLS verifies the broker's certificate against the URL's host name."""

    def __init__(self, spec: RabbitSpec, tls: ssl.SSLContext | None, *, allow_private: bool, timeout: float) -> None:
        self._spec, self._tls, self._allow_private, self._timeout = spec, tls, allow_private, timeout

    async def create(self, url: URL, **kwargs: Any) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host = self._spec.host
        sock = await guard.connect(host, self._spec.port, allow_private=self._allow_private, timeout=self._timeout)
        try:
            return await asyncio.open_connection(sock=sock, ssl=self._tls,
                                                 server_hostname=host if self._tls is not None else None)
        except BaseException:
            sock.close()
            raise


@dataclass
class Link:
    """One destination's connection and channel (as its settings read now), opened on first use."""

    spec: RabbitSpec
    version: datetime  # the destination's updated_at it was made for
    connection: aiormq.Connection | None = None
    channel: AbstractChannel | None = None
    opening: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: The destination's secrets as last seen, and the signing secrets among them (split once).
    signing: tuple[tuple[str, ...], tuple[str, ...]] = field(default=((), ()), repr=False)
    #: Sends holding it (from ``Links.link`` to ``Links.release``); a link retired (replaced) is
    #: closed once the last one ends, so that closing it cuts no confirm short, and whatever
    #: connection a send opened on it meanwhile is closed with it.
    in_flight: int = 0
    retired: bool = False

    @property
    def open(self) -> bool:
        return (self.connection is not None and not self.connection.is_closed
                and self.channel is not None and not self.channel.is_closed)


class Links:
    """The links of a channel's destinations, by destination id."""

    def __init__(self, *, tls_context: ssl.SSLContext | None = None) -> None:
        self._tls = tls_context  # None until first needed: the system's trusted CAs, verified
        self._links: dict[str, Link] = {}

    async def link(self, destination: Destination) -> Link:
        """The destination's link, held until ``release``; a change of the destination (its
        ``updated_at``) replaces it, the old one closed once its sends are answered. Raises
        pydantic's ValidationError for settings no longer valid."""
        link = self._links.get(destination.id)
        if link is None or link.version != destination.updated_at:
            spec = RabbitSpec.model_validate({**destination.settings, "channel": "rabbitmq",
                                              "allow_private_network": destination.allow_private_network})
            self._links[destination.id] = fresh = Link(spec, destination.updated_at)
            if link is not None:
                link.retired = True
                if not link.in_flight:
                    await close(link)
            link = fresh
        link.in_flight += 1
        return link

    async def release(self, link: Link) -> None:
        """A send held by ``link`` ended; the link closed if it was retired and this was its last."""
        link.in_flight -= 1
        if link.retired and not link.in_flight:
            await close(link)

    async def opened(self, link: Link, destination: Destination) -> AbstractChannel:
        """The link's channel, (re)opened when it is not open. Raises Refused."""
        if link.open:
            assert link.channel is not None
            return link.channel
        async with link.opening:
            if link.open:
                assert link.channel is not None
                return link.channel
            await close(link)
            link.connection = await self._connect(link.spec, destination)
            link.channel = await self._channel(link.spec, link.connection, destination.timeout_seconds)
            return link.channel

    async def _connect(self, spec: RabbitSpec, destination: Destination) -> aiormq.Connection:
        _, password = credentials.split(destination.secrets)
        if password is None:
            raise Refused("connect", Outcome.REJECTED, "the destination holds no password: give it as password")
        tls = self._context() if spec.tls else None
        timeout = destination.timeout_seconds
        connection = aiormq.Connection(connection_url(spec, password), transport_factory=GuardedTransport(
            spec, tls, allow_private=destination.allow_private_network, timeout=timeout))
        where = f"{spec.host}:{spec.port}"
        try:
            await asyncio.wait_for(connection.connect(), timeout)
        except guard.PrivateAddressRefused as exc:
            raise Refused("connect", Outcome.REJECTED, exc.explain()) from None
        except (ProbableAuthenticationError, ConnectionClosed) as exc:  # (the vhost's access refused, say)
            await shut(connection)
            raise Refused("connect", Outcome.RETRYABLE, f"the broker at {where} refused the connection of user "
                          f"{spec.username!r} to vhost {spec.vhost!r}: {describe(exc)}", answered=True) from None
        except (AMQPError, TimeoutError, OSError, ssl.SSLError) as exc:
            await shut(connection)
            raise Refused("connect", Outcome.RETRYABLE, f"no broker answered at {where}: {describe(exc)}") from None
        return connection

    @staticmethod
    async def _channel(spec: RabbitSpec, connection: aiormq.Connection, timeout: float) -> AbstractChannel:
        """A channel with publisher confirms, a returned message its publish's PublishError; the
        exchange checked to exist (a passive declare), since a publish to a missing one closes
        the channel."""
        try:
            channel = await asyncio.wait_for(connection.channel(publisher_confirms=True, on_return_raises=True),
                                             timeout)
            if spec.exchange:
                await asyncio.wait_for(channel.exchange_declare(spec.exchange, passive=True), timeout)
        except ChannelNotFoundEntity:
            await shut(connection)
            raise Refused("channel", Outcome.RETRYABLE, f"exchange {spec.exchange!r} does not exist in vhost "
                          f"{spec.vhost!r}: declare it (the outbox publishes to it, it does not create it)",
                          answered=True) from None
        except ChannelClosed as exc:  # the broker refused it (access to the exchange, say)
            await shut(connection)
            raise Refused("channel", Outcome.RETRYABLE, f"the broker refused the channel: {describe(exc)}",
                          answered=True) from None
        except (AMQPError, TimeoutError, OSError) as exc:
            await shut(connection)
            raise Refused("channel", Outcome.RETRYABLE, f"the broker did not open a channel: {describe(exc)}") \
                from None
        return channel

    def _context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    async def discard(self, link: Link, channel: AbstractChannel) -> None:
        """Close the link's connection if ``channel`` is still its channel, so the next send opens
        a new one (concurrent sends that saw it fail replace it once)."""
        if link.channel is channel:
            await close(link)

    async def aclose(self) -> None:
        """Close every link now (a send still under way closes its link again when it ends)."""
        links, self._links = list(self._links.values()), {}
        for link in links:
            link.retired = True
            await close(link)


def connection_url(spec: RabbitSpec, password: str) -> URL:
    """What aiormq is given: the destination's URL with the password (aiormq censors it when it
    shows the URL), the vhost as one path segment."""
    path = "/" if spec.vhost == "/" else "/" + quote(spec.vhost, safe="")
    return URL.build(scheme=spec.scheme, user=spec.username, password=password, host=spec.host, port=spec.port,
                     path=path, encoded=False)


async def close(link: Link) -> None:
    connection, link.connection, link.channel = link.connection, None, None
    if connection is not None:
        await shut(connection)


async def shut(connection: aiormq.Connection) -> None:
    with contextlib.suppress(AMQPError, TimeoutError, OSError):
        await asyncio.wait_for(connection.close(), 5)


def describe(exc: BaseException) -> str:
    text = str(exc) or repr(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:500]
