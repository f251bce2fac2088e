"""What happens to an intent: the one place the delivery policy lives. ``decide`` says what an
attempt's result means for it; the checks before an attempt (``expired``, ``denied``,
``set_aside``), a receiver's answer to the reconcile probe (``reconciled``) and the sweeper's
recovery of a lease whose destination is gone (``orphaned``) take their fates from here too."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from outbox import Destination, EventKind, Intent, OnUnknown, Outcome, Status
from outbox.destinations import deadline
from outbox.timestamps import later

from .backoff import Backoff, exhausted, honoured
from .channel import ProbeAnswer, SendResult


@dataclass(slots=True)
class Fate:
    """The intent's next status, when it is next due (if pending), and the event that says why."""

    status: Status
    event: EventKind  # delivered, scheduled_retry, dead_lettered, unknown or revoked
    reason: str
    next_attempt_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Policy:
    """The sender's knobs for deciding."""

    backoff: Backoff = field(default_factory=Backoff)
    #: Stop retrying an unknown outcome this long before the receiver forgets the key.
    retention_margin_seconds: float = 300.0


#: The answers with which a receiver asks the whole destination to slow down, when they carry Retry-After.
SLOW_DOWN = frozenset({429, 503})


def pause_until(result: SendResult, now: datetime, policy: Policy) -> datetime | None:
    """Until when a destination is paused for every worker: a receiver's 429 or 503 with
    Retry-After, the wait it asked for capped at the backoff cap. Without Retry-After (and on
    channels that have none: Kafka, email) only the intent backs off."""
    if result.status_code not in SLOW_DOWN:
        return None
    asked = honoured(result.retry_after, policy.backoff.cap_seconds)
    return None if asked is None else later(now, asked)


def decide(
    intent: Intent,
    destination: Destination,
    result: SendResult,
    *,
    attempts_made: int,
    first_submission_at: datetime | None,
    now: datetime,
    policy: Policy,
) -> Fate:
    """Decide the intent's fate after attempt number ``attempts_made``."""
    if result.outcome is Outcome.DELIVERED:
        return Fate(Status.DELIVERED, EventKind.DELIVERED, f"receiver answered {result.status_code}")
    if result.outcome in (Outcome.REJECTED, Outcome.CONFLICT):
        return Fate(Status.DEAD, EventKind.DEAD_LETTERED, f"{result.outcome.value}: {result.error}")
    if result.outcome is Outcome.DENIED:
        return Fate(Status.REVOKED, EventKind.REVOKED, result.error or "authority denied")
    if result.outcome is Outcome.UNKNOWN:
        reason = _unknown_blocks_retry(destination, first_submission_at, now, policy)
        if reason:
            return Fate(Status.UNKNOWN, EventKind.UNKNOWN, f"{result.error}; {reason}")
    schedule, tries = destination.retry_schedule, attempts_made
    if schedule is not None:  # counted since the last replay, which starts it over
        tries = attempts_made - intent.replayed_after
    due = later(now, policy.backoff.delay(tries, result.retry_after, schedule))
    why_not = _why_not_again(intent, destination, attempts_made, tries, due)
    if why_not and result.outcome is Outcome.UNKNOWN:
        # The last attempt may have taken effect: that is not a dead letter's "not delivered".
        return Fate(Status.UNKNOWN, EventKind.UNKNOWN,
                    f"{why_not}; the last attempt may have taken effect: {result.error}")
    if why_not:
        return Fate(Status.DEAD, EventKind.DEAD_LETTERED, f"{why_not}; last: {result.error}")
    if (result.outcome is Outcome.UNKNOWN and destination.on_unknown is OnUnknown.DECLARED
            and first_submission_at is not None
            and due >= _retention_end(destination, first_submission_at, policy)):
        return Fate(Status.UNKNOWN, EventKind.UNKNOWN,
                    f"{result.error}; the next attempt would fall outside the receiver's "
                    f"declared retention of {destination.retention_seconds}s")
    return Fate(Status.PENDING, EventKind.SCHEDULED_RETRY, f"{result.outcome.value}: {result.error}", due)


