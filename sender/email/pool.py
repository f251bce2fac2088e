"""Connections kept for reuse: per destination as its settings read now, at most its
``connections`` at once, idle ones closed after ``IDLE_SECONDS`` and any dropped after a failure."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import aiosmtplib

from outbox import Destination

from .destination import EmailSpec

#: How long an idle connection is kept (servers drop idle connections after a few minutes).
IDLE_SECONDS = 30.0


@dataclass
class Pool:
    """One destination (as its settings read now): its spec, read once, and its open
    connections: idle ones, newest last, and the slots for all."""

    spec: EmailSpec
    slots: asyncio.Semaphore
    idle: list[tuple[aiosmtplib.SMTP, float]] = field(default_factory=list)
    current: bool = True  # False once the destination's settings changed

    def keep(self, client: aiosmtplib.SMTP) -> None:
        """Take a connection back for the next message, unless this pool is gone."""
        if self.current:
            self.idle.append((client, time.monotonic()))
        else:
            client.close()

    def reusable(self) -> Iterator[aiosmtplib.SMTP]:
        """The idle connections, newest first; those idle too long are closed."""
        while self.idle:
            client, since = self.idle.pop()
            if time.monotonic() - since < IDLE_SECONDS and client.is_connected:
                yield client
            else:
                client.close()

    def close_idle(self) -> None:
        """Close the idle connections (those in use are this pool's again when they come back)."""
        for client, _ in self.idle:
            client.close()


class Pools:
    """A channel's pools, one for each destination's current settings."""

    def __init__(self) -> None:
        self._pools: dict[tuple[str, str, bool, float], Pool] = {}

    def get(self, destination: Destination) -> Pool:
        """The pool for the destination's settings now, its spec checked by today's rules (raises
        ValidationError); its pools for earlier settings are closed."""
        key = (destination.id, repr(sorted(destination.settings.items())), destination.allow_private_network,
               destination.timeout_seconds)  # (a connection keeps the timeout it was opened with)
        return self._pools.get(key) or self._replace(key, destination)

    def _replace(self, key: tuple[str, str, bool, float], destination: Destination) -> Pool:
        spec = EmailSpec.model_validate({**destination.settings, "channel": "email",
                                         "allow_private_network": destination.allow_private_network})
        pool = Pool(spec, asyncio.Semaphore(spec.connections))
        for stale in [k for k in self._pools if k[0] == destination.id]:
            old = self._pools.pop(stale)
            old.current = False  # its connections still in use are closed when they come back
            old.close_idle()
        self._pools[key] = pool
        return pool

    def close(self) -> None:
        """Close every idle connection and forget the pools."""
        for pool in self._pools.values():
            pool.close_idle()
        self._pools.clear()
