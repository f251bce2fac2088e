"""What operators do to intents: replay, resolve, cancel, approve, reject, prune.

Every action is a status change through the one transition table, conditional on the status
the operator saw, and appends an event naming who did it and why. History is never rewritten.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from datetime import timedelta

from . import tracing
from .destinations import deadline
from .errors import AuthorityDenied, DuplicateRisk, IllegalTransition, InvalidInput, OutboxError
from .model import (
    MAX_APPROVAL_SECONDS,
    REPLAYABLE,
    Approve,
    Cancel,
    Event,
    EventKind,
    Intent,
    OperatorChange,
    Reject,
    Replay,
    Resolution,
    Resolve,
    Status,
    Submission,
)
from .outbox import Outbox
from .store import IntentQuery
from .timestamps import later

#: Asks the authority provider about an intent now; returns why it is denied, or None.
Authorize = Callable[[Intent], Awaitable[str | None]]

#: Intents deleted per transaction when pruning, so other writers never wait long behind it.
PRUNE_BATCH = 10_000


@dataclass(frozen=True, slots=True)
class Actor:
    """Who acts, and why (recorded on the event)."""

    name: str
    reason: str

    def __post_init__(self) -> None:
        if not self.reason.strip():
            raise InvalidInput("say why: operator actions are recorded with a reason")


async def _may_have_taken_effect(box: Outbox, intent: Intent) -> bool:
    history = await box.history(intent.action_id, scope=intent.scope)
    return any(a.submission in (Submission.MAYBE_SUBMITTED, None) for a in history.attempts) or (
        intent.status is Status.UNKNOWN
    )


async def duplicate_risks(box: Outbox, intents: Iterable[Intent]) -> list[Intent]:
    """Those of ``intents`` a replay refuses for duplicate risk unless it is accepted: an earlier
    attempt may have taken effect and the destination does not declare idempotency."""
    idempotent: dict[str, bool] = {}
    risky = []
    for intent in intents:
        if intent.destination not in idempotent:
            idempotent[intent.destination] = (await box.get_destination(intent.destination)).idempotent
        if not idempotent[intent.destination] and await _may_have_taken_effect(box, intent):
            risky.append(intent)
    return risky


async def replay(
    box: Outbox, action_id: str, actor: Actor, *, scope: str | None = None, authorize: Authorize | None = None,
    accept_duplicate_risk: bool = False,
) -> Intent:
    """Send a dead, revoked or unknown intent again, under the same action_id (receivers
    deduplicate on it) and with a fresh budget of attempts, after a fresh authority check.

    ``max_attempts`` caps the intent's attempt count, and attempts are never renumbered or
    forgotten (history is not rewritten), so the fresh budget is given by raising the cap to the
    attempts made plus ``default_max_attempts``: 24 becomes 25 after one failed attempt, 26 after
    the next replay of one more."""
    intent = await box.get(action_id, scope=scope)
    if intent.status not in REPLAYABLE:
        raise IllegalTransition(
            f"only dead, revoked or unknown intents can be replayed; {action_id!r} is {intent.status.value}")
    if intent.unreadable is not None:
        raise IllegalTransition(f"{action_id!r} cannot be sent: {intent.unreadable}; cancel it, and enqueue it "
                                "again with times the outbox takes")
    if not accept_duplicate_risk and await duplicate_risks(box, [intent]):
        raise DuplicateRisk(
            f"an earlier attempt of {action_id!r} may have taken effect and destination "
            f"{intent.destination!r} does not declare idempotency; replaying may duplicate it "
            "(pass accept_duplicate_risk / --accept-duplicate-risk to do it anyway)")
    destination = await box.get_destination(intent.destination)
    if (ends := deadline(intent, destination)) is not None and box.clock.now() >= ends.at:
        raise IllegalTransition(f"{action_id!r} cannot be sent: past {ends.why}")
    if authorize is not None and (denied := await authorize(intent)) is not None:
        raise AuthorityDenied(f"authority does not allow {action_id!r} now: {denied}")
    now = box.clock.now()
    replayed = await _made(box, intent, actor, Replay(
        intent.key, intent.status, now, intent.attempts + box.settings.default_max_attempts,
        (Event(EventKind.REPLAYED, now, actor.name, actor.reason,
               {"from": intent.status.value, "accept_duplicate_risk": accept_duplicate_risk}),)))
    box.enqueued.notify()
    return replayed


async def resolve(
    box: Outbox, action_id: str, resolution: Resolution, actor: Actor, *, scope: str | None = None,
    external_id: str | None = None,
) -> Intent:
    """Settle an ``unknown`` intent with the operator's evidence."""
    intent = await box.get(action_id, scope=scope)
    if intent.status is not Status.UNKNOWN:
        raise IllegalTransition(f"only unknown intents can be resolved; {action_id!r} is {intent.status.value}")
    now = box.clock.now()
    status = {Resolution.DELIVERED: Status.DELIVERED, Resolution.RETRY: Status.PENDING,
              Resolution.DEAD: Status.DEAD}[resolution]
    retry = status is Status.PENDING  # a fresh budget, as for a replay
    resolved = await _made(box, intent, actor, Resolve(
        intent.key, status,
        (Event(EventKind.RESOLVED, now, actor.name, actor.reason,
               {"resolution": resolution.value, "external_id": external_id}),),
        next_attempt_at=now if retry else None,
        max_attempts=intent.attempts + box.settings.default_max_attempts if retry else None))
    (box.enqueued if status is Status.PENDING else box.settled).notify()
    return resolved


