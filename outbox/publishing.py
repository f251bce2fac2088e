"""The library's events: publish one (its fan-out made in the same commit), read them, and an
operator's delivery of an existing event to one more destination.

    published = await box.publish(scope="acme", topic="invoice.paid", payload={"invoice": 42})
    for delivery in published.event.fanout:   # one intent per subscribed destination
        print(delivery.destination, delivery.action_id, delivery.status or delivery.skipped)

A part of ``outbox.Outbox`` (which the library's docs describe); kept apart so the facade stays
one screenful per concern.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Unpack

from .cursor import MAX_PAGE
from .errors import AmbiguousActionId, FanoutTooLarge, InvalidInput, NotFound, OutboxError
from .events import EventPage, EventQuery, NewEvent, Published, StoredEvent
from .ids import SCOPE, check, intent_key
from .intake import EventFields, Intake
from .metrics import Metrics
from .model import Enqueued, Event, EventKind, NewIntent
from .settings import Settings
from .signals import Signal
from .store import Store, Transaction
from .topics import EVENT_ID, action_id_for, checked_pattern


class Publishing:
    """``Outbox``'s event methods (it provides ``store``, ``settings``, ``metrics``, ``enqueued``
    and ``prepare``)."""

    store: Store
    settings: Settings
    metrics: Metrics
    enqueued: Signal
    intake: Intake
    prepare: Callable[..., tuple[NewIntent, Event]]  # (``Outbox.prepare``)

    @property
    def granted_only(self) -> bool:
        """Whether a fan-out reaches only the destinations the scope holds a grant for
        (``Intake.granted_only``)."""
        return self.intake.granted_only

    def prepare_event(self, **event: Any) -> NewEvent:
        """Validate and digest an event without writing it (``Intake.event``). Raises InvalidInput."""
        return self.intake.event(**event)

    async def publish(self, **event: Unpack[EventFields]) -> Published:
        """Record an event and, in the same commit, one intent per destination subscribed to its
        topic for its scope (``Store.publish``); returns once it survives power loss. The same
        scope, event_id, topic, payload and ordering_key again returns the event as recorded
        (``created=False``); anything else under that scope and event_id raises IntentConflict. A new
        event that would make more intents than ``settings.max_fanout`` raises FanoutTooLarge."""
        try:
            result = await self.store.publish(self.prepare_event(**event), granted_only=self.granted_only,
                                              max_fanout=self.settings.max_fanout)
        except FanoutTooLarge:
            self._published([], refused=1)
            raise
        self._published([result])
        return result

    async def publish_each(self, events: Iterable[Mapping[str, Any]]) -> list[Published | OutboxError]:
        """Publish several events in one transaction (one fsync), each on its own: an event refused
        (invalid, conflicting, past ``settings.max_fanout``, or taking the batch past
        ``settings.max_batch_fanout`` intents in all) stands as its error in its place and the
        others are recorded."""
        results: list[Published | OutboxError | None] = []
        prepared: list[NewEvent] = []
        for event in events:
            try:
                prepared.append(self.prepare_event(**event))
                results.append(None)
            except InvalidInput as exc:
                results.append(exc)
        stored = iter(await self.store.publish_each(prepared, granted_only=self.granted_only,
                                                    max_fanout=self.settings.max_fanout,
                                                    max_batch_fanout=self.settings.max_batch_fanout)
                      if prepared else [])
        done = [next(stored) if result is None else result for result in results]
        self._published([r for r in done if isinstance(r, Published)],
                        refused=sum(isinstance(r, FanoutTooLarge) for r in done))
        return done

    async def get_event(self, event_id: str, *, scope: str | None = None,
                        scopes: Sequence[str] | None = None) -> StoredEvent:
        """The event an id names, with its fan-out: in ``scope`` when given, else the one among
        ``scopes`` (None: every scope) that uses it. Raises NotFound, AmbiguousActionId."""
        check(EVENT_ID, event_id, "event_id")
        if scope is not None:
            check(SCOPE, scope, "scope")
            found = [] if scopes is not None and scope not in scopes else [
                e for e in [await self.store.get_event(intent_key(scope, event_id))] if e is not None]
        else:
            found = [e for e in await self.store.events_named(event_id) if scopes is None or e.scope in scopes]
        if not found:
            raise NotFound(f"event {event_id!r} does not exist" + (f" in scope {scope!r}" if scope else ""))
        if len(found) > 1:
            raise AmbiguousActionId(f"event_id {event_id!r} is used in {len(found)} scopes "
                                    f"({', '.join(e.scope for e in found)}); name the scope too")
        return found[0]

    async def list_events(self, query: EventQuery) -> EventPage:
        """A page of events with their fan-outs, newest first."""
        if not 1 <= query.limit <= MAX_PAGE:
            raise InvalidInput(f"limit must be between 1 and {MAX_PAGE}")
        for scope in query.scopes or ():
            check(SCOPE, scope, "scope")
        if query.topic is not None:
            checked_pattern(query.topic)
        if query.event_id is not None:
            check(EVENT_ID, query.event_id, "event_id")
        return await self.store.list_events(query)

    async def deliver_event(self, event_id: str, destination: str, *, scope: str | None = None,
                            scopes: Sequence[str] | None = None, actor: str = "library",
                            reason: str | None = None) -> tuple[Enqueued, StoredEvent]:
        """Deliver an existing event to ``destination`` now, subscribed or not (an operator's
        catch-up for a subscription added later): its intent, made unless it exists (the same
        derived action id, so asking twice makes one), and the event as it then stands. The
        send-time authority check still applies. Raises NotFound, UnknownDestination,
        InvalidInput (the destination's channel refuses the payload)."""
        found = await self.get_event(event_id, scope=scope, scopes=scopes)
        new, first = self.prepare(destination=destination, scope=found.scope, payload=found.payload,
                                  action_id=action_id_for(found.event_id, destination),
                                  ordering_key=found.ordering_key, actor=actor)
        first = Event(kind=EventKind.ENQUEUED, at=first.at, actor=actor,
                      reason=reason or f"event {found.event_id} ({found.topic}) delivered by an operator",
                      data={"event_id": found.event_id})
        result = await self.store.deliver_event(replace(new, event_id=found.event_id), first)
        self._published([], intents=int(result[0].created))
        return result

    def _published(self, results: Sequence[Published], intents: int = 0, refused: int = 0) -> None:
        """Count what publishing recorded (and ``refused`` events past ``max_fanout``), and wake an
        embedded worker if it made intents."""
        created = [r for r in results if r.created]
        intents += sum(1 for r in created for d in r.event.fanout if d.status is not None)
        self.metrics.published(len(created), intents, refused)
        if intents:
            self.enqueued.notify()


class PublishingTransaction:
    """``OutboxTransaction``'s publish: the event and its intents commit with the caller's SQL."""

    _outbox: Publishing
    _tx: Transaction

    async def publish(self, **event: Unpack[EventFields]) -> Published:
        """As ``Outbox.publish``; durable when the transaction commits."""
        outbox = self._outbox
        try:
            return await self._tx.publish(outbox.prepare_event(**event), granted_only=outbox.granted_only,
                                          max_fanout=outbox.settings.max_fanout)
        except FanoutTooLarge:
            outbox.metrics.published(0, 0, refused=1)
            raise
