"""The rules of the moves both dialects share, pure: what a change expects and writes, in the
order each dialect's named block for its move reads it, and the refusals and events both dialects
word alike; a dialect holds only the SQL of each move."""

from __future__ import annotations

from datetime import datetime
from typing import Any, get_args

from ..errors import StaleWrite
from ..model import (
    Approve,
    Attempt,
    Cancel,
    Change,
    Event,
    EventKind,
    Hold,
    OperatorChange,
    Reject,
    Release,
    Replay,
    Resolve,
    Settle,
    Start,
    Status,
    expected_status,
)

#: The moves whose changes are answered with the intent as it became (the operators').
ANSWERED: frozenset[str] = frozenset(change.move for change in get_args(OperatorChange))


def expected(change: Change) -> Status:
    """The one status ``change`` applies in (the caller's ``expected``, else its move's source)."""
    (status,) = expected_status(change)
    return status


def fence(change: Change) -> int | None:
    """The fence ``change`` is made at (a worker's), or None (an operator's: any fence)."""
    return getattr(change, "fence", None)


def written(change: Change) -> tuple[Any, ...]:
    """What ``change`` writes to its intent row besides what its move fixes, in the order its
    move's named block reads them in every dialect (after the intent's seq), ``updated_at`` (its
    last event's time) last; a ``Start`` writes nothing there. Times stay datetimes, statuses
    ``Status``: each dialect stores them its way.

    settle: status, last_error, next_attempt_at, attempts, fence (the last three None: kept) ·
    release: next_attempt_at · hold: last_error · replay: next_attempt_at, max_attempts ·
    resolve: status, next_attempt_at, max_attempts (None: kept) · approve: approved_digest,
    approval_expires_at, approved_by, next_attempt_at · cancel, reject: nothing."""
    match change:
        case Start():
            return ()
        case Settle():
            values: tuple[Any, ...] = (change.status, change.last_error, change.next_attempt_at, change.attempts,
                                       change.new_fence)
        case Release():
            values = (change.next_attempt_at,)
        case Hold():
            values = (change.last_error,)
        case Replay():
            values = (change.next_attempt_at, change.max_attempts)
        case Resolve():
            values = (change.status, change.next_attempt_at, change.max_attempts)
        case Approve():
            values = (change.approved_digest, change.approval_expires_at, change.approved_by, change.next_attempt_at)
        case Cancel() | Reject():
            values = ()
        case _:
            raise TypeError(f"not a change: {change!r}")
    return (*values, change.events[-1].at)


def events(change: Change) -> tuple[Event, ...]:
    """The events ``change`` appends to its intent's history, in order."""
    return (change.event,) if isinstance(change, Start) else change.events


def attempt(change: Change) -> Attempt | None:
    """The attempt ``change`` records (a start's, unfinished; a settle's, finished), if any."""
    return change.attempt if isinstance(change, Start | Settle) else None


def decide_start(key: str, lease_expires_at: datetime | None, started_at: datetime) -> StaleWrite | None:
    """Whether a ``Start`` found its intent's lease (held at its fence) still running when its
    attempt starts: a lease that has ended may already be another worker's, so an attempt
    started after it is refused (returned, not raised, as ``rules.decide_target`` does)."""
    if lease_expires_at is not None and lease_expires_at <= started_at:
        return StaleWrite(f"intent {key!r}'s lease ended at {lease_expires_at.isoformat()}, before its attempt "
                          f"started at {started_at.isoformat()}; the write was not applied")
    return None


def recovered_event(owner: str | None, now: datetime, actor: str) -> Event:
    """The ``lease_expired`` event of an intent the sweeper gives back (move ``recover``)."""
    return Event(EventKind.LEASE_EXPIRED, now, actor, f"lease of {owner} expired before any attempt started",
                 {"next_attempt_at": now.isoformat()})
