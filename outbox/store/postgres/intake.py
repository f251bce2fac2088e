"""The PostgreSQL dialect's enqueue statements (``store.intake.Intake``): one intent, or a batch
as arrays in one statement however many, each intent's first event appended by its insert."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import asyncpg

from ...errors import OutboxError
from ...events import NewEvent
from ...model import Enqueued, Event, NewIntent
from .. import intake
from ..intake import Judged, Returns, Statement
from ..records import Reader, Row, event_data, new_event_values, new_intent_values
from .connection import READ
from .drivers import Asyncpg
from .sql import SQL


class PostgresIntake:
    """The statements, with values as every PostgreSQL driver binds them (times as datetimes,
    JSON as text, arrays as lists)."""

    def __init__(self, read: Reader) -> None:
        self.read = read

    def destination(self, destination_id: str) -> Statement:
        return Statement(SQL["destination_for_enqueue"], (destination_id,), Returns.ROW)

    def lock_ordering_keys(self, intents: Sequence[NewIntent]) -> Statement | None:
        keyed = [(new.destination, new.ordering_key) for new in intents if new.ordering_key is not None]
        if not keyed:
            return None
        return Statement(SQL["lock_ordering_keys"], ([d for d, _ in keyed], [k for _, k in keyed]), Returns.VALUE)

    def insert_intent(self, item: Judged, judged_on: Row) -> Statement:
        return Statement(SQL["insert_intent"], (*_values(item), bool(judged_on["requires_approval"])), Returns.VALUE)

    def insert_intents(self, items: Sequence[Judged]) -> Statement:
        columns = tuple(map(list, zip(*map(_values, items), strict=True)))
        return Statement(SQL["insert_intents"], columns, Returns.ROWS)

    def first_events(self, made: Sequence[tuple[int, Event]]) -> None:
        return None  # (each insert appends its intents' first events)

    def intent_by_key(self, key: str) -> Statement:
        return Statement(SQL["intent_by_key"], (key,), Returns.ROW)

    def intents_by_keys(self, keys: Sequence[str]) -> Statement:
        return Statement(SQL["intents_by_keys"], (list(keys),), Returns.ROWS)

    def insert_topic_event(self, new: NewEvent) -> Statement:
        return Statement(SQL["insert_topic_event"], new_event_values(new), Returns.VALUE)

    def insert_topic_events(self, items: Sequence[NewEvent]) -> Statement:
        return Statement(SQL["insert_topic_events"], tuple(map(list, zip(*map(new_event_values, items), strict=True))),
                         Returns.ROWS)

    def event_subscribers(self, new: NewEvent, granted_only: bool) -> Statement:
        return Statement(SQL["event_subscribers"], (new.scope, new.topic, new.created_at, granted_only), Returns.ROWS)

    def events_subscribers(self, items: Sequence[tuple[int, NewEvent]], granted_only: bool) -> Statement:
        return Statement(SQL["events_subscribers"], ([n for n, _ in items], [e.scope for _, e in items],
                                                     [e.topic for _, e in items], [e.created_at for _, e in items],
                                                     granted_only), Returns.ROWS)

    def set_event_skipped(self, seq: int, skipped: Sequence[tuple[str, str]]) -> Statement:
        return Statement(SQL["set_event_skipped"], (json.dumps(skipped), seq), Returns.NOTHING)

    def event_by_key(self, key: str) -> Statement:
        return Statement(SQL["event_by_key"], (key,), Returns.ROWS)

    def intents_of_events(self, events: Sequence[tuple[str, str]]) -> Statement:
        return Statement(SQL["intents_of_events"], ([scope for scope, _ in events], [e for _, e in events]),
                         Returns.ROWS)


def _values(item: Judged) -> tuple[Any, ...]:
    """An intent and its first event as ``insert_intent`` (one) and ``insert_intents`` (a row of
    their arrays) take them."""
    new, event, channel, status = item
    return (*new_intent_values(new, channel, status),
            event.kind.value, event.at, event.actor, event.reason, event_data(event), new.ordering_key,
            new.event_id, new.trace_context, new.payload_event)


#: The statements as this store's connections read their rows (``connection.READ``).
INTAKE = PostgresIntake(READ)


async def insert_intent(conn: asyncpg.Connection, new: NewIntent, event: Event,
                        seen: dict[str, Any] | None = None) -> Enqueued:
    """``intake.insert_intent`` on ``conn``, inside a transaction (the store's, or the caller's)."""
    return await intake.run_async(intake.insert_intent(INTAKE, new, event, seen), Asyncpg(conn).execute)


async def insert_batch(conn: asyncpg.Connection, items: Sequence[tuple[NewIntent, Event]],
                       seen: dict[str, Any] | None = None) -> list[Enqueued | OutboxError]:
    """``intake.insert_batch`` on ``conn``, inside a transaction: an intent refused stands as its
    error in its place."""
    return await intake.run_async(intake.insert_batch(INTAKE, items, seen), Asyncpg(conn).execute)
