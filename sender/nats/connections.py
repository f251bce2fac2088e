"""The NATS channel's connections: one per destination (as its settings read now), opened by its
first send through the SSRF guard, and replaced when the destination changes or the connection
closes.

Each server's name is resolved by ``sender.guard``, which drops the addresses a destination
without ``allow_private_network`` may not reach; nats-py is handed one checked address at a
time (so the address connected to is the one checked) with the server's name for TLS, whose
certificate is verified against that name. A server's INFO may advertise other servers of its
cluster (``connect_urls``), any address a hostile server likes: nats-py adds them to its pool
only for reconnecting, and reconnecting is off, so no discovered server is ever connected to. A
connection that closes is replaced by the next send, which connects to the destination's own
servers again.

A destination's change (its ``updated_at``) replaces its connection, but the replaced one is closed
only once the sends holding it (counted from when they take it, before it is opened) are answered:
closing it under them would turn their PubAcks into unknowns, and a connection one of them was still
opening would otherwise outlive its entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import nats
import nats.errors
from nats.aio.client import AUTHORIZATION_VIOLATION, Client

from outbox import Destination, Outcome

from .. import credentials, guard
from ..channel import describe
from .acks import Acks
from .spec import NatsSpec


class Refused(Exception):
    """No connection: nothing of the attempt was written (``stage`` connect)."""

    def __init__(self, outcome: Outcome, error: str) -> None:
        super().__init__(error)
        self.outcome, self.error = outcome, error


@dataclass
class Connection:
    """One destination's connection (as its settings read now), opened by its first send."""

    spec: NatsSpec
    version: datetime  # the destination's updated_at it was made for
    client: Client | None = None
    acks: Acks | None = None  # its acknowledgements' inbox, subscribed once connected
    opening: asyncio.Lock = field(default_factory=asyncio.Lock)
    in_flight: int = 0  # the sends holding it
    retired: bool = False  # replaced (or the channel closed): closed when no send holds it
    #: The destination's secrets as last seen, and the signing secrets among them (split once).
    signing: tuple[tuple[str, ...], tuple[str, ...]] = field(default=((), ()), repr=False)


class TlsClient(Client):
    """A client that upgrades to TLS whatever the server's INFO says: nats-py upgrades only when the
    INFO asks (``tls_required``), which a server that allows plaintext, or anyone on the path, leaves
    out, and the CONNECT (with the password or token) would then go in the clear. A server that does
    not speak TLS fails the handshake, before anything is written."""

    async def _process_info(self, info: dict[str, Any], initial_connection: bool = False) -> None:
        info["tls_required"] = self._server_info["tls_required"] = True
        await super()._process_info(info, initial_connection)


