"""The SQLite store's events: a publish records the event and makes its intents in one
group-committed job; subscriptions are rows beside their destination."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ...destinations import Destination
from ...errors import OutboxError
from ...events import EventPage, EventQuery, NewEvent, Published, StoredEvent
from ...model import Enqueued, Event, NewIntent
from ...topics import subscription_rows
from .. import intake
from .drivers import Sqlite3
from .intake import INTAKE
from .sql import SQL, where

T = TypeVar("T")


def replace_subscriptions(conn: sqlite3.Connection, d: Destination) -> None:
    """Make ``d``'s subscription rows what its record says, in the transaction that writes it."""
    conn.execute(SQL["delete_subscriptions"], (d.id,))
    if d.subscriptions:
        conn.execute(SQL["insert_subscriptions"], (json.dumps(subscription_rows(d.id, d.subscriptions)),))


def publish(conn: sqlite3.Connection, new: NewEvent, granted_only: bool, max_fanout: int | None) -> Published:
    """``intake.publish`` on the store's writer, inside its write transaction."""
    return intake.run(intake.publish(INTAKE, new, granted_only, max_fanout), Sqlite3(conn).execute)


def _with_fanout(conn: sqlite3.Connection, rows: list[Any]) -> list[StoredEvent]:
    """Events from their rows, each with its fan-out (``intake.with_fanout``)."""
    return intake.run(intake.with_fanout(INTAKE, rows), Sqlite3(conn).execute)


class SqliteEvents:
    """The store protocol's event methods, over the SQLite store's ``_write`` and ``_read``."""

    _write: Callable[..., Any]
    _read: Callable[..., Any]

    async def publish(self, new: NewEvent, *, granted_only: bool, max_fanout: int | None = None) -> Published:
        result: Published = await self._write(lambda conn: publish(conn, new, granted_only, max_fanout))
        return result

    async def publish_each(self, items: Sequence[NewEvent], *, granted_only: bool, max_fanout: int | None = None,
                           max_batch_fanout: int | None = None) -> list[Published | OutboxError]:
        results: list[Published | OutboxError] = await self._write(lambda conn: intake.run(
            intake.publish_each(INTAKE, items, granted_only, max_fanout, max_batch_fanout),
            Sqlite3(conn).execute))
        return results

    async def deliver_event(self, new: NewIntent, event: Event) -> tuple[Enqueued, StoredEvent]:
        result: tuple[Enqueued, StoredEvent] = await self._write(lambda conn: intake.run(
            intake.deliver(INTAKE, new, event), Sqlite3(conn).execute))
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
