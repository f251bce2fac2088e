"""Published events and their fan-out: the records a store keeps and answers with.

An event (``scope``, ``topic``, payload) is recorded in the commit that makes one intent per
destination subscribed to its topic (``outbox.topics``) for its scope; each intent's action id is
``topics.action_id_for(event_id, destination)``, so publishing again, or an operator delivering
the event to a destination later, finds the same intent. An event is known by its key,
``scope/event_id``, as an intent is by ``scope/action_id``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from .ids import intent_key
from .model import Event, EventKind, Intent, NewIntent, Status
from .topics import action_id_for


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event as the store is asked to record it (validated and digested); the intent fields
    are those each of its intents gets."""

    event_id: str
    scope: str
    topic: str
    payload_json: str
    payload_digest: str
    max_attempts: int
    next_attempt_at: datetime
    not_before: datetime | None
    expires_at: datetime | None
    created_at: datetime
    ordering_key: str | None
    actor: str
    trace_context: str | None = None  # its create span's W3C context, which each of its intents keeps

    @property
    def key(self) -> str:
        """``scope/event_id``."""
        return intent_key(self.scope, self.event_id)

    def intent_for(self, destination: str, seq: int | None = None) -> tuple[NewIntent, Event]:
        """The intent this event makes for ``destination``, and its first history entry; ``seq``:
        the event as recorded, whose stored payload the intent then sends (``payload_event``)."""
        new = NewIntent(
            action_id=action_id_for(self.event_id, destination), scope=self.scope, destination=destination,
            payload_json=self.payload_json, payload_digest=self.payload_digest, max_attempts=self.max_attempts,
            next_attempt_at=self.next_attempt_at, not_before=self.not_before, expires_at=self.expires_at,
            created_at=self.created_at, ordering_key=self.ordering_key, event_id=self.event_id,
            trace_context=self.trace_context, payload_event=seq)
        return new, Event(kind=EventKind.ENQUEUED, at=self.created_at, actor=self.actor,
                          reason=f"event {self.event_id} ({self.topic})", data={"event_id": self.event_id})


def event_key(new: NewIntent) -> str:
    """The key of the event an event's intent delivers (``new.event_id`` is set)."""
    assert new.event_id is not None
    return intent_key(new.scope, new.event_id)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One destination's part of an event's fan-out: its intent, or why it has none (its channel
    refused the payload, or its derived action id was taken: ``skipped``)."""

    destination: str
    action_id: str
    status: Status | None = None  # the intent's current status; None when skipped
    skipped: str | None = None

    @classmethod
    def of(cls, intent: Intent) -> Delivery:
        """The part an intent of the event plays in its fan-out."""
        return cls(intent.destination, intent.action_id, intent.status)


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """A recorded event and its fan-out (by destination)."""

    seq: int
    event_id: str
    scope: str
    topic: str
    payload_json: str
    payload_digest: str
    ordering_key: str | None
    created_at: datetime
    actor: str
    fanout: tuple[Delivery, ...] = ()

    @classmethod
    def recorded(cls, seq: int, new: NewEvent) -> StoredEvent:
        """The event just recorded under ``seq``, from what was written rather than read back."""
        return cls(seq=seq, event_id=new.event_id, scope=new.scope, topic=new.topic, payload_json=new.payload_json,
                   payload_digest=new.payload_digest, ordering_key=new.ordering_key, created_at=new.created_at,
                   actor=new.actor)

    @property
    def key(self) -> str:
        """``scope/event_id``."""
        return intent_key(self.scope, self.event_id)

    @property
    def payload(self) -> Any:
        """The payload as Python values."""
        return json.loads(self.payload_json)

    def with_fanout(self, intents: Sequence[Intent], skipped: Sequence[tuple[str, str]]) -> StoredEvent:
        """This event with its fan-out: the intents it made (``intents``) and the destinations
        it skipped, ``(destination, reason)``, by destination."""
        found = [Delivery.of(i) for i in intents]
        found += [Delivery(d, action_id_for(self.event_id, d), None, reason) for d, reason in skipped
                  if d not in {i.destination for i in intents}]  # (delivered since by an operator)
        return replace(self, fanout=tuple(sorted(found, key=lambda d: d.destination)))


@dataclass(frozen=True, slots=True)
class Published:
    """The result of a publish: the event with its fan-out, and whether this call recorded it."""

    event: StoredEvent
    created: bool


@dataclass(frozen=True, slots=True)
class EventQuery:
    """Filters for listing events; every field narrows, ``None`` means any."""

    scopes: Sequence[str] | None = None
    topic: str | None = None  # a pattern (``topics.PATTERN``)
    event_id: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    before_seq: int | None = None  # the cursor: only events older than this one
    limit: int = 50

    def filters(self) -> list[tuple[str, str, Any]]:
        """The narrowing filters as ``(column, operator, value)``, as ``IntentQuery.filters``
        gives them, and the operator ``prefix``: the column starts with the value."""
        found: list[tuple[str, str, Any]] = []
        if self.scopes is not None:  # none at all matches nothing
            found.append(("scope", "in", list(self.scopes)))
        if self.topic is not None and self.topic != "*":
            found.append(("topic", "prefix", self.topic[:-1]) if self.topic.endswith(".*")
                         else ("topic", "=", self.topic))
        for column, operator, value in (
            ("event_id", "=", self.event_id),
            ("created_at", ">=", self.created_after),
            ("created_at", "<", self.created_before),
            ("seq", "<", self.before_seq),
        ):
            if value is not None:
                found.append((column, operator, value))
        return found

    def page(self, events: list[StoredEvent]) -> EventPage:
        """The page of ``events`` read for this query (up to ``limit + 1``, newest first)."""
        shown = events[: self.limit]
        return EventPage(shown, shown[-1].seq if len(events) > self.limit and shown else None)


@dataclass(frozen=True, slots=True)
class EventPage:
    """A page of events (with their fan-outs), newest first; ``next_seq`` continues it."""

    events: list[StoredEvent]
    next_seq: int | None
