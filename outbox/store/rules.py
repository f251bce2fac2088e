"""The store's domain rules, decided once for every dialect.

A dialect reads what a rule needs inside its own transaction, asks the function here, and
writes what it decided; it holds SQL and connection handling only. Every function is pure (no
I/O, no clock), so a dialect may call it inside a job that already runs on a database thread.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import cast

from .. import channels
from ..errors import (
    DestinationInUse,
    FanoutTooLarge,
    IntentConflict,
    InvalidInput,
    LastAdmin,
    NotFound,
    OutboxError,
    StaleWrite,
    UnknownDestination,
)
from ..events import NewEvent, Published, StoredEvent
from ..model import INITIAL, Enqueued, Event, Intent, NewIntent, Role, Status
from ..tokens import TokenInfo

# -- enqueue ----------------------------------------------------------------------------------


def decide_initial_status(new: NewIntent, requires_approval: bool | None) -> Status:
    """The status a new intent starts in: held if its destination requires approval, else
    pending. ``requires_approval`` is None when the destination is not registered: raises
    UnknownDestination."""
    if requires_approval is None:
        raise UnknownDestination(f"destination {new.destination!r} is not registered")
    status = Status.HELD if requires_approval else Status.PENDING
    assert status in INITIAL
    return status


def check_payload(new: NewIntent, channel: str) -> None:
    """Refuse (InvalidInput) a payload its destination's channel could never deliver, before
    anything is written, rather than dead-letter it later."""
    check = channels.get(channel).check_payload
    if check is None:
        return
    try:
        check(json.loads(new.payload_json))
    except ValueError as exc:
        raise InvalidInput(f"the payload cannot be sent by the {channel} channel: {exc}") from None


def inserted_intent(seq: int, new: NewIntent, channel: str, status: Status) -> Intent:
    """The intent just inserted under ``seq``, built from what was written rather than read back."""
    return Intent(
        seq=seq, action_id=new.action_id, scope=new.scope, destination=new.destination,
        channel=channel, payload_json=new.payload_json, payload_digest=new.payload_digest,
        status=status, attempts=0, max_attempts=new.max_attempts,
        next_attempt_at=new.next_attempt_at, not_before=new.not_before, expires_at=new.expires_at,
        lease_owner=None, lease_expires_at=None, fence=0, created_at=new.created_at,
        updated_at=new.created_at, last_error=None, ordering_key=new.ordering_key, event_id=new.event_id,
        trace_context=new.trace_context,
    )


def decide_existing(existing: Intent, new: NewIntent) -> Enqueued:
    """An enqueue that found its key (scope/action_id) taken: the same destination, payload
    digest and ordering key is the same operation, answered with the existing intent (not
    created); anything else raises IntentConflict naming what differs (the ordering key decides
    what the intent waits for, so it is part of the operation, as the payload is)."""
    # The same scope by construction (the key holds it), so naming what differs tells the caller
    # nothing about any other tenant.
    differences = [
        f"{name} {theirs!r} (this request: {ours!r})"
        for name, theirs, ours in (
            ("destination", existing.destination, new.destination),
            ("payload_digest", existing.payload_digest, new.payload_digest),
            ("ordering_key", existing.ordering_key, new.ordering_key),
        )
        if theirs != ours
    ]
    if differences:
        raise IntentConflict(
            f"action_id {new.action_id!r} already exists in scope {new.scope!r} with " + ", ".join(differences)
            + "; an action_id names one operation and is never reused for another"
        )
    return Enqueued(existing, created=False)


# -- events -----------------------------------------------------------------------------------


def decide_existing_event(existing: StoredEvent, new: NewEvent) -> Published:
    """A publish that found its key (scope/event_id) taken: the same topic, payload digest and
    ordering key is the same event, answered with the fan-out it made (nothing is created);
    anything else raises IntentConflict naming what differs (within the scope: nothing about
    any other tenant)."""
    differences = [
        f"{name} {theirs!r} (this request: {ours!r})"
        for name, theirs, ours in (
            ("topic", existing.topic, new.topic),
            ("payload_digest", existing.payload_digest, new.payload_digest),
            ("ordering_key", existing.ordering_key, new.ordering_key),
        )
        if theirs != ours
    ]
    if differences:
        raise IntentConflict(
            f"event_id {new.event_id!r} already exists in scope {new.scope!r} with " + ", ".join(differences)
            + "; an event_id names one event and is never reused for another")
    return Published(existing, created=False)


def fanout_refusal(new: NewEvent, reached: int, max_fanout: int | None) -> FanoutTooLarge | None:
    """Why ``new`` may not be recorded, or None: it would make an intent for each of ``reached``
    destinations (subscribed to its topic, that its scope may reach; one its channel would skip
    counts), more than ``max_fanout`` (None: no limit). Asked before anything of the event is
    written; an event recorded already under its key is answered as recorded instead."""
    if max_fanout is None or reached <= max_fanout:
        return None
    return FanoutTooLarge(
        f"event {new.event_id!r} (topic {new.topic!r}) would fan out to {reached} destinations in scope "
        f"{new.scope!r}, more than max_fanout allows ({max_fanout}, the setting OUTBOX_MAX_FANOUT); nothing was "
        "recorded: raise the setting, or narrow the destinations' subscriptions or the scope's grants",
        fanout=reached, max_fanout=max_fanout)


def batch_fanout_refusal(new: NewEvent, reached: int, before: int, max_batch_fanout: int) -> FanoutTooLarge:
    """Why ``new``, an event of a batch, is refused: its ``reached`` intents after the ``before``
    its batch's earlier events make would pass ``max_batch_fanout``."""
    return FanoutTooLarge(
        f"event {new.event_id!r} (topic {new.topic!r}) would fan out to {reached} destinations, and the events "
        f"before it in this batch to {before}: more than max_batch_fanout allows one batch ({max_batch_fanout}, "
        "the setting OUTBOX_MAX_BATCH_FANOUT); it was not recorded: publish it in another batch",
        fanout=before + reached, max_fanout=max_batch_fanout)


