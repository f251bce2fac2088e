"""The rules of the moves both dialects share (pure), and changes made one by one through
``update_intent``: the stores' ``apply`` until each dialect runs its moves as sets (``apply_each``
and ``recover_each`` are interim; they go once both stores have their named blocks)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, get_args

from ..errors import OutboxError, StaleWrite
from ..model import (
    Approve,
    Attempt,
    Cancel,
    Change,
    Event,
    EventKind,
    Hold,
    Intent,
    OperatorChange,
    Reject,
    Release,
    Replay,
    Resolve,
    Settle,
    Start,
    Status,
    check_change,
    expected_status,
    target_status,
)
from .protocol import Applied, Claim

_LEASE = {"lease_owner": None, "lease_expires_at": None}

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


def _columns(change: Change) -> dict[str, Any]:
    match change:
        case Start():
            return {}
        case Settle():
            columns: dict[str, Any] = {**_LEASE, "last_error": change.last_error}
            if change.next_attempt_at is not None:
                columns["next_attempt_at"] = change.next_attempt_at
            if change.attempts is not None:
                columns["attempts"] = change.attempts
            if change.new_fence is not None:
                columns["fence"] = change.new_fence
            return columns
        case Release():
            return {**_LEASE, "next_attempt_at": change.next_attempt_at}
        case Hold():
            return {**_LEASE, "last_error": change.last_error}
        case Replay():
            return {"next_attempt_at": change.next_attempt_at, "max_attempts": change.max_attempts,
                    "last_error": None}
        case Resolve():
            return {name: value for name, value in (("next_attempt_at", change.next_attempt_at),
                                                    ("max_attempts", change.max_attempts)) if value is not None}
        case Approve():
            return {"approved_digest": change.approved_digest, "approval_expires_at": change.approval_expires_at,
                    "approved_by": change.approved_by, "next_attempt_at": change.next_attempt_at}
        case Cancel() | Reject():
            return {}
    raise TypeError(f"not a change: {change!r}")


async def apply_each(store: Any, changes: Sequence[Change], claim: Claim | None) -> Applied:
    for change in changes:
        check_change(change)
    results: list[Intent | OutboxError | None] = []
    for change in changes:
        if isinstance(change, Start):
            found = await store.get_intent(change.key)
            expired = found is not None and found.fence == change.fence and decide_start(
                change.key, found.lease_expires_at, change.attempt.started_at)
            if expired:
                results.append(expired)
                continue
        try:
            results.append(await store.update_intent(
                change.key, expected=expected(change), status=target_status(change), events=events(change),
                changes=_columns(change), fence=fence(change), attempt=attempt(change),
                fetch=change.move in ANSWERED))
        except OutboxError as exc:
            results.append(exc)
    claimed = [] if claim is None else await store.claim(
        claim.owner, now=claim.now, lease_until=claim.lease_until, limit=claim.limit)
    return Applied(results, claimed)


async def recover_each(store: Any, now: datetime, limit: int, actor: str) -> int:
    recovered = 0
    for intent, started in await store.expired_leases(now, limit):
        if started is not None:
            continue
        try:
            await store.update_intent(
                intent.key, fetch=False, expected=Status.LEASED, status=Status.PENDING, fence=intent.fence,
                changes={**_LEASE, "next_attempt_at": now, "fence": intent.fence + 1},
                events=[recovered_event(intent.lease_owner, now, actor)])
            recovered += 1
        except OutboxError:
            pass  # its holder finished, or another sweeper got there first
    return recovered
