"""The SQLite dialect's enqueue statements (``store.intake.Intake``): one intent, or a batch as a
JSON set in one statement however many, their first events appended by one more."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from ...errors import OutboxError
from ...events import NewEvent
from ...model import Enqueued, Event, NewIntent
from .. import intake
from ..intake import Judged, Returns, Statement
from ..records import Reader, Row, event_data, new_event_values, new_intent_values
from .drivers import Sqlite3
from .sql import READ, SQL, event_row, stored


class SqliteIntake:
    """The statements, with values as SQLite stores them (times as integer microseconds, JSON as
    text, sets as JSON arrays), for any connection to the database: the store's or an app's."""

    def __init__(self, read: Reader) -> None:
        self.read = read

    def destination(self, destination_id: str) -> Statement:
        return Statement(SQL["destination_for_enqueue"], (destination_id,), Returns.ROW)

    def lock_ordering_keys(self, intents: Sequence[NewIntent]) -> None:
        return None  # (SQLite has one writer at a time: a key's seq order is its commit order)

    def insert_intent(self, item: Judged, judged_on: Row) -> Statement:
        return Statement(SQL["insert_intent"], (*_values(item), bool(judged_on["requires_approval"])), Returns.VALUE)

    def insert_intents(self, items: Sequence[Judged]) -> Statement:
        return Statement(SQL["insert_intents_set"], (json.dumps([_values(item) for item in items]),), Returns.ROWS)

    def first_events(self, made: Sequence[tuple[int, Event]]) -> Statement:
        if len(made) == 1:
            seq, e = made[0]
            return Statement(SQL["insert_event"], (seq, e.kind.value, stored(e.at), e.actor, e.reason, event_data(e)),
                             Returns.NOTHING)
        return Statement(SQL["insert_events"], (json.dumps([event_row(seq, e) for seq, e in made]),), Returns.NOTHING)

    def intent_by_key(self, key: str) -> Statement:
        return Statement(SQL["intent_by_key"], (key,), Returns.ROW)

    def intents_by_keys(self, keys: Sequence[str]) -> Statement:
        return Statement(SQL["intents_by_keys"], (json.dumps(list(keys)),), Returns.ROWS)

    def insert_topic_event(self, new: NewEvent) -> Statement:
        return Statement(SQL["insert_topic_event"], tuple(map(stored, new_event_values(new))), Returns.VALUE)

    def insert_topic_events(self, items: Sequence[NewEvent]) -> Statement:
        rows = [list(map(stored, new_event_values(new))) for new in items]
        return Statement(SQL["insert_topic_events"], (json.dumps(rows),), Returns.ROWS)

    def event_subscribers(self, new: NewEvent, granted_only: bool) -> Statement:
        return Statement(SQL["event_subscribers"], (new.scope, new.topic, stored(new.created_at), granted_only),
                         Returns.ROWS)

    def events_subscribers(self, items: Sequence[tuple[int, NewEvent]], granted_only: bool) -> Statement:
        rows = [[n, e.scope, e.topic, stored(e.created_at)] for n, e in items]
        return Statement(SQL["events_subscribers"], (json.dumps(rows), granted_only), Returns.ROWS)

    def set_event_skipped(self, seq: int, skipped: Sequence[tuple[str, str]]) -> Statement:
        return Statement(SQL["set_event_skipped"], (json.dumps(skipped), seq), Returns.NOTHING)

    def event_by_key(self, key: str) -> Statement:
        return Statement(SQL["event_by_key"], (key,), Returns.ROWS)

    def intents_of_events(self, events: Sequence[tuple[str, str]]) -> Statement:
        return Statement(SQL["intents_of_events"], (json.dumps([list(e) for e in events]),), Returns.ROWS)


def _values(item: Judged) -> list[Any]:
    """A new intent's columns from its key to ``created_at``, then its ordering key, event id, trace
    context and the event whose stored payload it sends, stored (as ``insert_intents_set``'s rows are)."""
    new, _, channel, status = item
    return [*map(stored, new_intent_values(new, channel, status)), new.ordering_key, new.event_id, new.trace_context,
            new.payload_event]


#: The statements as this store reads their rows.
INTAKE = SqliteIntake(READ)


def insert_intent(conn: sqlite3.Connection, new: NewIntent, event: Event) -> Enqueued:
    """``intake.insert_intent`` on the store's writer, inside its write transaction."""
    return intake.run(intake.insert_intent(INTAKE, new, event), Sqlite3(conn).execute)


def insert_each(conn: sqlite3.Connection, items: Sequence[tuple[NewIntent, Event]],
                seen: dict[str, Any] | None = None) -> list[Enqueued | OutboxError]:
    """``intake.insert_batch`` on the store's writer, inside its write transaction: an intent
    refused stands as its error in its place."""
    return intake.run(intake.insert_batch(INTAKE, items, seen), Sqlite3(conn).execute)