def sending_event_payload(new: NewIntent, event: StoredEvent) -> NewIntent:
    """``new``, an intent of the recorded ``event`` (an operator's delivery of it), made to send
    the payload the event stores rather than a copy: when its digest is the event's, which it is
    for the event's own payload (canonical JSON, so prepared again it is the same); else as it is."""
    return replace(new, payload_event=event.seq) if new.payload_digest == event.payload_digest else new


def fanout_of(items: Sequence[tuple[NewIntent, Event]],
              results: Sequence[Enqueued | OutboxError]) -> tuple[list[Intent], list[tuple[str, str]]]:
    """What an event's intents came to (``insert_each``'s results for ``items``): the intents
    made or found, and ``(destination, reason)`` for each one refused (its channel refuses the
    payload, or its derived action id is held by another operation), which does not stop the rest."""
    intents: list[Intent] = []
    skipped: list[tuple[str, str]] = []
    for (new, _), result in zip(items, results, strict=True):
        if isinstance(result, OutboxError):
            skipped.append((new.destination, result.message))
        else:
            intents.append(result.intent)
    return intents, skipped


# -- changes ----------------------------------------------------------------------------------


def whole_or_refused(results: Sequence[Enqueued | OutboxError]) -> list[Enqueued]:
    """A batch that is recorded whole or not at all (``insert_intents``): its first refusal is
    raised, undoing the transaction that wrote the rest; else every result."""
    for result in results:
        if isinstance(result, OutboxError):
            raise result
    return cast(list[Enqueued], list(results))


def decide_target(
    key: str, found: tuple[str, int] | None, *, expected: Status, fence: int | None
) -> NotFound | StaleWrite | None:
    """Whether a change may apply to the intent it found as ``(status, fence)`` (None: no such
    intent): None if it may, else the error to answer (the write is not applied). Returned
    rather than raised, so a batch of changes reports each one's refusal."""
    if found is None:
        return NotFound(f"intent {key!r} does not exist")
    status, current = found
    if status != expected.value or (fence is not None and current != fence):
        return StaleWrite(
            f"intent {key!r} is {status} at fence {current}, not {expected.value}"
            + (f" at fence {fence}" if fence is not None else "") + "; the write was not applied")
    return None


# -- destinations -----------------------------------------------------------------------------


def decide_destination_delete(
    destination_id: str, *, exists: bool, waiting: int, in_history: bool, grants: Sequence[str]
) -> None:
    """Whether a destination may be deleted: it exists, no intent waits on it or names it in its
    history, and no grant names it (a destination registered later under this id would inherit
    it). Raises NotFound, DestinationInUse."""
    if not exists:
        raise NotFound(f"destination {destination_id!r} is not registered")
    if waiting:
        raise DestinationInUse(
            f"destination {destination_id!r} has {waiting} intent(s) still waiting; cancel or deliver them first"
        )
    if in_history:
        raise DestinationInUse(
            f"destination {destination_id!r} is named by intents in the history; disable it instead (disabled: true)"
        )
    if grants:
        raise DestinationInUse(
            f"destination {destination_id!r} is named by grants {', '.join(map(repr, grants))}; delete them "
            "first, or a destination registered later under this id would inherit them"
        )


# -- tokens -----------------------------------------------------------------------------------


def not_revoked(token_id: str, found: TokenInfo | None) -> OutboxError:
    """Why a revocation changed nothing, given the token as stored (revoked or not, None when
    there is none): it is the last active admin token (LastAdmin), or no active token (NotFound)."""
    if found is not None and found.revoked_at is None and found.role is Role.ADMIN:
        return LastAdmin(f"token {token_id!r} is the last active admin token: revoking it would leave no one "
                         "able to manage tokens over the API; create another admin token first")
    return NotFound(f"no active token with id {token_id!r}")
