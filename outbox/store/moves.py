"""The rules of the moves both dialects share (pure), and changes made one by one through
``update_intent``: the stores' ``apply`` until each dialect runs its moves as sets (``apply_each``
and ``recover_each`` are interim; they go once both stores have their named blocks)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ..errors import OutboxError, StaleWrite
from ..model import (
    Approve,
    Cancel,
    Change,
    Event,
    EventKind,
    Hold,
    Intent,
    Reject,
    Release,
    Replay,
    Resolve,
    Settle,
    Start,
    Status,
    check_change,
    target_status,
)
from .protocol import Applied, Claim

_LEASE = {"lease_owner": None, "lease_expires_at": None}


def decide_start(key: str, lease_expires_at: datetime | None, started_at: datetime) -> StaleWrite | None:
    """Whether a ``Start`` found its intent's lease (held at its fence) still running when its
    attempt starts: a lease that has ended may already be another worker's, so an attempt
    started after it is refused (returned, not raised, as ``rules.decide_target`` does)."""
    if lease_expires_at is not None and lease_expires_at <= started_at:
        return StaleWrite(f"intent {key!r}'s lease ended at {lease_expires_at.isoformat()}, before its attempt "
                          f"started at {started_at.isoformat()}; the write was not applied")
    return None


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
        worker = isinstance(change, Start | Settle | Release | Hold)
        expected = getattr(change, "expected", None) or (
            Status.LEASED if worker else Status.UNKNOWN if isinstance(change, Resolve) else Status.HELD)
        events = [change.event] if isinstance(change, Start) else list(change.events)
        if isinstance(change, Start):
            found = await store.get_intent(change.key)
            expired = found is not None and found.fence == change.fence and decide_start(
                change.key, found.lease_expires_at, change.attempt.started_at)
            if expired:
                results.append(expired)
                continue
        try:
            results.append(await store.update_intent(
                change.key, expected=expected, status=target_status(change), events=events,
                changes=_columns(change), fence=getattr(change, "fence", None),
                attempt=getattr(change, "attempt", None), fetch=not worker))
        except OutboxError as exc:
            results.append(exc)
    claimed = [] if claim is None else await store.claim(
        claim.owner, now=claim.now, lease_until=claim.lease_until, limit=claim.limit)
    return Applied(results, claimed)


async def recover_each(store: Any, now: datetime, limit: int, actor: str) -> int:
    recovered = 0
    for intent, attempt in await store.expired_leases(now, limit):
        if attempt is not None:
            continue
        try:
            await store.update_intent(
                intent.key, fetch=False, expected=Status.LEASED, status=Status.PENDING, fence=intent.fence,
                changes={**_LEASE, "next_attempt_at": now, "fence": intent.fence + 1},
                events=[Event(EventKind.LEASE_EXPIRED, now, actor,
                              f"lease of {intent.lease_owner} expired before any attempt started",
                              {"next_attempt_at": now.isoformat()})])
            recovered += 1
        except OutboxError:
            pass  # its holder finished, or another sweeper got there first
    return recovered
