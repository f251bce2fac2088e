"""When to try again: exponential backoff with jitter, or a destination's own schedule of delays,
capped at an hour, Retry-After honoured."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import tenacity


@dataclass(frozen=True)
class Backoff:
    """The delay before the next try after ``tries`` that did not deliver.

    "Equal jitter": half of the exponential delay is fixed and half random, so retries spread out
    without ever collapsing to zero. Built from tenacity's wait strategies.
    """

    initial_seconds: float = 1.0
    cap_seconds: float = 3600.0

    def __post_init__(self) -> None:
        half, cap = self.initial_seconds / 2, self.cap_seconds / 2
        strategy = tenacity.wait_exponential(multiplier=half, max=cap) + \
            tenacity.wait_random_exponential(multiplier=half, max=cap)
        object.__setattr__(self, "_strategy", strategy)

    def delay(self, tries: int, retry_after: float | None = None, schedule: Sequence[float] | None = None) -> float:
        """Seconds to wait after ``tries`` (≥ 1): the attempts made, or, for an intent given back
        unsent, the times it was claimed; a receiver's Retry-After is honoured up to the cap.

        With a ``schedule`` (a destination's ``retry_schedule``) the wait is its entry number
        ``tries``, exactly, without jitter (its last entry once past the end: whether there is a
        retry at all is ``exhausted``'s to say)."""
        if schedule:
            computed = min(schedule[min(max(1, tries), len(schedule)) - 1], self.cap_seconds)
        else:
            state = tenacity.RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
            state.attempt_number = max(1, tries)
            computed = min(self._strategy(state), self.cap_seconds)  # type: ignore[attr-defined]
        if (asked := honoured(retry_after, self.cap_seconds)) is not None:
            computed = max(computed, asked)
        return computed


def honoured(retry_after: float | None, cap_seconds: float) -> float | None:
    """The part of a receiver's Retry-After that is honoured: from 0 to the cap (None: there was
    none, or it is not a number)."""
    if retry_after is None or math.isnan(retry_after):
        return None
    return min(max(retry_after, 0.0), cap_seconds)


def exhausted(schedule: Sequence[float] | None, attempts_made: int) -> bool:
    """Whether a retry schedule has no delay left after ``attempts_made``: n delays allow the
    first attempt and n retries. Without a schedule, only ``max_attempts`` ends the retries."""
    return schedule is not None and attempts_made > len(schedule)
