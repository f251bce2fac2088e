"""The PostgreSQL store's enqueues: one intent, or a batch in a few statements however many."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import asyncpg

from ...errors import OutboxError
from ...model import Enqueued, Event, NewIntent, Status
from ..records import event_data, new_intent_values
from ..rules import check_payload, decide_existing, decide_initial_status, inserted_intent
from .connection import READ
from .sql import SQL


async def _lock_ordering_keys(conn: asyncpg.Connection, intents: Sequence[NewIntent]) -> None:
    """Make the enqueues of the same destination and ordering key take turns until ``conn``'s
    transaction ends (see ``lock_ordering_keys``)."""
    keyed = [(new.destination, new.ordering_key) for new in intents if new.ordering_key is not None]
    if keyed:
        await conn.fetchval(SQL["lock_ordering_keys"], [d for d, _ in keyed], [k for _, k in keyed])


async def insert_intent(
    conn: asyncpg.Connection, new: NewIntent, event: Event, seen: dict[str, Any] | None = None
) -> Enqueued:
    """The enqueue on ``conn``, inside a transaction: destination check, then insert or compare
    (the rules are ``rules.decide_initial_status`` and ``rules.decide_existing``). A refusal is
    raised before anything is written and without an SQL error, so it leaves the transaction
    usable. ``seen`` remembers destinations across the intents of one batch, whose ordering keys
    were locked all at once before (alone, the intent's key is locked here)."""
    found, status = await _judged(conn, new, seen)
    if seen is None:
        await _lock_ordering_keys(conn, [new])
    while True:
        seq = await conn.fetchval(
            SQL["insert_intent"], *_values(new, event, found["channel"], status))
        if seq is not None:
            return Enqueued(inserted_intent(seq, new, found["channel"], status), created=True)
        existing = await conn.fetchrow(SQL["intent_by_key"], new.key)
        if existing is not None:
            return decide_existing(READ.intent(existing), new)
        # the intent holding the key was pruned between the two statements: the key is free again


async def _judged(conn: asyncpg.Connection, new: NewIntent, seen: dict[str, Any] | None) -> tuple[Any, Status]:
    """``new``'s destination row and the status it starts in; raises the refusal of an unknown
    destination or a payload its channel cannot carry. ``seen`` caches destinations for a batch."""
    found = seen.get(new.destination) if seen is not None else None
    if found is None:
        found = await conn.fetchrow(SQL["destination_for_enqueue"], new.destination)
        if found is not None and seen is not None:
            seen[new.destination] = found
    status = decide_initial_status(new, None if found is None else found["requires_approval"])
    check_payload(new, found["channel"])
    return found, status


async def insert_batch(
    conn: asyncpg.Connection, items: Sequence[tuple[NewIntent, Event]], seen: dict[str, Any] | None = None
) -> list[Enqueued | OutboxError]:
    """A batch's enqueues on ``conn``, inside a transaction, in a few statements however many
    intents: each is judged as alone (a refusal is its result, decided before any write), the new
    keys are inserted with their first events at once, and the rest are compared with the intents
    already holding their keys, as ``rules.decide_existing`` says. ``seen``: destinations' rows
    read already (``destination_for_enqueue``'s columns), by id."""
    await _lock_ordering_keys(conn, [new for new, _ in items])
    seen = {} if seen is None else seen
    results: list[Enqueued | OutboxError | None] = [None] * len(items)
    fresh: dict[str, tuple[int, str, Status]] = {}  # key -> (its first item, channel, status)
    for i, (new, _) in enumerate(items):
        try:
            found, status = await _judged(conn, new, seen)
        except OutboxError as exc:
            results[i] = exc
            continue
        fresh.setdefault(new.key, (i, found["channel"], status))
    rows = [_values(*items[i], channel, status) for i, channel, status in fresh.values()]
    created = {row["intent_key"]: row["seq"] for row in await conn.fetch(
        SQL["insert_intents"], *map(list, zip(*rows, strict=True)))} if rows else {}
    for key, (i, channel, status) in fresh.items():
        if key in created:
            results[i] = Enqueued(inserted_intent(created[key], items[i][0], channel, status), created=True)
    taken = [i for i, result in enumerate(results) if result is None]  # their keys were held already
    existing = {row["intent_key"]: READ.intent(row) for row in await conn.fetch(
        SQL["intents_by_keys"], [items[i][0].key for i in taken])} if taken else {}
    for i in taken:
        new, event = items[i]
        try:
            holder = existing.get(new.key)  # None: pruned since, so the key is free again
            results[i] = decide_existing(holder, new) if holder else await insert_intent(conn, new, event, seen)
        except OutboxError as exc:
            results[i] = exc
    return cast(list[Enqueued | OutboxError], results)  # every place filled above


def _values(new: NewIntent, event: Event, channel: str, status: Status) -> tuple[Any, ...]:
    """An intent and its first event as ``insert_intent`` (one) and ``insert_intents`` (a row of
    their arrays) take them."""
    return (*new_intent_values(new, channel, status),
            event.kind.value, event.at, event.actor, event.reason, event_data(event), new.ordering_key,
            new.event_id, new.trace_context, new.payload_event)
