"""The last hour, as the console shows it: each destination's health and the per-minute series
of the charts, counted from the store's ``activity`` (so every process sees the same)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from ...store import Activity
from ...store.protocol import Failure

#: The window the console shows, in minutes (the current one included).
MINUTES = 60


def window(now: datetime) -> list[datetime]:
    """The window's minutes, oldest first, ending with the current one."""
    current = now.replace(second=0, microsecond=0)
    return [current - timedelta(minutes=MINUTES - 1 - i) for i in range(MINUTES)]


@dataclass
class Health:
    """One destination over the window."""

    destination: str
    delivered: int = 0
    failed: int = 0
    duration_ms: float = 0.0  # summed over every finished attempt
    last_success: datetime | None = None
    last_failure: Failure | None = None
    waiting: int = 0
    oldest_due_at: datetime | None = None

    @property
    def failure_rate(self) -> float | None:
        attempts = self.delivered + self.failed
        return None if attempts == 0 else self.failed / attempts

    @property
    def mean_ms(self) -> float | None:
        attempts = self.delivered + self.failed
        return None if attempts == 0 else self.duration_ms / attempts


def health(activity: Activity, destinations: list[str]) -> list[Health]:
    """Every destination's health (registered ones, and any the activity names), by id."""
    found = {d: Health(d) for d in destinations}
    for m in activity.minutes:
        h = found.setdefault(m.destination, Health(m.destination))
        h.duration_ms += m.duration_ms
        if m.outcome == "delivered":
            h.delivered += m.count
            h.last_success = max(filter(None, (h.last_success, m.last_at)))
        else:
            h.failed += m.count
    for f in activity.failures:
        found.setdefault(f.destination, Health(f.destination)).last_failure = f
    for w in activity.waiting:
        h = found.setdefault(w.destination, Health(w.destination))
        h.waiting, h.oldest_due_at = w.count, w.oldest_due_at
    return [found[d] for d in sorted(found)]


def per_minute(activity: Activity, minutes: list[datetime]) -> tuple[list[int], list[int]]:
    """Attempts delivered and attempts failed, per minute of ``minutes``."""
    index = {m: i for i, m in enumerate(minutes)}
    delivered, failed = [0] * len(minutes), [0] * len(minutes)
    for m in activity.minutes:
        if (i := index.get(m.minute)) is not None:
            (delivered if m.outcome == "delivered" else failed)[i] += m.count
    return delivered, failed


def backlog(activity: Activity, minutes: list[datetime]) -> list[int]:
    """Open intents at the end of each minute: those enqueued by then and not settled by then.
    An intent counts from its enqueue to its last change, so one that was dead and replayed
    within the window counts over its dead spell too."""
    return [sum(s.count for s in activity.backlog if s.since <= m and (s.until is None or s.until > m))
            for m in minutes]
