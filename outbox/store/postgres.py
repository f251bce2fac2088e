"""The PostgreSQL store (asyncpg): outbox processes on many hosts share one database.

Each write is its own transaction on a pooled connection, and a claim is one statement that
locks what it leases with ``FOR UPDATE SKIP LOCKED``, so claimers neither wait for each other
nor get the same intent. Hosts judge leases on one timeline, the database's: ``clock_offset``
says how far this host's clock is from it (``Outbox.open`` moves its clock by that much).
Statements that make an intent pending notify at commit, and ``listen`` wakes this process's
workers on it; polling stays the fallback. The caller's own asyncpg connection can carry
enqueues inside the caller's transaction (``transaction(connection=...)``).

This module is the only one that imports asyncpg, and ``store_for_url`` imports it only for a
PostgreSQL URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, cast

import asyncpg

from .. import crash
from ..destinations import Destination
from ..errors import InvalidInput, NotFound, OutboxError, StaleWrite, StoreUnavailable
from ..grants import Grant, GrantSpec
from ..keyring import Keyring, required
from ..model import (
    MOVES,
    Attempt,
    Cancel,
    Change,
    Enqueued,
    Event,
    Intent,
    NewIntent,
    OperatorChange,
    Replay,
    Settle,
    Start,
    Status,
    check_change,
)
from ..tokens import TokenInfo
from . import moves, records
from .migrator import Migration, run_migrations, scripts_for
from .plumbing import queries
from .protocol import Activity, Applied, AttemptMinute, Claim, Failure, History, IntentQuery, Page, Span, Waiting
from .rules import (
    check_payload,
    decide_destination_delete,
    decide_existing,
    decide_initial_status,
    inserted_intent,
    not_revoked,
    whole_or_refused,
)

SQL = queries.load("postgres")
#: The statements that pick due intents share one rule for ordered keys (``claimable``).
SQL = {**SQL, **{name: SQL[name].format(claimable=SQL["claimable"], logged=SQL["logged"])
                  for name in ("cycle", "next_due_at")}}
#: The moves a worker's cycle applies in one statement (``cycle``), beside its claim.
CYCLE = ("settle", "start")
#: Each other move's block appends its events the same way (``logged``).
SQL = {**SQL, **{name: SQL[name].format(logged=SQL["logged"]) for name in MOVES
                 if name not in ("claim", "recover", *CYCLE)}}
log = logging.getLogger("outbox.store")
T = TypeVar("T")

#: What the statements that make an intent pending notify (sql/postgres.sql), and ``listen`` hears.
CHANNEL = "outbox_due"
#: How the listening connection shows in ``pg_stat_activity``.
LISTENER = "outbox listener"
#: A quiet listening connection proves it is still there this often: a silent network loss
#: (no reset, no close) is found within about twice this.
KEEPALIVE_SECONDS = 30.0
#: Longest wait for a pooled connection or a statement's answer: a server that went silent (a
#: network that drops packets) is then "not now" within this, not after the kernel gives up on
#: the connection many minutes later. Migrations get longer.
STATEMENT_SECONDS = 60.0
MIGRATION_SECONDS = 3600.0
#: The pause before listening again after a lost connection, doubling while connecting fails.
RELISTEN_SECONDS = (0.1, 30.0)
#: The transaction of reads that must see one snapshot.
SNAPSHOT: Mapping[str, Any] = {"isolation": "repeatable_read", "readonly": True}

#: Errors that mean "not now" rather than "wrong", answered 503 with Retry-After: the server
#: unreachable or shutting down, the connection lost, resources exhausted, the database not there
#: (yet) or read-only for now, a lock or serialization conflict that a retry resolves.
UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,  # the connection or pool closed under the call
    asyncpg.PostgresConnectionError,  # 08: the connection failed or is gone
    asyncpg.exceptions.OperatorInterventionError,  # 57: shutting down, cannot connect now, cancelled
    asyncpg.exceptions.InsufficientResourcesError,  # 53: disk full, out of memory, too many connections
    asyncpg.exceptions.TransactionRollbackError,  # 40: serialization failure, deadlock
    asyncpg.exceptions.LockNotAvailableError,  # 55P03
    asyncpg.exceptions.InvalidCatalogNameError,  # 3D000: no such database
    asyncpg.exceptions.ReadOnlySQLTransactionError,  # 25006: a standby, or a primary read-only for now
)


def _gone(conn: asyncpg.Connection) -> bool:
    """Whether ``conn`` is closed: dropped by asyncpg, or, lost while lent, already taken back by
    the pool (whose proxy then refuses every call)."""
    try:
        return bool(conn.is_closed())
    except asyncpg.InterfaceError:
        return True


def _ended_before(exc: BaseException, conn: asyncpg.Connection) -> bool:
    """Whether ``exc`` is asyncpg refusing work on ``conn`` because the server had already ended
    its session, so none of that work took effect.

    The server says goodbye (an error such as ``pg_terminate_backend``'s FATAL) and then closes
    the socket. asyncpg reads a goodbye that comes while the connection is idle as the start of an
    operation and waits for its end, and only the close, read later, tells it the connection is
    gone: a statement in between is refused before anything of it is sent ("cannot switch to
    state 12; another operation (2) is in progress", an InternalClientError) and the connection
    dropped. After the close a statement is refused as well (an InterfaceError), and asyncpg
    ends no transaction on a closed connection, whose session the server rolled back."""
    return isinstance(exc, asyncpg.InternalClientError | asyncpg.InterfaceError) and _gone(conn)


@contextmanager
def _unavailable(conn: asyncpg.Connection | None = None) -> Iterator[None]:
    """Raise the outbox's StoreUnavailable for the database answering "not now", or for work on
    ``conn`` refused because the server had ended its session (``_ended_before``); anything
    else, such as a constraint the caller's own SQL broke or a fault of the driver on a live
    connection, goes through as it is."""
    try:
        yield
    except UNAVAILABLE as exc:
        raise StoreUnavailable(f"the PostgreSQL database is unavailable: {exc}") from exc
    except asyncpg.InternalClientError as exc:
        if conn is None or not _ended_before(exc, conn):
            raise
        raise StoreUnavailable("the PostgreSQL database had ended the connection; nothing of the work took effect"
                               ) from exc


#: PostgreSQL's epoch: a timestamptz travels as microseconds from it.
PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _encode_time(value: datetime) -> tuple[int]:
    """A datetime as a timestamptz travels (a naive one in local time, as asyncpg takes it)."""
    if value.tzinfo is None:
        value = value.astimezone(UTC)
    return ((value - PG_EPOCH) // _MICROSECOND,)


def _decode_time(stored: tuple[int]) -> datetime | int:
    """A timestamptz as a UTC datetime; one no datetime can hold (before year 1, after 9999,
    ``infinity``) stays its microseconds, for ``_as_stored`` to refuse: asyncpg's own decoding
    raises for it, and so failed the whole result it was in (a claim, a listing)."""
    try:
        return PG_EPOCH + stored[0] * _MICROSECOND
    except OverflowError:
        return stored[0]


async def _codecs(conn: asyncpg.Connection) -> None:
    """Every pooled connection reads and writes timestamptz through ``_decode_time``."""
    await conn.set_type_codec("timestamptz", schema="pg_catalog", encoder=_encode_time, decoder=_decode_time,
                              format="tuple")


def _as_stored(value: Any) -> Any:
    """A time as ``_decode_time`` gave it; OverflowError for one no datetime can hold."""
    if isinstance(value, int):
        raise OverflowError(f"timestamptz {value} µs from {PG_EPOCH.date()} is beyond what a datetime can hold")
    return value


#: Rows as records: times are timestamptz, JSON columns jsonb (asyncpg gives their text).
_intent = functools.partial(records.intent, time=_as_stored)
_attempt = functools.partial(records.attempt, time=_as_stored)
_event = functools.partial(records.event, time=_as_stored)
_token = functools.partial(records.token, time=_as_stored)
_grant = functools.partial(records.grant, time=_as_stored)
#: A time read outside a record (an aggregate's), as records read theirs.
_time = functools.partial(records.nearest, _as_stored)


def _data(event: Event) -> str:
    """An event's data as the jsonb text stored."""
    return json.dumps(dict(event.data)) if event.data else "{}"


async def _unchanged(conn: asyncpg.Connection) -> None:
    """What a connection given back to the pool needs beyond asyncpg's own cleanup (an open
    transaction rolled back): nothing, as the store's own statements never change a session (no
    SET, LISTEN or session lock), so the default reset's round trip is saved on every release.
    A connection lent to the caller's SQL (``transaction()``) is reset in full before it goes
    back."""


def _attempt_values(a: Attempt | None) -> tuple[Any, ...]:
    """An attempt as the last values of a ``settle`` row (all null: the settle records no attempt)."""
    if a is None:
        return (None,) * 14
    return (
        a.attempt_id, a.number, a.fence, a.worker, a.started_at, a.finished_at,
        a.submission.value if a.submission else None, a.outcome.value if a.outcome else None,
        a.status_code, a.reply, a.external_id, a.error, a.duration_ms, a.stage,
    )


async def _lock_ordering_keys(conn: asyncpg.Connection, intents: Sequence[NewIntent]) -> None:
    """Make the enqueues of the same destination and ordering key take turns until ``conn``'s
    transaction ends (see ``lock_ordering_keys``)."""
    keyed = [(new.destination, new.ordering_key) for new in intents if new.ordering_key is not None]
    if keyed:
        await conn.fetchval(SQL["lock_ordering_keys"], [d for d, _ in keyed], [k for _, k in keyed])


async def _insert_intent(
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
            SQL["insert_intent"],
            new.key, new.action_id, new.scope, new.destination, found["channel"], new.payload_json,
            new.payload_digest, status.value, new.max_attempts, new.next_attempt_at, new.not_before,
            new.expires_at, new.created_at,
            event.kind.value, event.at, event.actor, event.reason, _data(event), new.ordering_key,
        )
        if seq is not None:
            return Enqueued(inserted_intent(seq, new, found["channel"], status), created=True)
        existing = await conn.fetchrow(SQL["intent_by_key"], new.key)
        if existing is not None:
            return decide_existing(_intent(existing), new)
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


async def _insert_batch(
    conn: asyncpg.Connection, items: Sequence[tuple[NewIntent, Event]]
) -> list[Enqueued | OutboxError]:
    """A batch's enqueues on ``conn``, inside a transaction, in a few statements however many
    intents: each is judged as alone (a refusal is its result, decided before any write), the new
    keys are inserted with their first events at once, and the rest are compared with the intents
    already holding their keys, as ``rules.decide_existing`` says."""
    await _lock_ordering_keys(conn, [new for new, _ in items])
    seen: dict[str, Any] = {}
    results: list[Enqueued | OutboxError | None] = [None] * len(items)
    fresh: dict[str, tuple[int, str, Status]] = {}  # key -> (its first item, channel, status)
    for i, (new, _) in enumerate(items):
        try:
            found, status = await _judged(conn, new, seen)
        except OutboxError as exc:
            results[i] = exc
            continue
        fresh.setdefault(new.key, (i, found["channel"], status))
    rows = [(new.key, new.action_id, new.scope, new.destination, channel, new.payload_json, new.payload_digest,
             status.value, new.max_attempts, new.next_attempt_at, new.not_before, new.expires_at, new.created_at,
             event.kind.value, event.at, event.actor, event.reason, _data(event), new.ordering_key)
            for i, channel, status in fresh.values() for new, event in [items[i]]]
    created = {row["intent_key"]: row["seq"] for row in await conn.fetch(
        SQL["insert_intents"], *map(list, zip(*rows, strict=True)))} if rows else {}
    for key, (i, channel, status) in fresh.items():
        if key in created:
            results[i] = Enqueued(inserted_intent(created[key], items[i][0], channel, status), created=True)
    taken = [i for i, result in enumerate(results) if result is None]  # their keys were held already
    existing = {row["intent_key"]: _intent(row) for row in await conn.fetch(
        SQL["intents_by_keys"], [items[i][0].key for i in taken])} if taken else {}
    for i in taken:
        new, event = items[i]
        try:
            holder = existing.get(new.key)  # None: pruned since, so the key is free again
            results[i] = decide_existing(holder, new) if holder else await _insert_intent(conn, new, event, seen)
        except OutboxError as exc:
            results[i] = exc
    return cast(list[Enqueued | OutboxError], results)  # every place filled above


async def _start_listening(conn: asyncpg.Connection, wake: Callable[[], None]) -> asyncio.Event:
    """LISTEN on ``conn``, calling ``wake`` on each notification; returns what is set once the
    connection is lost."""
    lost = asyncio.Event()
    conn.add_termination_listener(lambda _: lost.set())
    await conn.add_listener(CHANNEL, lambda *_: wake())
    return lost


async def _hang_up(conn: asyncpg.Connection) -> None:
    """Close ``conn``, politely if the server still answers, else by dropping it."""
    try:
        await conn.close(timeout=5)
    except Exception:
        conn.terminate()


def _row(change: Change) -> tuple[Any, ...]:
    """A change as one row of its move's block (the arrays from $7 on, sql/postgres.sql): its key,
    its fence (a worker's) or the status its caller saw (where its move starts in several), then
    a start's attempt, or what it writes (``moves.written``) and a settle's attempt."""
    head: tuple[Any, ...] = (change.key,)
    if (fence := moves.fence(change)) is not None:
        head += (fence,)
    elif isinstance(change, Replay | Cancel):
        head += (change.expected.value,)
    if isinstance(change, Start):
        a = change.attempt
        return (*head, a.attempt_id, a.number, a.fence, a.worker, a.started_at)
    written = tuple(value.value if isinstance(value, Status) else value for value in moves.written(change))
    return (*head, *written, *(_attempt_values(change.attempt) if isinstance(change, Settle) else ()))


def _events(batch: Sequence[Change]) -> list[tuple[Any, ...]]:
    """The events of a batch of changes as rows of ``logged``'s arrays ($1-$6), each with its
    change's place in the batch, from 1 (every change has one at least)."""
    return [(n, e.kind.value, e.at, e.actor, e.reason, _data(e))
            for n, change in enumerate(batch, 1) for e in moves.events(change)]


def _columns(rows: Sequence[tuple[Any, ...]], width: int) -> list[list[Any]]:
    """Rows as the arrays of a block's ``unnest`` (``width`` empty ones for no rows)."""
    return [list(column) for column in zip(*rows, strict=True)] if rows else [[] for _ in range(width)]


def _move_arguments(batch: Sequence[Change]) -> list[list[Any]]:
    """A batch of one move's changes as its block's arrays: the events, then the changes' columns."""
    return _columns(_events(batch), 6) + _columns([_row(change) for change in batch], 0)


def cycle_arguments(settles: Sequence[Change], starts: Sequence[Change], claim: Claim | None) -> list[Any]:
    """The ``cycle`` statement's parameters: the events of the settles then the starts, their
    columns, and the claim's (a limit of 0 for none)."""
    claiming = (None, None, None, 0) if claim is None else (claim.now, claim.owner, claim.lease_until, claim.limit)
    return [*_columns(_events([*settles, *starts]), 6), *_columns([_row(c) for c in settles], 22),
            *_columns([_row(c) for c in starts], 7), *claiming]


def _rounds(changes: Sequence[Change]) -> list[dict[str, list[int]]]:
    """The changes' places in ``moves.rounds``, each round by move and in key order (so batches
    that overlap lock their rows in one order)."""
    made: list[dict[str, list[int]]] = []
    for places in moves.rounds(changes):
        by_move: dict[str, list[int]] = {}
        for i in sorted(places, key=lambda i: changes[i].key):
            by_move.setdefault(changes[i].move, []).append(i)
        made.append(by_move)
    return made


def _refusal(change: Change, found: Any) -> OutboxError:
    """Why ``change`` was not applied, worded from its intent as it is now (``found``, None: gone)."""
    refused = moves.refusal(change, None if found is None else (
        found["status"], found["fence"], _time(found["lease_expires_at"])))
    return refused or StaleWrite(f"intent {change.key!r} changed while the write was judged; the write was not applied")


def _crashing(changes: Sequence[Change]) -> bool:
    """(tests only) Whether a crash is armed to cut the batch after an attempt's outcome is written."""
    return crash.armed == "mid_group_commit" and any(
        isinstance(c, Settle) and c.attempt is not None and c.attempt.finished_at is not None for c in changes)


async def _apply_rounds(conn: asyncpg.Connection, changes: Sequence[Change],
                        rounds: Sequence[Mapping[str, Sequence[int]]], claim: Claim | None) -> Applied:
    """The changes, round by round: one statement per move present, the settles and starts
    together in the ``cycle`` statement, which claims in the last round (or alone, for no
    changes); then, for a round with changes refused, one read of their intents to word each
    refusal."""
    results: list[Intent | OutboxError | None] = [None] * len(changes)
    claimed: list[Intent] = []
    rounds = list(rounds) or [{}]
    for r, round_ in enumerate(rounds):
        applied: dict[int, Any] = {}  # a change's place: its row (True: applied, no row)
        for move, places in round_.items():
            if move not in CYCLE:
                rows = {row["n"]: row for row in await conn.fetch(SQL[move], *_move_arguments(
                    [changes[i] for i in places]))}
                applied |= {i: rows[n] for n, i in enumerate(places, 1) if n in rows}
        cycled = [*round_.get("settle", ()), *round_.get("start", ())]
        asked = claim if r == len(rounds) - 1 else None
        if cycled or asked is not None:
            rows = await conn.fetch(SQL["cycle"], *cycle_arguments(
                [changes[i] for i in round_.get("settle", ())], [changes[i] for i in round_.get("start", ())], asked))
            for n in (rows[0]["settled_places"] or []) + (rows[0]["started_places"] or []):
                applied[cycled[n - 1]] = True
            claimed = [_intent(row) for row in rows if row["seq"] is not None]
        refused = [i for places in round_.values() for i in places if i not in applied]
        for i, row in applied.items():
            if isinstance(changes[i], OperatorChange):
                results[i] = _intent(row)
        if refused:
            found = {row["intent_key"]: row for row in await conn.fetch(
                SQL["intents_by_keys"], [changes[i].key for i in refused])}
            for i in refused:
                results[i] = _refusal(changes[i], found.get(changes[i].key))
    return Applied(results, claimed)


def _statements(rounds: Sequence[Mapping[str, Sequence[int]]], claim: Claim | None) -> int:
    """How many statements ``_apply_rounds`` sends (the refusals' reads aside)."""
    rounds = list(rounds) or [{}]
    return sum(sum(move not in CYCLE for move in round_)
               + (any(move in CYCLE for move in round_) or (r == len(rounds) - 1 and claim is not None))
               for r, round_ in enumerate(rounds))


class _PostgresTransaction:
    """A transaction on one connection: the store's own, or the caller's."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn

    async def execute(self, sql: str, parameters: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with _unavailable(self._conn):
            return [tuple(row) for row in await self._conn.fetch(sql, *parameters)]

    async def insert_intent(self, new: NewIntent, event: Event) -> Enqueued:
        with _unavailable(self._conn):
            return await _insert_intent(self._conn, new, event)


class _PostgresMigration:
    """The migration runner's view of a connection inside the migration's transaction."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn

    async def applied_versions(self) -> set[int]:
        return {row[0] for row in await self._conn.fetch(SQL["applied_migrations"])}

    async def run_script(self, script: str) -> None:
        # without parameters asyncpg runs every statement of it; an index on a big table may take long
        await self._conn.execute(script, timeout=MIGRATION_SECONDS)

    async def record(self, migration: Migration, at: datetime) -> None:
        await self._conn.execute(SQL["record_migration"], migration.version, migration.name, at)


class PostgresStore:
    """An outbox in a PostgreSQL database, shared by every process that opens it."""

    dialect = "postgres"

    def __init__(self, dsn: str, *, pool_size: int = 10, statement_seconds: float = STATEMENT_SECONDS,
                 keyring: Keyring | None = None) -> None:
        self.dsn = dsn
        self.keyring = keyring
        self.pool_size = pool_size
        self.statement_seconds = statement_seconds
        self._pool: asyncpg.Pool | None = None

    # -- connections ---------------------------------------------------------------------

    async def open(self) -> None:
        if self._pool is not None:
            return
        try:
            self._pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=self.pool_size, reset=_unchanged,
                                                   init=_codecs, command_timeout=self.statement_seconds)
        except (*UNAVAILABLE, asyncpg.PostgresError) as exc:
            raise StoreUnavailable(f"cannot use the PostgreSQL database: {exc}") from exc

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    @property
    def _p(self) -> asyncpg.Pool:
        if self._pool is None:
            raise StoreUnavailable("the store is not open")
        return self._pool

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection for the block, given back after it (see ``_release``)."""
        with _unavailable():
            conn = await self._p.acquire(timeout=self.statement_seconds)
        try:
            yield conn
        finally:
            await self._release(conn)

    async def _release(self, conn: asyncpg.Connection) -> None:
        """Give a connection back to the pool. One the server dropped under it cannot be reset
        (asyncpg then closes it, and the pool opens another); what was done on it before stands,
        committed or not, so that is not the caller's error: an intent committed just before the
        connection was cut is not answered 500."""
        try:
            await self._p.release(conn)
        except Exception as exc:
            log.info("a pooled connection could not be reset and was closed (%s: %s)", type(exc).__name__, exc)

    async def _run(self, work: Callable[[asyncpg.Connection], Awaitable[T]], *,
                   transaction: Mapping[str, Any] | None = None) -> T:
        """``work`` on a pooled connection, inside a transaction if ``transaction`` gives its
        options (asyncpg's isolation, readonly; empty for the defaults), else as one statement or
        reads only. Work refused because the server had already ended the session of the
        connection taken (``_ended_before``: none of it took effect) runs again on another, so a
        connection the server cut is never one more failed operation; each connection taken
        goes back to the pool (``_release``), and the pool replaces a dropped one."""
        for _ in range(self.pool_size + 1):  # every pooled connection cut at once, then a fresh one
            with _unavailable():
                async with self._connection() as conn:
                    try:
                        if transaction is None:
                            return await work(conn)
                        async with conn.transaction(**transaction):
                            return await work(conn)
                    except (asyncpg.InternalClientError, asyncpg.InterfaceError) as exc:
                        if not _ended_before(exc, conn):
                            raise
                        cut: BaseException = exc
            log.debug("the database had ended a pooled connection's session (%s); running the work on another", cut)
        raise StoreUnavailable(f"the PostgreSQL database ended {self.pool_size + 1} connections in a row "
                               "before the work reached it") from cut

    async def _fetch(self, name: str, *args: Any) -> list[Any]:
        return list(await self._run(lambda conn: conn.fetch(SQL[name], *args)))

    async def _execute(self, name: str, *args: Any) -> None:
        await self._run(lambda conn: conn.execute(SQL[name], *args))

    async def _fetchrow(self, name: str, *args: Any) -> Any:
        return await self._run(lambda conn: conn.fetchrow(SQL[name], *args))

    async def _fetchval(self, name: str, *args: Any) -> Any:
        return await self._run(lambda conn: conn.fetchval(SQL[name], *args))

    @asynccontextmanager
    async def transaction(self, *, connection: Any = None) -> AsyncIterator[_PostgresTransaction]:
        """A transaction for the caller's SQL and enqueues: by default on a pooled connection,
        committed when the block ends. With ``connection``, the caller's asyncpg connection
        already inside the caller's transaction: enqueues are written on it and commit or roll
        back with that transaction, which the outbox never commits, rolls back or ends.

        An enqueue that is refused (IntentConflict, UnknownDestination, a payload its channel
        cannot send) writes nothing and raises no SQL error, so the caller's transaction stays
        usable: let the error end the ``async with conn.transaction()`` block (all rolls back) or
        catch it and go on (the rest commits without that intent). An error of the database
        itself (the connection lost, a constraint) aborts a PostgreSQL transaction, as it always
        does; a caller that must go on after one wraps the enqueue in a savepoint (a nested
        ``async with conn.transaction():``).
        """
        if connection is not None:
            in_transaction = getattr(connection, "is_in_transaction", None)
            if in_transaction is None or not in_transaction():
                raise ValueError(
                    "transaction(connection=...) takes an asyncpg connection inside the caller's own transaction "
                    "(async with conn.transaction(): ...), so the outbox's writes commit with it and never alone")
            yield _PostgresTransaction(connection)
            return
        async with self._connection() as conn:
            try:
                tx = conn.transaction()
                with _unavailable(conn):
                    await tx.start()
                try:
                    yield _PostgresTransaction(conn)
                except BaseException:
                    with contextlib.suppress(*UNAVAILABLE):  # a lost connection's transaction is the server's to undo
                        await tx.rollback()
                    raise
                with _unavailable(conn):
                    await tx.commit()
            finally:
                try:  # the caller's SQL may have changed the session (SET, ...)
                    await conn.reset()
                except Exception:  # (a statement_timeout it set can cut the reset itself short)
                    if not _gone(conn):  # (one the server cut is the pool's to replace already)
                        conn.terminate()  # a session that could not be reset serves no one else

    # -- schema, clock and wake-ups ----------------------------------------------------------

    async def migrate(self) -> list[str]:
        async def work(conn: asyncpg.Connection) -> list[str]:
            await conn.execute(SQL["lock_migrations"])
            await conn.execute(SQL["create_migrations_table"])
            return await run_migrations(_PostgresMigration(conn), scripts_for(self.dialect))

        return await self._run(work, transaction={})

    async def ping(self) -> None:
        try:
            await self._fetchval("applied_migrations")
        except asyncpg.UndefinedTableError as exc:
            raise StoreUnavailable("the database is not migrated; run `outbox migrate`") from exc

    async def clock_offset(self) -> float:
        """How far the database's clock is ahead of this host's, in seconds (negative: behind):
        the database's time minus this host's at the middle of the round trip that read it, the
        quickest of three (the least room for the answer to have been read early or late)."""
        async def work(conn: asyncpg.Connection) -> float:
            samples: list[tuple[float, float]] = []
            for _ in range(3):
                sent = time.time()
                theirs: datetime = await conn.fetchval(SQL["clock"])
                back = time.time()
                samples.append((back - sent, theirs.timestamp() - (sent + back) / 2))
            return min(samples)[1]

        return await self._run(work)

    async def listen(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` whenever a transaction that made an intent pending (an enqueue, a replay,
        a retry) commits, in any process, until cancelled. A dedicated connection LISTENs; when it is lost (the
        server restarted, the network broke) another is made, and ``wake`` is called each time
        one starts listening, since whatever was notified meanwhile went unheard. Workers still
        poll, so a listener that cannot connect only delays them."""
        pause = RELISTEN_SECONDS[0]
        while True:
            try:
                conn = await asyncpg.connect(self.dsn, server_settings={"application_name": LISTENER})
            except Exception as exc:  # the next try may work; polling covers the gap
                log.warning("cannot listen for due intents (%s); trying again in %.1fs", exc, pause)
            else:
                failure: Exception | None = None
                try:
                    lost = await _start_listening(conn, wake)
                    pause = RELISTEN_SECONDS[0]
                    wake()
                    while not lost.is_set():
                        try:
                            await asyncio.wait_for(lost.wait(), KEEPALIVE_SECONDS)
                        except TimeoutError:
                            await conn.fetchval(SQL["ping"], timeout=KEEPALIVE_SECONDS)
                except Exception as exc:  # refused as the server ended the session: lost, like the rest
                    failure = None if _ended_before(exc, conn) else exc
                finally:
                    await _hang_up(conn)
                if failure is None:
                    log.warning("the connection listening for due intents was lost; listening again")
                else:
                    log.warning("listening for due intents failed (%s); listening again", failure)
            await asyncio.sleep(pause)
            pause = min(pause * 2, RELISTEN_SECONDS[1])

    # -- intents ---------------------------------------------------------------------------

    async def insert_intent(self, new: NewIntent, event: Event) -> Enqueued:
        return await self._run(lambda conn: _insert_intent(conn, new, event), transaction={})

    async def insert_intents(self, items: Sequence[tuple[NewIntent, Event]]) -> list[Enqueued]:
        async def work(conn: asyncpg.Connection) -> list[Enqueued]:
            return whole_or_refused(await _insert_batch(conn, items))

        return await self._run(work, transaction={})

    async def insert_each(self, items: Sequence[tuple[NewIntent, Event]]) -> list[Enqueued | OutboxError]:
        return await self._run(lambda conn: _insert_batch(conn, items), transaction={})

    async def get_intent(self, key: str) -> Intent | None:
        row = await self._fetchrow("intent_by_key", key)
        return None if row is None else _intent(row)

    async def intents_named(self, action_id: str) -> list[Intent]:
        return [_intent(row) for row in await self._fetch("intents_by_action", action_id)]

    async def history(self, key: str) -> History:
        async def work(conn: asyncpg.Connection) -> History:
            row = await conn.fetchrow(SQL["intent_by_key"], key)
            if row is None:
                return History()
            return History(
                attempts=[_attempt(r) for r in await conn.fetch(SQL["attempts_of"], row["seq"])],
                events=[_event(r) for r in await conn.fetch(SQL["events_of"], row["seq"])],
                intent=_intent(row),
            )

        return await self._run(work, transaction=SNAPSHOT)

    async def list_intents(self, query: IntentQuery) -> Page:
        params: list[Any] = [query.limit + 1]

        def param(value: Any) -> str:
            params.append(value)
            return f"${len(params)}"

        where: list[str] = []
        if query.statuses:
            where.append(f"status = ANY({param([s.value for s in query.statuses])}::text[])")
        if query.scopes is not None:  # none at all matches nothing
            where.append(f"scope = ANY({param(list(query.scopes))}::text[])")
        for condition, value in (
            ("destination =", query.destination),
            ("channel =", query.channel),
            ("created_at >=", query.created_after),
            ("created_at <", query.created_before),
            ("seq <", query.before_seq),
        ):
            if value is not None:
                where.append(f"{condition} {param(value)}")
        rows = await self._run(lambda conn: conn.fetch(
            SQL["list_intents"].format(where=" AND ".join(where) or "true"), *params))
        intents = [_intent(row) for row in rows[: query.limit]]
        more = len(rows) > query.limit
        return Page(intents, intents[-1].seq if more and intents else None)

    # -- the sender's work -----------------------------------------------------------------

    async def apply(self, changes: Sequence[Change], *, claim: Claim | None = None) -> Applied:
        for change in changes:
            check_change(change)
        if not changes and claim is None:
            return Applied([], [])
        rounds = _rounds(changes)
        crashing = _crashing(changes)

        async def together(conn: asyncpg.Connection) -> Applied:
            applied = await _apply_rounds(conn, changes, rounds, claim)
            if crashing:
                crash.crash_point("mid_group_commit")
            return applied

        try:  # one statement (a worker's usual cycle) needs no transaction of its own around it
            return await self._run(together, transaction={} if _statements(rounds, claim) > 1 or crashing else None)
        except asyncpg.PostgresError as exc:  # ("not now" is StoreUnavailable by here, and raised)
            log.info("a batch of %d change(s) failed (%s: %s); applying each alone", len(changes),
                     type(exc).__name__, exc)

        async def each(conn: asyncpg.Connection) -> Applied:
            results: list[Intent | OutboxError | None] = []
            for change in changes:
                try:
                    async with conn.transaction():  # a savepoint: a change that fails undoes itself only
                        results += (await _apply_rounds(conn, [change], _rounds([change]), None)).results
                except asyncpg.PostgresError as exc:
                    if isinstance(exc, UNAVAILABLE):
                        raise
                    results.append(InvalidInput(f"the change to intent {change.key!r} cannot be written: {exc}"))
            if crashing:
                crash.crash_point("mid_group_commit")
            return Applied(results, (await _apply_rounds(conn, [], [], claim)).claimed)

        return await self._run(each, transaction={})

    async def recover(self, now: datetime, limit: int, actor: str) -> int:
        async def work(conn: asyncpg.Connection) -> int:
            held = await conn.fetch(SQL["lock_recoverable"], now, limit)
            if not held:
                return 0
            logged = [moves.recovered_event(row["lease_owner"], now, actor) for row in held]
            return len(await conn.fetch(SQL["recover"], [row["seq"] for row in held], [e.reason for e in logged],
                                        now, actor, _data(logged[0])))

        return await self._run(work, transaction={})

    async def claim(
        self, owner: str, *, now: datetime, lease_until: datetime, limit: int
    ) -> list[Intent]:
        return (await self.apply([], claim=Claim(owner, now, lease_until, limit))).claimed

    async def waiting_behind(self, key: str) -> Intent | None:
        row = await self._fetchrow("waiting_behind", key)
        return None if row is None else _intent(row)

    async def renew_leases(self, held: Sequence[tuple[str, int]], until: datetime) -> list[str]:
        ordered = sorted(held)  # key order: renewals that overlap meet their rows in the same order
        rows = await self._fetch("renew_leases", until, [key for key, _ in ordered], [fence for _, fence in ordered])
        renewed = {(row["intent_key"], row["fence"]) for row in rows}
        return [key for key, fence in held if (key, fence) not in renewed]

    async def expired_leases(self, now: datetime, limit: int) -> list[tuple[Intent, Attempt | None]]:
        return [(_intent(row), None if row["in_flight"] is None else _attempt(row["in_flight"]))
                for row in await self._fetch("expired_leases", now, limit)]

    async def first_submission_at(self, key: str) -> datetime | None:
        found: datetime | None = _time(await self._fetchval("first_submission", key))
        return found

    async def next_due_at(self) -> datetime | None:
        found: datetime | None = _time(await self._fetchval("next_due_at"))
        return found

    async def prune(self, before: datetime, *, dry_run: bool, limit: int | None) -> list[str]:
        return [row[0] for row in await self._fetch("prunable" if dry_run else "prune", before, limit)]

    async def count_by_status(self) -> list[tuple[str, str, int]]:
        return [(row[0], row[1], row[2]) for row in await self._fetch("count_by_status")]

    async def oldest_due_at(self, now: datetime) -> datetime | None:
        found: datetime | None = _time(await self._fetchval("oldest_due", now))
        return found

    async def activity(self, since: datetime, now: datetime) -> Activity:
        async def work(conn: asyncpg.Connection) -> Activity:
            return Activity(
                [AttemptMinute(d, _time(m), o, n, ms, _time(last))
                 for d, m, o, n, ms, last in await conn.fetch(SQL["activity_minutes"], since)],
                [Failure(d, _time(at), o, code, error)
                 for d, at, o, code, error in await conn.fetch(SQL["activity_failures"], since)],
                [Waiting(d, n, _time(oldest)) for d, n, oldest in await conn.fetch(SQL["activity_waiting"], now)],
                [Span(_time(start), _time(end), n)
                 for start, end, n in await conn.fetch(SQL["activity_backlog"], since)])

        return await self._run(work, transaction=SNAPSHOT)

    async def disable_destination(self, destination_id: str, at: datetime) -> None:
        await self._execute("disable_destination", at, destination_id)

    # -- grants ----------------------------------------------------------------------------

    async def put_grant(self, grant_id: str, spec: GrantSpec, at: datetime) -> tuple[Grant, bool]:
        row = await self._fetchrow("put_grant", grant_id, spec.scope, spec.destination, spec.expires_at,
                                   spec.note, at, at)
        return _grant(row), row["revision"] == 1

    async def get_grant(self, grant_id: str) -> Grant | None:
        row = await self._fetchrow("grant_by_id", grant_id)
        return None if row is None else _grant(row)

    async def list_grants(self) -> list[Grant]:
        return [_grant(row) for row in await self._fetch("list_grants")]

    async def delete_grant(self, grant_id: str) -> None:
        if await self._fetchval("delete_grant", grant_id) is None:
            raise NotFound(f"grant {grant_id!r} does not exist")

    async def find_grant(self, scope: str, destination: str, now: datetime) -> Grant | None:
        row = await self._fetchrow("matching_grant", scope, destination, now)
        return None if row is None else _grant(row)

    # -- destinations ----------------------------------------------------------------------

    async def put_destination(self, destination: Destination) -> bool:
        d = destination
        keyring = required(self.keyring)

        async def work(conn: asyncpg.Connection) -> bool:
            await conn.execute(SQL["propose_sealing_key"], keyring.primary)
            key = keyring.sealing(await conn.fetchval(SQL["share_sealing_key"]))
            created: bool = await conn.fetchval(
                SQL["put_destination"],
                d.id, d.channel, json.dumps(dict(d.settings)), keyring.seal(d.secrets, destination_id=d.id, key=key),
                d.idempotent, d.retention_seconds, d.on_unknown.value, d.timeout_seconds, d.requires_approval,
                d.allow_private_network, d.disabled, d.created_at, d.updated_at, d.reconcile,
                d.ordering.value, d.ordering_on_dead.value,
            )
            return created

        return await self._run(work, transaction={})

    def _destination(self, row: asyncpg.Record) -> Destination:
        return records.destination(row, _as_stored, self.keyring)

    async def get_destination(self, destination_id: str) -> Destination | None:
        row = await self._fetchrow("destination_by_id", destination_id)
        return None if row is None else self._destination(row)

    async def list_destinations(self) -> list[Destination]:
        return [self._destination(row) for row in await self._fetch("list_destinations")]

    async def sealing_key(self) -> str | None:
        try:
            key: str | None = await self._fetchval("sealing_key")
        except asyncpg.UndefinedTableError as exc:
            raise StoreUnavailable("the database is not migrated; run `outbox migrate`") from exc
        return key

    async def reseal_secrets(self, key: str, *, plain_only: bool = False) -> int:
        keyring = required(self.keyring)

        def changes(rows: list[asyncpg.Record]) -> list[tuple[str, str]]:
            return [(row["id"], sealed) for row in rows
                    if (sealed := keyring.resealed(row["secrets"], destination_id=row["id"], key=key,
                                                   plain_only=plain_only)) is not None]

        if await self.sealing_key() == key and not changes(await self._fetch("destination_secrets")):
            return 0  # nothing to seal: no write
        async def work(conn: asyncpg.Connection) -> int:
            await conn.execute(SQL["propose_sealing_key"], key)
            await conn.execute(SQL["lock_sealing_key"])  # writers of secrets wait until this commits
            resealed = changes(await conn.fetch(SQL["lock_destination_secrets"]))
            await conn.executemany(SQL["put_destination_secrets"], resealed)
            await conn.execute(SQL["set_sealing_key"], key)
            return len(resealed)

        return await self._run(work, transaction={})

    async def delete_destination(self, destination_id: str) -> None:
        async def work(conn: asyncpg.Connection) -> None:
            decide_destination_delete(
                destination_id,
                exists=await conn.fetchval(SQL["lock_destination"], destination_id) is not None,
                waiting=await conn.fetchval(SQL["open_intents_for_destination"], destination_id),
                in_history=await conn.fetchval(SQL["any_intent_for_destination"], destination_id) is not None,
                grants=[row[0] for row in await conn.fetch(SQL["grants_for_destination"], destination_id)],
            )
            await conn.execute(SQL["delete_destination"], destination_id)

        await self._run(work, transaction={})

    # -- tokens ----------------------------------------------------------------------------

    async def insert_token(self, info: TokenInfo, token_hash: str) -> None:
        await self._execute("insert_token", info.id, token_hash, info.role.value, json.dumps(list(info.scopes)),
                            info.label, info.created_at)

    async def token_by_hash(self, token_hash: str) -> TokenInfo | None:
        row = await self._fetchrow("token_by_hash", token_hash)
        return None if row is None else _token(row)

    async def list_tokens(self) -> list[TokenInfo]:
        return [_token(row) for row in await self._fetch("list_tokens")]

    async def revoke_token(self, token_id: str, at: datetime, *, keep_an_admin: bool = True) -> TokenInfo:
        async def work(conn: asyncpg.Connection) -> TokenInfo:
            row = await conn.fetchrow(SQL["revoke_token"], at, token_id, keep_an_admin)
            if row is None:
                found = await conn.fetchrow(SQL["token_by_id"], token_id)
                raise not_revoked(token_id, None if found is None else _token(found))
            return _token(row)

        return await self._run(work, transaction={})

    async def count_active_tokens(self, role: str) -> int:
        return int(await self._fetchval("count_active_tokens", role))
