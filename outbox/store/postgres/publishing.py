"""The PostgreSQL store's events: a publish records the event and makes its intents in one
transaction, in a few statements however many subscribers; subscriptions are rows beside their
destination."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

import asyncpg

from ...destinations import Destination
from ...errors import NotFound, OutboxError
from ...events import EventPage, EventQuery, NewEvent, Published, StoredEvent, event_key
from ...model import Enqueued, Event, NewIntent
from ...topics import subscription_rows
from ..records import new_event_values
from ..rules import decide_existing_event, fanout_of, fanout_refusal, sending_event_payload
from .connection import READ, SNAPSHOT
from .intake import insert_batch
from .sql import SQL, where

T = TypeVar("T")


async def replace_subscriptions(conn: asyncpg.Connection, d: Destination) -> None:
    """Make ``d``'s subscription rows what its record says, in the transaction that writes it."""
    await conn.execute(SQL["delete_subscriptions"], d.id)
    rows = subscription_rows(d.id, d.subscriptions)
    if rows:
        await conn.execute(SQL["insert_subscriptions"], *map(list, zip(*rows, strict=True)))


async def publish(conn: asyncpg.Connection, new: NewEvent, granted_only: bool, max_fanout: int | None) -> Published:
    """Record ``new`` and make its intents on ``conn``, inside a transaction: one for each
    destination subscribed to its topic for its scope (with ``granted_only``, that the scope holds a
    live grant for), as a set (``intake.insert_batch``); a subscriber whose intent is refused is
    recorded as skipped. An event already recorded under its key is compared
    (``rules.decide_existing_event``); one that would make more than ``max_fanout`` intents is
    refused (``rules.fanout_refusal``); a refusal raises before anything is written."""
    seen = {r["id"]: r for r in await conn.fetch(
        SQL["event_subscribers"], new.scope, new.topic, new.created_at, granted_only)}
    if (refused := fanout_refusal(new, len(seen), max_fanout)) is not None:
        return await _recorded_or(conn, new, refused)
    seq = await conn.fetchval(SQL["insert_topic_event"], *new_event_values(new))
    if seq is None:  # (a concurrent publish of the key has committed: ON CONFLICT waited for it)
        return decide_existing_event(await _event(conn, new.key), new)
    items = [new.intent_for(destination, seq) for destination in seen]
    intents, skipped = fanout_of(items, await insert_batch(conn, items, seen) if items else [])
    if skipped:
        await conn.execute(SQL["set_event_skipped"], json.dumps(skipped), seq)
    return Published(StoredEvent.recorded(seq, new).with_fanout(intents, skipped), created=True)


async def publish_each(conn: asyncpg.Connection, items: Sequence[NewEvent], granted_only: bool,
                       max_fanout: int | None) -> list[Published | OutboxError]:
    """``publish`` for each of ``items`` on ``conn``, inside a transaction, in a few statements
    however many events: their subscribers are read at once, the new keys of those within
    ``max_fanout`` recorded at once and every intent made by one ``intake.insert_batch``; the rest
    (keys recorded already, or earlier in the batch, and the events past ``max_fanout``) are
    compared afterwards with the event holding the key, or refused. A refusal stands as its error
    in its place (decided before any write of that event: it undoes nothing)."""
    seen: dict[str, Any] = {}
    subscribers: dict[int, list[str]] = {i: [] for i in range(len(items))}
    for row in await conn.fetch(SQL["events_subscribers"], list(subscribers), [new.scope for new in items],
                                [new.topic for new in items], [new.created_at for new in items],
                                granted_only) if items else []:
        seen.setdefault(row["id"], row)
        subscribers[row["n"]].append(row["id"])
    refused = {i: found for i, new in enumerate(items)
               if (found := fanout_refusal(new, len(subscribers[i]), max_fanout)) is not None}
    within = [new for i, new in enumerate(items) if i not in refused]
    recorded = dict(await conn.fetch(SQL["insert_topic_events"], *map(list, zip(
        *(new_event_values(new) for new in within), strict=True)))) if within else {}
    fresh = {i: recorded.pop(new.key) for i, new in enumerate(items) if i not in refused and new.key in recorded}
    wanted = list(fresh)
    made = [(i, items[i].intent_for(d, fresh[i])) for i in wanted for d in subscribers[i]]
    stored = await insert_batch(conn, [item for _, item in made], seen) if made else []
    results: list[Published | OutboxError | None] = [None] * len(items)
    for i, seq in fresh.items():
        mine = [(item, result) for (n, item), result in zip(made, stored, strict=True) if n == i]
        intents, skipped = fanout_of([item for item, _ in mine], [result for _, result in mine])
        if skipped:
            await conn.execute(SQL["set_event_skipped"], json.dumps(skipped), seq)
        results[i] = Published(StoredEvent.recorded(seq, items[i]).with_fanout(intents, skipped), created=True)
    for i, new in enumerate(items):
        if results[i] is None:
            try:
                results[i] = (await _recorded_or(conn, new, refused[i]) if i in refused
                              else decide_existing_event(await _event(conn, new.key), new))
            except OutboxError as exc:
                results[i] = exc
    return cast(list[Published | OutboxError], results)  # every place filled above


