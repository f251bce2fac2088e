"""Flow control per destination: how fast and how many at once the sender may send to it.

A destination may set ``rate_limit`` (a token bucket: ``per_second`` tokens a second, up to
``burst`` saved; each send takes one when it is leased) and ``max_in_flight`` (intents leased at
once: a lease counts from the claim to its outcome). A receiver's 429 or 503 with Retry-After
pauses the destination until then. The claim enforces all three in the database, so they hold
for every worker process sharing it; an intent held back stays pending, unattempted, with no
event: being held back is not an attempt.

The bucket's arithmetic is here once for Python; SQLite's claim runs it, PostgreSQL's runs the
same formula in SQL in ``outbox_claim_limited``, the store's named block
``claim_limited_function`` (sql/postgres.sql), which ``PostgresStore.migrate`` creates when the
database's body is not this release's (migrations 0013 and 0016 made the earlier ones); the
conformance suite's flow tests hold both claims to the same answers.

Every value it computes with is bounded, so every time it computes can be held: ``per_second``
from ``MIN_PER_SECOND`` (the next token is at most 100,000 s away) to ``MAX_PER_SECOND``, a
``burst`` and ``max_in_flight`` of 1 to ``MAX_COUNT``. The API refuses anything else; a stored
value beyond them (written by hand, or by a release that took 1e-12) is computed with as the
nearest bound (``usable_rate``, ``usable_cap``; the destination says so, ``Destination.unusable``,
and the sender sends it nothing), a bucket's count is kept between 0 and its burst, and the
time the next token comes is clamped as every computed time is (``timestamps.later``).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt

from .timestamps import later

#: The slowest rate a destination may have: a send every 100,000 s (about 28 hours). Slower, the
#: time the next token comes would be ever further off: at 1e-12 it was 31,700 years away, past
#: what a time can hold, and every claim failed on it.
MIN_PER_SECOND = 0.00001
#: The fastest rate, and the most a burst or max_in_flight may be.
MAX_PER_SECOND = 100_000
MAX_COUNT = 100_000


class RateLimit(BaseModel):
    """Sends per second to a destination, with a burst: a token bucket of ``burst`` tokens,
    refilled at ``per_second``; each send takes one token when it is leased."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    per_second: StrictFloat | StrictInt = Field(ge=MIN_PER_SECOND, le=MAX_PER_SECOND,
                                                description="tokens added a second (at least 0.00001)")
    burst: StrictInt = Field(default=1, ge=1, le=MAX_COUNT,
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


def _number(value: object) -> float:
    """A stored number as a float; anything else (text in a SQLite column) as NaN."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan


def _within(value: float, low: float, high: float, *, nan: float) -> float:
    return nan if math.isnan(value) else min(max(value, low), high)


def usable_rate(per_second: object, burst: object) -> RateLimit:
    """A stored rate limit as the claim computes with it: ``per_second`` kept within its bounds
    (one that is not a number: the slowest) and ``burst`` within 1 to MAX_COUNT (none: 1). Equal
    to the stored one when that is one the API takes."""
    rate = _within(_number(per_second), MIN_PER_SECOND, MAX_PER_SECOND, nan=MIN_PER_SECOND)
    stored = _number(1 if burst is None else burst)
    kept = int(_within(math.floor(stored) if math.isfinite(stored) else stored, 1, MAX_COUNT, nan=1))
    return RateLimit.model_construct(per_second=per_second if rate == per_second else rate, burst=kept)


def usable_cap(max_in_flight: object) -> int | None:
    """A stored ``max_in_flight`` as the claim computes with it: None stays None (unlimited), any
    other within 1 to MAX_COUNT (one that is not a number: 1)."""
    if max_in_flight is None:
        return None
    stored = _number(max_in_flight)
    return int(_within(math.floor(stored) if math.isfinite(stored) else stored, 1, MAX_COUNT, nan=1))


def refilled(tokens: float, refilled_at: datetime, now: datetime, rate: RateLimit) -> float:
    """The bucket's tokens at ``now``: its stored count (kept within 0 to ``burst``; one that is not
    a number: 0) refilled at ``per_second`` since ``refilled_at``, at most ``burst`` (a clock that
    went back refills nothing)."""
    kept = _within(_number(tokens), 0.0, float(rate.burst), nan=0.0)
    elapsed = max(0.0, (now - refilled_at).total_seconds())
    return min(float(rate.burst), kept + elapsed * rate.per_second)


def next_token_at(tokens: float, now: datetime, rate: RateLimit) -> datetime:
    """When a bucket left with ``tokens`` (fewer than one) at ``now`` holds a whole one again:
    at most 1 / MIN_PER_SECOND away, clamped as every computed time is."""
    return later(now, (1 - tokens) / rate.per_second)


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