def expired(why: str) -> Fate:
    """An intent whose time ran out (``why``: its expires_at or its destination's max age) before
    an attempt: dead, nothing sent."""
    return Fate(Status.DEAD, EventKind.DEAD_LETTERED, f"expired before it could be sent: past {why}")


def denied(reason: str) -> Fate:
    """An intent the authority refused just before its attempt: revoked, kept as a fact, nothing sent."""
    return Fate(Status.REVOKED, EventKind.REVOKED, reason)


def set_aside(unreadable: str) -> Fate:
    """An intent whose stored times cannot be read (``Intent.unreadable``): dead before any
    attempt, so nothing is claimed about its delivery; an operator cancels it."""
    return Fate(Status.DEAD, EventKind.DEAD_LETTERED,
                f"set aside unsent: {unreadable}; cancel it, and enqueue it again with times the outbox takes")


def reconciled(fate: Fate, answer: ProbeAnswer, now: datetime, policy: Policy) -> Fate:
    """What a receiver's answer to the reconcile probe makes of an ``unknown`` ``fate``:
    ``completed`` is delivered, ``absent`` a retry that is safe now, ``in_progress`` a look again
    later; anything else leaves it unknown, saying why."""
    if answer.state == "completed":
        return Fate(Status.DELIVERED, EventKind.DELIVERED,
                    f"reconciled: the receiver completed it (answered {answer.status_code})")
    if answer.state == "absent":
        return Fate(Status.PENDING, EventKind.SCHEDULED_RETRY,
                    "reconciled: the receiver never ran it and now refuses the earlier attempt; retrying is safe", now)
    if answer.state == "in_progress":
        return Fate(Status.PENDING, EventKind.SCHEDULED_RETRY, "reconciled: still in progress at the receiver",
                    later(now, policy.backoff.delay(1)))
    return Fate(Status.UNKNOWN, EventKind.UNKNOWN, f"{fate.reason}; {answer.error}")


def orphaned(reason: str, now: datetime) -> Fate:
    """An expired lease whose attempt may have been sent, to a destination that is gone: nothing
    to judge it against, so due again now, and parked when it is next claimed."""
    return Fate(Status.PENDING, EventKind.LEASE_EXPIRED, reason + " and its destination is gone", now)


def _why_not_again(intent: Intent, destination: Destination, attempts_made: int, tries: int,
                   due: datetime) -> str | None:
    """Why the intent gets no attempt at ``due`` (its attempts, its destination's retry schedule,
    ``tries`` into it, or its time ran out), or None. ``max_attempts`` still bounds a schedule: the
    fewer attempts win."""
    if attempts_made >= intent.max_attempts:
        return f"attempts exhausted ({attempts_made} of {intent.max_attempts})"
    if exhausted(destination.retry_schedule, tries):
        return f"retry schedule exhausted ({tries} attempts, one more than its delays)"
    if (ends := deadline(intent, destination)) is not None and due >= ends.at:
        return f"expired: {ends.why} falls before the next attempt"
    return None


def _retention_end(destination: Destination, first: datetime, policy: Policy) -> datetime:
    return later(first, destination.retention_seconds - policy.retention_margin_seconds)


def _unknown_blocks_retry(
    destination: Destination, first_submission_at: datetime | None, now: datetime, policy: Policy
) -> str | None:
    """Why an unknown outcome may not be retried automatically, or None if it may."""
    if destination.on_unknown is OnUnknown.ALWAYS:
        return None
    if destination.on_unknown is OnUnknown.NEVER:
        return "destination policy on_unknown=never forbids a blind retry"
    if not destination.idempotent:
        return "the destination does not declare idempotency, so a retry could duplicate the effect"
    if first_submission_at is None or now >= _retention_end(destination, first_submission_at, policy):
        return (f"the first submission is older than the receiver's declared retention "
                f"({destination.retention_seconds}s) minus a {policy.retention_margin_seconds:.0f}s margin")
    return None
