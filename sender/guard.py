"""The SSRF guard's own connect, for channels whose client takes a socket connected elsewhere
(email, Kafka), and the addresses it allows, for a client handed an address to connect to (NATS):
a host is resolved here, its addresses the guard refuses are dropped, and one of the rest is
connected to. The check is on the address connected to, so neither a spelling of the host nor a
DNS answer that changes between a check and the connect gets past it. (Webhooks use aiohttp's
resolver and socket factory for the same rule.)
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from . import hosts


class PrivateAddressRefused(OSError):
    """The SSRF guard refused a connection: the destination resolves only to non-public
    addresses, or the address about to be connected to is not public."""

    def explain(self) -> str:
        """What an attempt records: the refusal and how to lift it."""
        return f"refused: {self.args[0]} and the destination does not allow the private network"


Address = tuple[socket.AddressFamily, socket.SocketKind, int, str, tuple[Any, ...]]


async def addresses(host: str, port: int, *, allow_private: bool, timeout: float) -> list[Address]:
    """The addresses of ``host`` the guard allows (any, with ``allow_private``), in the resolver's
    order, for a client that is handed an address to connect to rather than a socket (NATS).
    Raises PrivateAddressRefused when none is allowed, else the resolver's OSError."""
    loop = asyncio.get_running_loop()
    infos = await asyncio.wait_for(loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout)
    allowed: list[Address] = [info for info in infos if allow_private or hosts.is_public(str(info[4][0]))]
    if not allowed:
        raise PrivateAddressRefused(f"{host} resolves only to non-public addresses")
    return allowed


async def connect(host: str, port: int, *, allow_private: bool, timeout: float) -> socket.socket:
    """A non-blocking TCP socket connected to ``host``, to one of its addresses the guard allows
    (any, with ``allow_private``), tried in the resolver's order. Raises PrivateAddressRefused
    before any connection is opened when none is allowed, else the last address's OSError."""
    loop = asyncio.get_running_loop()
    error: OSError | None = None
    for family, kind, proto, _, address in await addresses(host, port, allow_private=allow_private,
                                                           timeout=timeout):
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(loop.sock_connect(sock, address), timeout)
            return sock
        except TimeoutError:
            sock.close()
            error = TimeoutError(f"connecting to {address[0]} timed out")
        except OSError as exc:
            sock.close()
            error = exc
    assert error is not None
    raise error
