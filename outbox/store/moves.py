"""The rules of the moves both dialects share, pure: what a change expects and writes, in the
order each dialect's named block for its move reads it, and the refusals and events both dialects
word alike; a dialect holds only the SQL of each move."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, get_args

from receivers.records import distinct_runs

from ..errors import NotFound, StaleWrite
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
    expected_status,
)
from .rules import decide_target

#: The moves whose changes are answered with the intent as it became (the operators').
ANSWERED: frozenset[str] = frozenset(change.move for change in get_args(OperatorChange))


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


def attempt(change: Change) -> Attempt | None:
    """The attempt ``change`` records (a start's, unfinished; a settle's, finished), if any."""
    return change.attempt if isinstance(change, Start | Settle) else None


def rounds(changes: Sequence[Change]) -> list[Sequence[int]]:
    """The positions of a batch's changes cut, in order, into rounds that name each key once
    (``receivers.records.distinct_runs``, which the record stores' batches use too): a change
    naming a key again goes to a later round, so that it sees what the earlier one did."""
    return distinct_runs(range(len(changes)), lambda i: changes[i].key)


def lease_running(lease_expires_at: datetime | None, started_at: datetime) -> bool:
    """Whether a lease still runs when an attempt starts under it: it expires after the start (a
    lease that has ended may already be another worker's; none recorded runs for no one). The
    rule's one wording in Python; PostgreSQL's cycle judges it with its block ``lease_running``,
    which a test holds to this."""
    return lease_expires_at is not None and lease_expires_at > started_at


def refusal(change: Change, found: tuple[str, int, datetime | None] | None) -> NotFound | StaleWrite | None:
    """Why ``change`` may not apply to its intent as found, ``(status, fence, lease_expires_at)``
    (None: no such intent), or None if it may: as ``rules.decide_target`` judges any change, and
    a ``Start`` also needs its lease running when its attempt starts (``lease_running``)."""
    refused = decide_target(change.key, None if found is None else found[:2],
                            expected=expected_status(change), fence=fence(change))
    if refused is not None or found is None or not isinstance(change, Start):
        return refused
    lease_expires_at, started_at = found[2], change.attempt.started_at
    if lease_running(lease_expires_at, started_at):
        return None
    if lease_expires_at is None:
        return StaleWrite(f"intent {change.key!r}'s lease has no end recorded, so it does not run when its attempt "
                          f"starts at {started_at.isoformat()}; the write was not applied")
    return StaleWrite(f"intent {change.key!r}'s lease ended at {lease_expires_at.isoformat()}, before its attempt "
                      f"started at {started_at.isoformat()}; the write was not applied")


def recovered_event(owner: str | None, now: datetime, actor: str) -> Event:
    """The ``lease_expired`` event of an intent the sweeper gives back (move ``recover``)."""
    return Event(EventKind.LEASE_EXPIRED, now, actor, f"lease of {owner} expired before any attempt started",
                 {"next_attempt_at": now.isoformat()})
