"""The PostgreSQL store's events: a publish records the event and makes its intents in one
transaction, in a few statements however many subscribers; subscriptions are rows beside their
destination."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import asyncpg

from ...destinations import Destination
from ...errors import OutboxError
from ...events import EventPage, EventQuery, NewEvent, Published, StoredEvent
from ...model import Enqueued, Event, NewIntent
from ...topics import subscription_rows
from .. import intake
from .connection import SNAPSHOT
from .drivers import Asyncpg
from .intake import INTAKE
from .sql import SQL, where

T = TypeVar("T")


async def replace_subscriptions(conn: asyncpg.Connection, d: Destination) -> None:
    """Make ``d``'s subscription rows what its record says, in the transaction that writes it."""
    await conn.execute(SQL["delete_subscriptions"], d.id)
    rows = subscription_rows(d.id, d.subscriptions)
    if rows:
        await conn.execute(SQL["insert_subscriptions"], *map(list, zip(*rows, strict=True)))


async def publish(conn: asyncpg.Connection, new: NewEvent, granted_only: bool, max_fanout: int | None) -> Published:
    """``intake.publish`` on ``conn``, inside the store's transaction."""
    return await intake.run_async(intake.publish(INTAKE, new, granted_only, max_fanout), Asyncpg(conn).execute)


async def _with_fanout(conn: asyncpg.Connection, rows: Sequence[Any]) -> list[StoredEvent]:
    """Events from their rows, each with its fan-out (``intake.with_fanout``)."""
    return await intake.run_async(intake.with_fanout(INTAKE, rows), Asyncpg(conn).execute)


class PostgresEvents:
    """The store protocol's event methods, over the PostgreSQL store's ``_run``."""

    _run: Callable[..., Awaitable[Any]]

    async def _in_transaction(self, work: Callable[[asyncpg.Connection], Awaitable[T]],
                              transaction: Mapping[str, Any]) -> T:
        result: T = await self._run(work, transaction=transaction)
        return result

    async def publish(self, new: NewEvent, *, granted_only: bool, max_fanout: int | None = None) -> Published:
        return await self._in_transaction(lambda conn: publish(conn, new, granted_only, max_fanout), {})

    async def publish_each(self, items: Sequence[NewEvent], *, granted_only: bool, max_fanout: int | None = None,
                           max_batch_fanout: int | None = None) -> list[Published | OutboxError]:
        return await self._in_transaction(lambda conn: intake.run_async(
            intake.publish_each(INTAKE, items, granted_only, max_fanout, max_batch_fanout),
            Asyncpg(conn).execute), {})

    async def deliver_event(self, new: NewIntent, event: Event) -> tuple[Enqueued, StoredEvent]:
        return await self._in_transaction(lambda conn: intake.run_async(
            intake.deliver(INTAKE, new, event), Asyncpg(conn).execute), {})

    async def get_event(self, key: str) -> StoredEvent | None:
        async def work(conn: asyncpg.Connection) -> StoredEvent | None:
            found = await _with_fanout(conn, await conn.fetch(SQL["event_by_key"], key))
            return found[0] if found else None

        return await self._in_transaction(work, SNAPSHOT)

    async def events_named(self, event_id: str) -> list[StoredEvent]:
        async def work(conn: asyncpg.Connection) -> list[StoredEvent]:
            return await _with_fanout(conn, await conn.fetch(SQL["events_by_id"], event_id))

        return await self._in_transaction(work, SNAPSHOT)

    async def list_events(self, query: EventQuery) -> EventPage:
        params: list[Any] = [query.limit + 1]
        sql = SQL["list_events"].format(where=where(query.filters(), params))

        async def work(conn: asyncpg.Connection) -> EventPage:
            return query.page(await _with_fanout(conn, await conn.fetch(sql, *params)))

        return await self._in_transaction(work, SNAPSHOT)
