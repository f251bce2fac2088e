"""Flow control per destination: how fast and how many at once the sender may send to it.

A destination may set ``rate_limit`` (a token bucket: ``per_second`` tokens a second, up to
``burst`` saved; each send takes one when it is leased) and ``max_in_flight`` (intents leased at
once: a lease counts from the claim to its outcome). A receiver's 429 or 503 with Retry-After
pauses the destination until then. The claim enforces all three in the database, so they hold
for every worker process sharing it; an intent held back stays pending, unattempted, with no
event: being held back is not an attempt.

The bucket's arithmetic is here once; SQLite's claim runs it in Python, PostgreSQL's in the
claim function of its migration 0013 (the same formula, in SQL).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt


class RateLimit(BaseModel):
    """Sends per second to a destination, with a burst: a token bucket of ``burst`` tokens,
    refilled at ``per_second``; each send takes one token when it is leased."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    per_second: StrictFloat | StrictInt = Field(gt=0, le=100_000, description="tokens added a second")
    burst: StrictInt = Field(default=1, ge=1, le=100_000,
                             description="most tokens saved up: sends that may go at once after a quiet spell")


class Limit(enum.StrEnum):
    """Why a due intent was held back by a claim (the ``limit`` label of outbox_sends_held_total)."""

    PAUSED = "paused"  # the receiver asked for a pause (429/503 with Retry-After)
    IN_FLIGHT = "in_flight"  # max_in_flight intents of the destination are leased
    RATE = "rate"  # no token left in the destination's bucket


@dataclass(frozen=True, slots=True)
class Held:
    """Due intents of one destination a claim left pending because of one limit (counted at every
    claim that passes them over), and when that limit may next let one go (None: unknown, as for
    in_flight, which a settle frees)."""

    destination: str
    limit: Limit
    count: int
    retry_at: datetime | None = None


def refilled(tokens: float, refilled_at: datetime, now: datetime, rate: RateLimit) -> float:
    """The bucket's tokens at ``now``: refilled at ``per_second`` since ``refilled_at``, at most
    ``burst`` (a clock that went back refills nothing)."""
    elapsed = max(0.0, (now - refilled_at).total_seconds())
    return min(float(rate.burst), tokens + elapsed * rate.per_second)


@dataclass(frozen=True, slots=True)
class Allowance:
    """What a claim may lease of one destination's due intents, and what it holds back."""

    allowed: int
    held_in_flight: int
    held_rate: int


def allowance(due: int, *, in_flight: int, max_in_flight: int | None, tokens: float | None) -> Allowance:
    """How many of ``due`` intents a claim may lease: no more than leaves ``max_in_flight`` leased,
    then no more than the whole tokens left (``tokens`` None: no rate limit). A held intent is
    counted against the first limit that holds it, in_flight before rate."""
    room = due if max_in_flight is None else max(0, min(due, max_in_flight - in_flight))
    allowed = room if tokens is None else max(0, min(room, math.floor(tokens)))
    return Allowance(allowed, due - room, room - allowed)