async def cancel(box: Outbox, action_id: str, actor: Actor, *, scope: str | None = None) -> Intent:
    """Withdraw an intent that is not in flight and not finished."""
    intent = await box.get(action_id, scope=scope)
    if intent.status is Status.LEASED:
        raise IllegalTransition(f"{action_id!r} is being sent right now; cancel it after this attempt")
    cancelled = await _made(box, intent, actor, Cancel(intent.key, intent.status, (
        Event(EventKind.CANCELLED, box.clock.now(), actor.name, actor.reason, {"from": intent.status.value}),)))
    box.settled.notify()
    return cancelled


async def approve(
    box: Outbox, action_id: str, actor: Actor, *, payload_digest: str, valid_seconds: float = 3600,
    scope: str | None = None,
) -> Intent:
    """Approve a held intent: the approval binds the exact payload digest the operator saw and
    expires; the sender re-checks both right before sending."""
    intent = await box.get(action_id, scope=scope)
    if intent.status is not Status.HELD:
        raise IllegalTransition(f"only held intents can be approved; {action_id!r} is {intent.status.value}")
    if payload_digest != intent.payload_digest:
        raise InvalidInput(f"the approval names payload {payload_digest}, but {action_id!r} carries "
                           f"{intent.payload_digest}; look at it again")
    if not 0 < valid_seconds <= MAX_APPROVAL_SECONDS:
        raise InvalidInput("an approval lasts between 1 second and 30 days")
    now = box.clock.now()
    until = later(now, valid_seconds)
    approved = await _made(box, intent, actor, Approve(
        intent.key, payload_digest, until, actor.name, now,
        (Event(EventKind.APPROVED, now, actor.name, actor.reason,
               {"payload_digest": payload_digest, "expires_at": until.isoformat()}),)))
    box.enqueued.notify()
    return approved


async def reject(box: Outbox, action_id: str, actor: Actor, *, scope: str | None = None) -> Intent:
    """Refuse a held intent: it is cancelled and never sent."""
    intent = await box.get(action_id, scope=scope)
    if intent.status is not Status.HELD:
        raise IllegalTransition(f"only held intents can be rejected; {action_id!r} is {intent.status.value}")
    rejected = await _made(box, intent, actor, Reject(
        intent.key, (Event(EventKind.REJECTED, box.clock.now(), actor.name, actor.reason),)))
    box.settled.notify()
    return rejected


async def _made(box: Outbox, intent: Intent, actor: Actor, change: OperatorChange) -> Intent:
    """Make an operator's ``change`` to ``intent`` alone, as a span linked to the intent's trace;
    returns the intent as it became, or raises the store's refusal (NotFound, StaleWrite: it
    changed since it was read)."""
    with tracing.operator_span(type(change).__name__.lower(), intent.action_id, intent.trace_context, actor.name):
        [result] = (await box.store.apply([change])).results
    if isinstance(result, OutboxError):
        raise result
    assert isinstance(result, Intent)
    return result


async def matching(box: Outbox, query: IntentQuery) -> AsyncIterator[Intent]:
    """Every intent matching ``query`` (its statuses must be replayable), page by page."""
    before = None
    while True:
        page = await box.list_intents(replace(query, before_seq=before, limit=500))
        for intent in page.intents:
            yield intent
        if page.next_seq is None:
            return
        before = page.next_seq


def replay_filter(query: IntentQuery) -> IntentQuery:
    """A bulk replay's filter: only replayable statuses (all three when none is named)."""
    statuses = list(query.statuses or REPLAYABLE)
    if not set(statuses) <= REPLAYABLE:
        raise InvalidInput("bulk replay takes dead, revoked or unknown intents only")
    return replace(query, statuses=sorted(statuses, key=lambda s: s.value))


@dataclass
class BulkReplay:
    """What a bulk replay found and did; ``refused`` maps action_id to why it was not replayed."""

    matched: list[str]
    replayed: list[str]
    refused: dict[str, str]


async def bulk_replay(
    box: Outbox, query: IntentQuery, actor: Actor, *, dry_run: bool, authorize: Authorize | None = None,
    accept_duplicate_risk: bool = False, progress: Callable[[Intent], None] | None = None,
) -> BulkReplay:
    """Replay every intent matching ``query``. A dry run only lists them. Interrupted, it can
    simply be run again: what was replayed no longer matches, so it resumes with the rest."""
    found = [intent async for intent in matching(box, replay_filter(query))]
    result = BulkReplay([i.action_id for i in found], [], {})
    if dry_run:
        return result
    for intent in found:
        try:
            await replay(box, intent.action_id, actor, scope=intent.scope, authorize=authorize,
                         accept_duplicate_risk=accept_duplicate_risk)
        except OutboxError as exc:
            result.refused[intent.action_id] = exc.message
        else:
            result.replayed.append(intent.action_id)
        if progress is not None:
            progress(intent)
    return result


async def prune(box: Outbox, *, older_than: timedelta, dry_run: bool) -> list[str]:
    """Delete delivered and cancelled intents finished more than ``older_than`` ago (dead and
    unknown intents stay until an operator acts on them); returns their action_ids. Deletes
    ``PRUNE_BATCH`` at a time, each batch its own transaction, until none is left."""
    before = later(box.clock.now(), -older_than.total_seconds())
    if dry_run:
        return await box.store.prune(before, dry_run=True, limit=None)
    gone: list[str] = []
    while True:
        batch = await box.store.prune(before, dry_run=False, limit=PRUNE_BATCH)
        gone += batch
        if len(batch) < PRUNE_BATCH:
            return gone

