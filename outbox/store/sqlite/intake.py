"""The SQLite store's enqueues, inside the group-committed write transaction: one intent, or
many as sets."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any, cast

from ...errors import OutboxError
from ...model import Enqueued, Event, NewIntent, Status
from ..records import event_data, new_intent_values
from ..rules import check_payload, decide_existing, decide_initial_status, inserted_intent
from .sql import READ, SQL, event_row, stored


def _append_event(conn: sqlite3.Connection, seq: int, event: Event) -> None:
    conn.execute(SQL["insert_event"], (seq, event.kind, stored(event.at), event.actor, event.reason, event_data(event)))


def _enqueue_target(
    conn: sqlite3.Connection, new: NewIntent, seen: dict[str, sqlite3.Row] | None
) -> tuple[str, Status]:
    """The channel an intent goes through and the status it starts in, checked as
    ``rules.decide_initial_status`` and ``rules.check_payload`` say (raises before any write).
    ``seen`` remembers destinations across the intents of one batch."""
    found = seen.get(new.destination) if seen is not None else None
    if found is None:
        found = conn.execute(SQL["destination_for_enqueue"], (new.destination,)).fetchone()
        if found is not None and seen is not None:
            seen[new.destination] = found
    status = decide_initial_status(new, None if found is None else bool(found["requires_approval"]))
    check_payload(new, found["channel"])
    return found["channel"], status


def insert_intent(conn: sqlite3.Connection, new: NewIntent, event: Event) -> Enqueued:
    """The enqueue, run inside a write transaction: destination check, insert or compare (the
    rules are ``rules.decide_initial_status`` and ``rules.decide_existing``)."""
    channel, status = _enqueue_target(conn, new, None)
    values = _values(new, channel, status)
    # updated_at is created_at (the last of ``values``)
    row = conn.execute(SQL["insert_intent"], (*values, values[-1], new.ordering_key, new.event_id,
                                                   new.trace_context, new.payload_event)).fetchone()
    if row is not None:
        _append_event(conn, row[0], event)
        return Enqueued(inserted_intent(row[0], new, channel, status), created=True)
    return _compared(conn, new)


def _compared(conn: sqlite3.Connection, new: NewIntent) -> Enqueued:
    """``new`` against the intent that holds its key already (``rules.decide_existing``)."""
    return decide_existing(READ.intent(conn.execute(SQL["intent_by_key"], (new.key,)).fetchone()), new)


def insert_each(conn: sqlite3.Connection, items: Sequence[tuple[NewIntent, Event]],
                seen: dict[str, sqlite3.Row] | None = None) -> list[Enqueued | OutboxError]:
    """``insert_intent`` for each of ``items`` in the one write transaction, as sets: one
    statement inserts every intent whose key is free (the first of an intent named twice), one
    appends their first events, and the rest are compared with what holds their key. An intent
    refused stands as its error in its place (refused before any write: it undoes nothing).
    ``seen``: destinations' rows read already (``destination_for_enqueue``'s columns), by id."""
    seen = {} if seen is None else seen
    results: list[Enqueued | OutboxError | None] = [None] * len(items)
    accepted: list[tuple[int, str, Status]] = []
    for i, (new, _) in enumerate(items):
        try:
            accepted.append((i, *_enqueue_target(conn, new, seen)))
        except OutboxError as exc:
            results[i] = exc
    rows = [[*_values(items[i][0], channel, status), items[i][0].ordering_key, items[i][0].event_id,
             items[i][0].trace_context, items[i][0].payload_event]
            for i, channel, status in accepted]
    inserted = dict(conn.execute(SQL["insert_intents_set"], (json.dumps(rows),)).fetchall()) if rows else {}
    events: list[list[Any]] = []
    for i, channel, status in accepted:
        new, event = items[i]
        seq = inserted.pop(new.key, None)  # popped: a second intent of the key compares with the first
        if seq is None:
            try:
                results[i] = _compared(conn, new)
            except OutboxError as exc:
                results[i] = exc
            continue
        events.append(event_row(seq, event))
        results[i] = Enqueued(inserted_intent(seq, new, channel, status), created=True)
    if events:
        conn.execute(SQL["insert_events"], (json.dumps(events),))
    return cast(list[Enqueued | OutboxError], results)  # every place filled above


def _values(new: NewIntent, channel: str, status: Status) -> list[Any]:
    """A new intent's columns from its key to ``created_at``, stored."""
    return [stored(value) for value in new_intent_values(new, channel, status)]
