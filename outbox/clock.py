"""Time, injected: tests of backoff, leases and retention run in milliseconds."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol, overload

log = logging.getLogger("outbox.clock")


@overload
def iso(value: datetime) -> str: ...
@overload
def iso(value: None) -> None: ...
def iso(value: datetime | None) -> str | None:
    """RFC 3339 in UTC with a ``Z``, as the API and CLI show every time."""
    return None if value is None else value.astimezone(UTC).isoformat().replace("+00:00", "Z")


class Clock(Protocol):
    """Where the outbox reads the time and sleeps."""

    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``."""
        ...


class SystemClock:
    """The wall clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class OffsetClock:
    """The wall clock moved by ``offset`` seconds: this host's times on another clock's timeline.

    Hosts sharing one database write times each judges by the others' (a lease's expiry, when an
    intent falls due), so every one of them reads the database's clock: the offset is how far
    the database's clock is ahead of this host's, and ``follow`` keeps it measured as clocks drift.
    """

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    @property
    def offset(self) -> float:
        """Seconds the database's clock is ahead of this host's."""
        return self._ahead.total_seconds()

    @offset.setter
    def offset(self, seconds: float) -> None:
        self._ahead = timedelta(seconds=seconds)  # made once, not at every ``now`` (several a delivery)

    def now(self) -> datetime:
        return datetime.now(UTC) + self._ahead

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def follow(self, measure: Callable[[], Awaitable[float]], every: float = 300.0) -> None:
        """Take ``measure()`` as the offset every ``every`` seconds, until cancelled. A measurement
        that fails keeps the last offset, and is tried again at the next turn."""
        while True:
            await asyncio.sleep(every)
            try:
                self.offset = await measure()
            except Exception as exc:  # the database may be away for now; the last offset still holds
                log.warning("measuring the database's clock failed (%s); keeping an offset of %.3fs", exc,
                            self.offset)


class ManualClock:
    """A clock that moves only when told to; ``sleep`` advances it instantly."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2030, 1, 1, tzinfo=UTC)

    def now(self) -> datetime:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += timedelta(seconds=seconds)

    async def sleep(self, seconds: float) -> None:
        self.advance(seconds)
        await asyncio.sleep(0)
