"""The PostgreSQL dialect's enqueue statements (``store.intake.Intake``): one intent, or a batch
as arrays in one statement however many, each intent's first event appended by its insert."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

from ...errors import OutboxError
from ...model import Enqueued, Event, NewIntent
from .. import intake
from ..intake import Judged, Returns, Statement
from ..records import Reader, event_data, new_intent_values
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

    def insert_intent(self, item: Judged) -> Statement:
        return Statement(SQL["insert_intent"], _values(item), Returns.VALUE)

    def insert_intents(self, items: Sequence[Judged]) -> Statement:
        columns = tuple(map(list, zip(*map(_values, items), strict=True)))
        return Statement(SQL["insert_intents"], columns, Returns.ROWS)

    def first_events(self, made: Sequence[tuple[int, Event]]) -> None:
        return None  # (each insert appends its intents' first events)

    def intent_by_key(self, key: str) -> Statement:
        return Statement(SQL["intent_by_key"], (key,), Returns.ROW)

    def intents_by_keys(self, keys: Sequence[str]) -> Statement:
        return Statement(SQL["intents_by_keys"], (list(keys),), Returns.ROWS)


def _values(item: Judged) -> tuple[Any, ...]:
    """An intent and its first event as ``insert_intent`` (one) and ``insert_intents`` (a row of
    their arrays) take them."""
    new, event, channel, status = item
    return (*new_intent_values(new, channel, status),
            event.kind.value, event.at, event.actor, event.reason, event_data(event), new.ordering_key,
            new.event_id, new.trace_context)


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