class Connections:
    """The connections of a channel's destinations, by destination id."""

    def __init__(self, *, tls_context: ssl.SSLContext | None = None) -> None:
        self._tls = tls_context  # None until first needed: the system's trusted CAs, verified
        self._entries: dict[str, Connection] = {}

    @contextlib.asynccontextmanager
    async def held(self, destination: Destination) -> AsyncIterator[Connection]:
        """The destination's entry, held by one send for the block; a change of the destination (its
        ``updated_at``) replaces it, and the replaced one's connection is closed once no send holds
        it. Raises ValidationError for settings today's rules refuse."""
        entry, replaced = self._entries.get(destination.id), None
        if entry is None or entry.version != destination.updated_at:
            spec = NatsSpec.model_validate({**destination.settings, "channel": "nats",
                                            "allow_private_network": destination.allow_private_network})
            replaced, entry = entry, Connection(spec, destination.updated_at)
            self._entries[destination.id] = entry
        entry.in_flight += 1
        try:
            if replaced is not None:
                await self._retire(replaced)
            yield entry
        finally:
            entry.in_flight -= 1
            if entry.retired and entry.in_flight == 0:
                await self.discard(entry)

    async def _retire(self, entry: Connection) -> None:
        """No new send takes the entry; its connection is closed now if no send holds it, else by the last."""
        entry.retired = True
        if entry.in_flight == 0:
            await self.discard(entry)

    async def opened(self, entry: Connection, destination: Destination) -> tuple[Client, Acks]:
        """The entry's connection and its acknowledgements, connected now if it is not (or closed).
        Raises Refused."""
        if entry.client is not None and not entry.client.is_closed and entry.acks is not None:
            return entry.client, entry.acks  # (the common case, without waiting for the lock)
        async with entry.opening:
            if entry.client is not None and not entry.client.is_closed and entry.acks is not None:
                return entry.client, entry.acks
            spec = entry.spec
            _, secret = credentials.split(destination.secrets)
            if spec.auth != "none" and secret is None:
                raise Refused(Outcome.REJECTED, f"the destination authenticates with a {spec.auth} but holds none")
            errors: list[str] = []
            for server in spec.servers:
                host, _, port = server.rpartition(":")
                host = host.strip("[]")
                try:
                    found = await guard.addresses(host, int(port), allow_private=destination.allow_private_network,
                                                  timeout=destination.timeout_seconds)
                except guard.PrivateAddressRefused as exc:
                    errors.append(exc.explain())
                    continue
                except (OSError, TimeoutError) as exc:
                    errors.append(f"{host} does not resolve: {describe(exc)}")
                    continue
                for *_, address in found:
                    acks = Acks()
                    try:
                        client = await self._connect(spec, destination, host, address[0], int(port), secret, acks)
                    except (OSError, TimeoutError, nats.errors.Error) as exc:
                        errors.append(f"{address[0]}:{port} ({host}): {describe(exc)}")
                        continue
                    try:
                        await acks.start(client)
                    except (OSError, nats.errors.Error) as exc:
                        await close(client)
                        errors.append(f"{address[0]}:{port} ({host}): {describe(exc)}")
                        continue
                    entry.client, entry.acks = client, acks
                    return client, acks
            outcome = Outcome.REJECTED if all(error.startswith("refused:") for error in errors) else Outcome.RETRYABLE
            raise Refused(outcome, "no server took the connection: " + "; ".join(errors))

    async def _connect(self, spec: NatsSpec, destination: Destination, host: str, address: str, port: int,
                       secret: str | None, acks: Acks) -> Client:
        """A connection to ``address`` (checked by the guard), verifying TLS against ``host``, that
        tells ``acks`` when it closes. Raises Refused when the server refuses the credentials."""
        client = TlsClient() if spec.tls else Client()
        where = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
        timeout = destination.timeout_seconds

        async def quiet(exc: Exception) -> None:  # (the attempt records the error; nats-py would log each)
            pass

        try:
            await asyncio.wait_for(client.connect(
                servers=[f"nats://{where}"], name="outbox", allow_reconnect=False, max_reconnect_attempts=1,
                reconnect_time_wait=0, connect_timeout=timeout,  # type: ignore[arg-type]  # (seconds, as a float)
                flush_timeout=timeout,  # (a forced flush, its buffer over 2 MiB, waits no longer on a stalled server)
                tls=self._context() if spec.tls else None, tls_hostname=host if spec.tls else None,
                user=spec.username if spec.auth == "password" else None,
                password=secret if spec.auth == "password" else None,
                token=secret if spec.auth == "token" else None, error_cb=quiet, closed_cb=acks.closed,
            ), timeout)
        except nats.errors.NoServersError:
            await close(client)
            raise nats.errors.Error(f"nats: {client.last_error!r}") from None
        except BaseException as exc:
            await close(client)
            if isinstance(exc, nats.errors.AuthorizationError) or AUTHORIZATION_VIOLATION in str(exc).lower():
                raise Refused(Outcome.REJECTED, f"{host} refused the destination's credentials: "
                                                f"{describe(exc)}") from None
            raise
        return client

    def _context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    async def discard(self, entry: Connection, client: Client | None = None) -> None:
        """Close the entry's connection, so the next send opens a new one; given ``client``, only
        if that is still the entry's."""
        if entry.client is None or (client is not None and entry.client is not client):
            return
        closing, entry.client, entry.acks = entry.client, None, None
        await close(closing)

    async def aclose(self) -> None:
        entries, self._entries = list(self._entries.values()), {}
        for entry in entries:
            await self._retire(entry)


async def close(client: Client) -> None:
    try:
        await asyncio.wait_for(client.close(), 5)
    except (nats.errors.Error, TimeoutError, OSError):
        pass
