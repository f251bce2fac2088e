"""The SQLite store's events: a publish records the event and makes its intents in one
group-committed job; subscriptions are rows beside their destination."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ...destinations import Destination
from ...errors import NotFound, OutboxError
from ...events import EventPage, EventQuery, NewEvent, Published, StoredEvent, event_key
from ...model import Enqueued, Event, NewIntent
from ...topics import subscription_rows
from ..records import new_event_values
from ..rules import decide_existing_event, fanout_of, fanout_refusal, sending_event_payload
from .intake import insert_each
from .sql import READ, SQL, stored, where

T = TypeVar("T")


def replace_subscriptions(conn: sqlite3.Connection, d: Destination) -> None:
    """Make ``d``'s subscription rows what its record says, in the transaction that writes it."""
    conn.execute(SQL["delete_subscriptions"], (d.id,))
    if d.subscriptions:
        conn.execute(SQL["insert_subscriptions"], (json.dumps(subscription_rows(d.id, d.subscriptions)),))


def publish(conn: sqlite3.Connection, new: NewEvent, granted_only: bool, max_fanout: int | None) -> Published:
    """Record ``new`` and make its intents, inside a write transaction: one for each destination
    subscribed to its topic for its scope (with ``granted_only``, that the scope holds a live grant
    for), as a set (``intake.insert_each``); a subscriber whose intent is refused is recorded as
    skipped. An event already recorded under its key is compared (``rules.decide_existing_event``);
    one that would make more than ``max_fanout`` intents is refused before any write
    (``rules.fanout_refusal``)."""
    seen = {r["id"]: r for r in conn.execute(
        SQL["event_subscribers"], (new.scope, new.topic, stored(new.created_at), granted_only))}
    if (refused := fanout_refusal(new, len(seen), max_fanout)) is not None:
        if not conn.execute(SQL["event_by_key"], (new.key,)).fetchone():
            raise refused
        return decide_existing_event(_event(conn, new.key), new)
    row = conn.execute(SQL["insert_topic_event"], tuple(map(stored, new_event_values(new)))).fetchone()
    if row is None:
        return decide_existing_event(_event(conn, new.key), new)
    items = [new.intent_for(destination, row[0]) for destination in seen]
    intents, skipped = fanout_of(items, insert_each(conn, items, seen) if items else [])
    if skipped:
        conn.execute(SQL["set_event_skipped"], (json.dumps(skipped), row[0]))
    return Published(StoredEvent.recorded(row[0], new).with_fanout(intents, skipped), created=True)


def publish_each(conn: sqlite3.Connection, items: Sequence[NewEvent], granted_only: bool,
                 max_fanout: int | None) -> list[Published | OutboxError]:
    """``publish`` for each of ``items`` in the one write transaction, each on its own (a
    refusal, decided before that event's writes, stands as its error in its place)."""
    results: list[Published | OutboxError] = []
    for new in items:
        try:
            results.append(publish(conn, new, granted_only, max_fanout))
        except OutboxError as exc:
            results.append(exc)
    return results


def deliver(conn: sqlite3.Connection, new: NewIntent, event: Event) -> tuple[Enqueued, StoredEvent]:
    """Make ``new``, an event's intent for one more destination, unless it exists (an operator's
    delivery); returns it and the event as it then stands. Raises UnknownDestination,
    InvalidInput (its channel refuses the payload), IntentConflict."""
    found = _event(conn, event_key(new))  # (raises NotFound before any write)
    (result,) = insert_each(conn, [(sending_event_payload(new, found), event)])
    if isinstance(result, OutboxError):
        raise result
    return result, _event(conn, event_key(new))


def _event(conn: sqlite3.Connection, key: str) -> StoredEvent:
    """The event recorded under ``key``, with its fan-out; raises NotFound."""
    found = _with_fanout(conn, list(conn.execute(SQL["event_by_key"], (key,))))
    if not found:
        raise NotFound(f"event {key.rpartition('/')[2]!r} does not exist in scope {key.rpartition('/')[0]!r}")
    return found[0]


def _with_fanout(conn: sqlite3.Connection, rows: list[Any]) -> list[StoredEvent]:
    """Events from their rows, each with its fan-out (one read for every row's intents)."""
    if not rows:
        return []
    wanted = json.dumps([[row["scope"], row["event_id"]] for row in rows])
    intents: dict[tuple[str, str], list[Any]] = {}
    for r in conn.execute(SQL["intents_of_events"], (wanted,)):
        intents.setdefault((r["scope"], r["event_id"]), []).append(READ.intent(r))
    return [READ.event_of(row, intents.get((row["scope"], row["event_id"]), [])) for row in rows]


class SqliteEvents:
    """The store protocol's event methods, over the SQLite store's ``_write`` and ``_read``."""

    _write: Callable[..., Any]
    _read: Callable[..., Any]

    async def publish(self, new: NewEvent, *, granted_only: bool, max_fanout: int | None = None) -> Published:
        result: Published = await self._write(lambda conn: publish(conn, new, granted_only, max_fanout))
        return result

    async def publish_each(self, items: Sequence[NewEvent], *, granted_only: bool,
                           max_fanout: int | None = None) -> list[Published | OutboxError]:
        results: list[Published | OutboxError] = await self._write(
            lambda conn: publish_each(conn, items, granted_only, max_fanout))
        return results

    async def deliver_event(self, new: NewIntent, event: Event) -> tuple[Enqueued, StoredEvent]:
        result: tuple[Enqueued, StoredEvent] = await self._write(lambda conn: deliver(conn, new, event))
        return result

    async def get_event(self, key: str) -> StoredEvent | None:
        def run(conn: sqlite3.Connection) -> StoredEvent | None:
            found = _with_fanout(conn, list(conn.execute(SQL["event_by_key"], (key,))))
            return found[0] if found else None

        result: StoredEvent | None = await self._read(_snapshot(run))
        return result

    async def events_named(self, event_id: str) -> list[StoredEvent]:
        result: list[StoredEvent] = await self._read(_snapshot(
            lambda conn: _with_fanout(conn, list(conn.execute(SQL["events_by_id"], (event_id,))))))
        return result

    async def list_events(self, query: EventQuery) -> EventPage:
        params: list[Any] = []
        sql = SQL["list_events"].format(where=where(query.filters(), params))
        params.append(query.limit + 1)
        result: EventPage = await self._read(_snapshot(
            lambda conn: query.page(_with_fanout(conn, list(conn.execute(sql, params))))))
        return result


def _snapshot(read: Callable[[sqlite3.Connection], T]) -> Callable[[sqlite3.Connection], T]:
    """``read`` in one read transaction: events and their intents as of one moment."""

    def run(conn: sqlite3.Connection) -> T:
        conn.execute("BEGIN")
        try:
            return read(conn)
        finally:
            conn.execute("COMMIT")

    return run