async def _recorded_or(conn: asyncpg.Connection, new: NewEvent, refused: OutboxError) -> Published:
    """``new`` compared with the event recorded under its key (``rules.decide_existing_event``),
    or, with none recorded, ``refused`` raised."""
    try:
        existing = await _event(conn, new.key)
    except NotFound:
        raise refused from None
    return decide_existing_event(existing, new)


async def deliver(conn: asyncpg.Connection, new: NewIntent, event: Event) -> tuple[Enqueued, StoredEvent]:
    """Make ``new``, an event's intent for one more destination, unless it exists (an operator's
    delivery); returns it and the event as it then stands. Raises UnknownDestination,
    InvalidInput (its channel refuses the payload), IntentConflict."""
    found = await _event(conn, event_key(new))  # (raises NotFound before any write)
    (result,) = await insert_batch(conn, [(sending_event_payload(new, found), event)])
    if isinstance(result, OutboxError):
        raise result
    return result, await _event(conn, event_key(new))


async def _event(conn: asyncpg.Connection, key: str) -> StoredEvent:
    """The event recorded under ``key``, with its fan-out; raises NotFound."""
    found = await _with_fanout(conn, await conn.fetch(SQL["event_by_key"], key))
    if not found:
        scope, _, event_id = key.rpartition("/")
        raise NotFound(f"event {event_id!r} does not exist in scope {scope!r}")
    return found[0]


async def _with_fanout(conn: asyncpg.Connection, rows: Sequence[Any]) -> list[StoredEvent]:
    """Events from their rows, each with its fan-out (one read for every row's intents)."""
    if not rows:
        return []
    intents: dict[tuple[str, str], list[Any]] = {}
    for r in await conn.fetch(SQL["intents_of_events"], [row["scope"] for row in rows],
                              [row["event_id"] for row in rows]):
        intents.setdefault((r["scope"], r["event_id"]), []).append(READ.intent(r))
    return [READ.event_of(row, intents.get((row["scope"], row["event_id"]), [])) for row in rows]


class PostgresEvents:
    """The store protocol's event methods, over the PostgreSQL store's ``_run``."""

    _run: Callable[..., Awaitable[Any]]

    async def _in_transaction(self, work: Callable[[asyncpg.Connection], Awaitable[T]],
                              transaction: Mapping[str, Any]) -> T:
        result: T = await self._run(work, transaction=transaction)
        return result

    async def publish(self, new: NewEvent, *, granted_only: bool, max_fanout: int | None = None) -> Published:
        return await self._in_transaction(lambda conn: publish(conn, new, granted_only, max_fanout), {})

    async def publish_each(self, items: Sequence[NewEvent], *, granted_only: bool,
                           max_fanout: int | None = None) -> list[Published | OutboxError]:
        return await self._in_transaction(lambda conn: publish_each(conn, items, granted_only, max_fanout), {})

    async def deliver_event(self, new: NewIntent, event: Event) -> tuple[Enqueued, StoredEvent]:
        return await self._in_transaction(lambda conn: deliver(conn, new, event), {})

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
