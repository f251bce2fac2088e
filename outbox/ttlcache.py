"""A small time-to-live cache, the one every cache of reads in the outbox and its sender uses
(tokens, destinations, authority decisions), so that when a value is stale and what is dropped at
the bound are each decided once."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
D = TypeVar("D")


class TtlCache(Generic[K, V]):
    """Values kept for ``seconds`` after the time each was put (0 or less: nothing is kept), at
    most ``max_size`` of them: at the bound the stale are dropped, then the older half of the rest,
    so a key seen once (a scope per user) does not grow it without end. ``clock`` is monotonic
    seconds, injected by tests."""

    def __init__(self, seconds: float, max_size: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self.max_size = max_size
        self.clock = clock
        self._kept: dict[K, tuple[float, V]] = {}

    def get(self, key: K, default: D) -> V | D:
        """The value kept for ``key`` while it is fresh, else ``default``."""
        kept = self._kept.get(key)
        if kept is not None and self.clock() - kept[0] < self.seconds:
            return kept[1]
        return default

    def put(self, key: K, value: V, at: float | None = None) -> None:
        """Keep ``value`` for ``key`` from ``at`` (the clock's time when the value was asked for;
        None: now)."""
        if self.seconds <= 0:
            return
        if len(self._kept) >= self.max_size and key not in self._kept:
            self._trim()
        self._kept[key] = (self.clock() if at is None else at, value)

    def pop(self, key: K) -> None:
        """Forget ``key`` (its value changed)."""
        self._kept.pop(key, None)

    def clear(self) -> None:
        """Forget everything."""
        self._kept.clear()

    def __len__(self) -> int:
        return len(self._kept)

    def _trim(self) -> None:
        now = self.clock()
        fresh = {k: v for k, v in self._kept.items() if now - v[0] < self.seconds}
        if len(fresh) >= self.max_size:
            fresh = dict(sorted(fresh.items(), key=lambda item: item[1][0])[len(fresh) // 2:])
        self._kept = fresh
