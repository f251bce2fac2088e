"""The embedded SQLite store (aiosqlite, WAL, ``synchronous=FULL``).

Writes go through one connection and are group-committed: concurrent writers share a
transaction and its fsync (one writer's failure undoes only its own writes), the changes of the
applies in it are made as one set (a named block per move, ``sql/sqlite.sql``), and each writer
is acknowledged only after the commit that made its write durable. Reads use a second
connection, which WAL lets run beside the writer.
"""

from __future__ import annotations

import contextvars
import functools
import json
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar, cast

import aiosqlite

from receivers._sqlite import SetJob, from_us, to_us

from ..crash import crash_point
from ..destinations import Destination
from ..errors import NoDatabase, NotFound, OutboxError, StoreUnavailable
from ..grants import Grant, GrantSpec
from ..keyring import Keyring, required
from ..model import Attempt, Change, Enqueued, Event, Intent, NewIntent, Start, Status, check_change
from ..tokens import TokenInfo
from . import moves, records
from .migrator import Migration, run_migrations, scripts_for
from .plumbing import GroupCommitter, connect, on_thread, queries, unavailable
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

T = TypeVar("T")
SQL = queries.load("sqlite")
#: The statements that pick due intents share one rule for ordered keys (``claimable``).
SQL = {**SQL, **{name: SQL[name].format(claimable=SQL["claimable"]) for name in ("due_seqs", "next_due_at")}}
#: Set while this task holds a caller's transaction: a group-committed write would wait for it.
_IN_TRANSACTION: contextvars.ContextVar[bool] = contextvars.ContextVar("in_tx", default=False)


def _stored(value: Any) -> Any:
    """A column's value as SQLite stores it: times as ``to_us``, statuses by name."""
    if isinstance(value, datetime):
        return to_us(value)
    return value.value if isinstance(value, Status) else value


#: Rows as records: times are integer microseconds (``from_us``), JSON is text.
_intent = functools.partial(records.intent, time=from_us)
_attempt = functools.partial(records.attempt, time=from_us)
_event = functools.partial(records.event, time=from_us)
_token = functools.partial(records.token, time=from_us)
_grant = functools.partial(records.grant, time=from_us)
#: A time read outside a record (an aggregate's), as records read theirs.
_time = functools.partial(records.nearest, from_us)


def _attempt_row(seq: int, a: Attempt) -> list[Any]:
    """An attempt as a ``put_attempts`` row."""
    return [
        a.attempt_id, seq, a.number, a.fence, a.worker, to_us(a.started_at), to_us(a.finished_at),
        a.submission.value if a.submission else None, a.outcome.value if a.outcome else None,
        a.status_code, a.reply, a.external_id, a.error, a.duration_ms, a.stage,
    ]


def _event_row(seq: int, e: Event) -> list[Any]:
    """An event as an ``insert_events`` row."""
    return [seq, e.kind, to_us(e.at), e.actor, e.reason, dict(e.data)]


def _append_event(conn: sqlite3.Connection, seq: int, event: Event) -> None:
    conn.execute(
        SQL["insert_event"],
        (seq, event.kind, to_us(event.at), event.actor, event.reason,
         json.dumps(dict(event.data)) if event.data else "{}"),
    )


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


def _insert_intent(conn: sqlite3.Connection, new: NewIntent, event: Event) -> Enqueued:
    """The enqueue, run inside a write transaction: destination check, insert or compare (the
    rules are ``rules.decide_initial_status`` and ``rules.decide_existing``)."""
    channel, status = _enqueue_target(conn, new, None)
    created = to_us(new.created_at)
    row = conn.execute(
        SQL["insert_intent"],
        (
            new.key,
            new.action_id,
            new.scope,
            new.destination,
            channel,
            new.payload_json,
            new.payload_digest,
            status.value,
            new.max_attempts,
            to_us(new.next_attempt_at),
            to_us(new.not_before),
            to_us(new.expires_at),
            created,
            created,
            new.ordering_key,
        ),
    ).fetchone()
    if row is not None:
        _append_event(conn, row[0], event)
        return Enqueued(inserted_intent(row[0], new, channel, status), created=True)
    return decide_existing(_intent(conn.execute(SQL["intent_by_key"], (new.key,)).fetchone()), new)


def _insert_each(conn: sqlite3.Connection, items: Sequence[tuple[NewIntent, Event]]) -> list[Enqueued | OutboxError]:
    """``_insert_intent`` for each of ``items`` in the one write transaction, as sets: one
    statement inserts every intent whose key is free (the first of an intent named twice), one
    appends their first events, and the rest are compared with what holds their key. An intent
    refused stands as its error in its place (refused before any write: it undoes nothing)."""
    seen: dict[str, sqlite3.Row] = {}
    results: list[Enqueued | OutboxError | None] = [None] * len(items)
    accepted: list[tuple[int, str, Status]] = []
    for i, (new, _) in enumerate(items):
        try:
            accepted.append((i, *_enqueue_target(conn, new, seen)))
        except OutboxError as exc:
            results[i] = exc
    rows = [[new.key, new.action_id, new.scope, new.destination, channel, new.payload_json, new.payload_digest,
             status.value, new.max_attempts, to_us(new.next_attempt_at), to_us(new.not_before),
             to_us(new.expires_at), to_us(new.created_at), new.ordering_key]
            for i, channel, status in accepted for new in [items[i][0]]]
    inserted = dict(conn.execute(SQL["insert_intents_set"], (json.dumps(rows),)).fetchall()) if rows else {}
    events: list[list[Any]] = []
    for i, channel, status in accepted:
        new, event = items[i]
        seq = inserted.pop(new.key, None)  # popped: a second intent of the key compares with the first
        if seq is None:
            try:
                results[i] = decide_existing(_intent(conn.execute(SQL["intent_by_key"], (new.key,)).fetchone()), new)
            except OutboxError as exc:
                results[i] = exc
            continue
        events.append(_event_row(seq, event))
        results[i] = Enqueued(inserted_intent(seq, new, channel, status), created=True)
    if events:
        conn.execute(SQL["insert_events"], (json.dumps(events),))
    return cast(list[Enqueued | OutboxError], results)  # every place filled above


def _stored_row(seq: int, values: Sequence[Any]) -> list[Any]:
    """A move's row for its named block: the intent's seq, then ``moves.written``, stored."""
    return [seq, *map(_stored, values)]


def _claim(conn: sqlite3.Connection, claim: Claim) -> list[Intent]:
    """Lease up to ``claim.limit`` due intents to its owner (``Store.claim``), inside the write
    transaction: four statements, however many."""
    at = to_us(claim.now)
    seqs = conn.execute(SQL["due_seqs"], (at, claim.limit)).fetchone()[0]
    if seqs == "[]":
        return []
    conn.execute(SQL["lease"], (claim.owner, to_us(claim.lease_until), at, seqs))
    conn.execute(SQL["leased_events"], (at, claim.owner, seqs))
    rows = json.loads(conn.execute(SQL["intents_json"], (seqs,)).fetchone()[0])
    return sorted((_intent(r) for r in rows), key=lambda i: i.next_attempt_at)


def _make(conn: sqlite3.Connection, changes: Sequence[Change]) -> list[Intent | OutboxError | None]:
    """Make ``changes`` (checked) in the write transaction, each judged on its own against its
    intent as it is: a handful of statements for the lot (one read of their targets, one UPDATE
    per move present, one write of their attempts and one of their events), a round of them
    more for each time a key comes again (the second change sees the first)."""
    results: list[Intent | OutboxError | None] = [None] * len(changes)
    for ready in moves.rounds(changes):
        _make_round(conn, [(i, changes[i]) for i in ready], results)
    return results


def _make_round(conn: sqlite3.Connection, changes: list[tuple[int, Change]],
                results: list[Intent | OutboxError | None]) -> None:
    """One round of ``_make``: ``changes`` name each key once."""
    found = conn.execute(SQL["update_targets"], (json.dumps([change.key for _, change in changes]),)).fetchone()
    rows: dict[str, list[list[Any]]] = {}
    answered: dict[int, int] = {}  # seq -> the position of the operator's change that answers with it
    attempts: list[list[Any]] = []
    events: list[list[Any]] = []
    outcome = False  # whether an attempt's outcome is among the writes
    for position, seq, status, fence, lease_expires_at in json.loads(found[0]):
        i, change = changes[position]
        refused = moves.refusal(change, None if seq is None else (status, fence, _time(lease_expires_at)))
        if refused is not None:
            results[i] = refused
            continue
        if change.move in moves.ANSWERED:
            answered[seq] = i
        if not isinstance(change, Start):
            rows.setdefault(change.move, []).append(_stored_row(seq, moves.written(change)))
        attempt = moves.attempt(change)
        if attempt is not None:
            attempts.append(_attempt_row(seq, attempt))
            outcome = outcome or attempt.finished_at is not None
        events += [_event_row(seq, e) for e in moves.events(change)]
    for move, values in rows.items():
        for row in conn.execute(SQL[move], (json.dumps(values),)).fetchall():  # the operators' moves return rows
            results[answered[row["seq"]]] = _intent(row)
    if attempts:
        conn.execute(SQL["put_attempts"], (json.dumps(attempts),))
    if events:
        conn.execute(SQL["insert_events"], (json.dumps(events),))
    if outcome:
        crash_point("mid_group_commit")  # (tests only) an outcome written, its batch not committed


@dataclass(slots=True, eq=False)
class _Apply(SetJob):
    """One ``apply``: its changes (already checked) and its claim. The applies committed together
    (several workers' cycles) make their changes as one set, then each its claim."""

    changes: Sequence[Change]
    claim: Claim | None

    @classmethod
    def run_many(cls, conn: sqlite3.Connection, jobs: Sequence[Any]) -> list[tuple[bool, Any]]:
        made = iter(_make(conn, [change for job in jobs for change in job.changes]))
        return [(True, Applied([next(made) for _ in job.changes], [] if job.claim is None else _claim(conn, job.claim)))
                for job in jobs]


@dataclass(slots=True, eq=False)
class _Recover:
    """Move ``recover``: one sweep of expired leases with no attempt in flight (``Store.recover``)."""

    now: datetime
    limit: int
    actor: str

    def __call__(self, conn: sqlite3.Connection) -> int:
        at = to_us(self.now)
        found = conn.execute(SQL["recoverable"], (at, self.limit)).fetchone()[0]
        recovered = json.loads(found)
        if not recovered:
            return 0
        conn.execute(SQL["recover"], (at, found))
        events = [_event_row(seq, moves.recovered_event(owner, self.now, self.actor)) for seq, owner in recovered]
        conn.execute(SQL["insert_events"], (json.dumps(events),))
        return len(recovered)


class _SqliteTransaction:
    """The caller's transaction on the writer connection."""

    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    async def execute(self, sql: str, parameters: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        rows = await self._db.execute_fetchall(sql, parameters)
        return [tuple(row) for row in rows]

    async def insert_intent(self, new: NewIntent, event: Event) -> Enqueued:
        return await on_thread(self._db, _insert_intent, new, event)


def _begin_migration(conn: sqlite3.Connection) -> None:
    conn.execute(SQL["create_migrations_table"])
    conn.execute("BEGIN IMMEDIATE")  # one migrator at a time, across processes


def _run_script(conn: sqlite3.Connection, script: str) -> None:
    for statement in _statements(script):
        conn.execute(statement)


class _SqliteMigration:
    """The migration runner's view of the writer connection, inside the migration's transaction."""

    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    async def applied_versions(self) -> set[int]:
        return await on_thread(self._db, lambda conn: {row[0] for row in conn.execute(SQL["applied_migrations"])})

    async def run_script(self, script: str) -> None:
        await on_thread(self._db, _run_script, script)

    async def record(self, migration: Migration, at: datetime) -> None:
        params = (migration.version, migration.name, to_us(at))
        await on_thread(self._db, lambda conn: conn.execute(SQL["record_migration"], params) and None)


class SqliteStore:
    """An outbox in one SQLite file."""

    dialect = "sqlite"
    max_batch = 256

    def __init__(self, path: str | Path, *, busy_timeout_ms: int = 5000, create: bool = True,
                 keyring: Keyring | None = None) -> None:
        self.path = Path(path)
        #: Whether opening makes the file when there is none (else NoDatabase).
        self.create = create
        self.keyring = keyring
        self._busy_timeout_ms = busy_timeout_ms
        self._writer: aiosqlite.Connection | None = None
        self._reader: aiosqlite.Connection | None = None
        self._committer: GroupCommitter | None = None

    # -- connections ---------------------------------------------------------------------

    async def open(self) -> None:
        if self._writer is not None:
            return
        if self.path.parent and not self.path.parent.exists():
            raise StoreUnavailable(f"directory {str(self.path.parent)!r} does not exist")
        if not self.create and not self.path.exists():
            raise NoDatabase(f"{str(self.path.absolute())!r} does not exist")
        self._writer = await connect(self.path, busy_timeout_ms=self._busy_timeout_ms)
        self._reader = await connect(self.path, busy_timeout_ms=self._busy_timeout_ms,
                                     script="PRAGMA query_only = ON;")
        self._committer = GroupCommitter(self._writer, max_batch=self.max_batch)

    async def close(self) -> None:
        if self._committer is not None:
            await self._committer.idle()
        for db in (self._reader, self._writer):
            if db is not None:
                await db.close()
        self._writer = self._reader = None
        self._committer = None

    @property
    def _c(self) -> GroupCommitter:
        if self._committer is None:
            raise StoreUnavailable("the store is not open")
        return self._committer

    @property
    def _r(self) -> aiosqlite.Connection:
        if self._reader is None:
            raise StoreUnavailable("the store is not open")
        return self._reader

    # -- writes: group commit --------------------------------------------------------------

    async def _write(self, job: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``job`` in a group-committed transaction; returns once it is durable."""
        if _IN_TRANSACTION.get():
            raise RuntimeError(
                "this write would wait for the open transaction; inside `transaction()` "
                "use the transaction's own methods (tx.enqueue)"
            )
        return await self._c.write(job)

    @asynccontextmanager
    async def transaction(self, *, connection: Any = None) -> AsyncIterator[_SqliteTransaction]:
        if connection is not None:
            raise ValueError(
                "the SQLite store runs transactions on its own connection only (its writes are group-committed "
                "there); use transaction() without a connection, and tx.execute for your own SQL")
        async with self._c.lock:
            db = self._c.db
            try:
                await db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise (unavailable(exc) or exc) from exc
            marker = _IN_TRANSACTION.set(True)
            try:
                yield _SqliteTransaction(db)
            except BaseException:
                await db.execute("ROLLBACK")
                raise
            finally:
                _IN_TRANSACTION.reset(marker)
            try:
                await db.execute("COMMIT")
            except sqlite3.Error as exc:
                if db.in_transaction:
                    await db.execute("ROLLBACK")
                raise (unavailable(exc) or exc) from exc

    # -- reads -----------------------------------------------------------------------------

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        return await on_thread(self._r, fn, *args)

    # -- schema ----------------------------------------------------------------------------

    async def migrate(self) -> list[str]:
        async with self._c.lock:  # no group commit meanwhile
            db = self._c.db
            await on_thread(db, _begin_migration)
            try:
                applied = await run_migrations(_SqliteMigration(db), scripts_for(self.dialect))
                await on_thread(db, lambda conn: conn.execute("COMMIT") and None)
            except BaseException:
                if db.in_transaction:
                    await on_thread(db, lambda conn: conn.execute("ROLLBACK") and None)
                raise
            return applied

    async def ping(self) -> None:
        def run(conn: sqlite3.Connection) -> None:
            conn.execute(SQL["ping"]).fetchone()
            try:
                conn.execute(SQL["applied_migrations"]).fetchone()
            except sqlite3.OperationalError as exc:
                raise StoreUnavailable("the database is not migrated; run `outbox migrate`") from exc

        await self._read(run)

    # -- intents ---------------------------------------------------------------------------

    async def insert_intent(self, new: NewIntent, event: Event) -> Enqueued:
        return await self._write(lambda conn: _insert_intent(conn, new, event))

    async def insert_intents(self, items: Sequence[tuple[NewIntent, Event]]) -> list[Enqueued]:
        return await self._write(lambda conn: whole_or_refused(_insert_each(conn, items)))

    async def insert_each(self, items: Sequence[tuple[NewIntent, Event]]) -> list[Enqueued | OutboxError]:
        return await self._write(lambda conn: _insert_each(conn, items))

    async def get_intent(self, key: str) -> Intent | None:
        def run(conn: sqlite3.Connection) -> Intent | None:
            row = conn.execute(SQL["intent_by_key"], (key,)).fetchone()
            return None if row is None else _intent(row)

        return await self._read(run)

    async def intents_named(self, action_id: str) -> list[Intent]:
        return await self._read(lambda conn: [_intent(r) for r in conn.execute(SQL["intents_by_action"], (action_id,))])

    async def history(self, key: str) -> History:
        def run(conn: sqlite3.Connection) -> History:
            conn.execute("BEGIN")  # one snapshot for the intent and its history
            try:
                row = conn.execute(SQL["intent_by_key"], (key,)).fetchone()
                if row is None:
                    return History()
                seq = row["seq"]
                return History(
                    attempts=[_attempt(r) for r in conn.execute(SQL["attempts_of"], (seq,))],
                    events=[_event(r) for r in conn.execute(SQL["events_of"], (seq,))],
                    intent=_intent(row),
                )
            finally:
                conn.execute("COMMIT")

        return await self._read(run)

    async def list_intents(self, query: IntentQuery) -> Page:
        where: list[str] = []
        params: list[Any] = []
        if query.statuses:
            where.append(f"status IN ({', '.join('?' * len(query.statuses))})")
            params.extend(s.value for s in query.statuses)
        if query.scopes is not None:
            where.append(f"scope IN ({', '.join('?' * len(query.scopes))})" if query.scopes else "0")
            params.extend(query.scopes)
        for column, value in (
            ("destination = ?", query.destination),
            ("channel = ?", query.channel),
            ("created_at >= ?", to_us(query.created_after)),
            ("created_at < ?", to_us(query.created_before)),
            ("seq < ?", query.before_seq),
        ):
            if value is not None:
                where.append(column)
                params.append(value)
        sql = SQL["list_intents"].format(where=" AND ".join(where) or "1")
        params.append(query.limit + 1)

        def run(conn: sqlite3.Connection) -> Page:
            rows = conn.execute(sql, params).fetchall()
            intents = [_intent(row) for row in rows[: query.limit]]
            more = len(rows) > query.limit
            return Page(intents, intents[-1].seq if more and intents else None)

        return await self._read(run)

    # -- the sender's work -----------------------------------------------------------------

    async def apply(self, changes: Sequence[Change], *, claim: Claim | None = None) -> Applied:
        for change in changes:
            check_change(change)
        if claim is None and not changes:
            return Applied([])  # nothing to commit
        return await self._write(_Apply(changes, claim))

    async def recover(self, now: datetime, limit: int, actor: str) -> int:
        return await self._write(_Recover(now, limit, actor))

    async def claim(
        self, owner: str, *, now: datetime, lease_until: datetime, limit: int
    ) -> list[Intent]:
        return await self._write(functools.partial(_claim, claim=Claim(owner, now, lease_until, limit)))

    async def waiting_behind(self, key: str) -> Intent | None:
        def run(conn: sqlite3.Connection) -> Intent | None:
            row = conn.execute(SQL["waiting_behind"], (key,)).fetchone()
            return None if row is None else _intent(row)

        return await self._read(run)

    async def renew_leases(self, held: Sequence[tuple[str, int]], until: datetime) -> list[str]:
        deadline = to_us(until)

        def run(conn: sqlite3.Connection) -> list[str]:
            return [
                key
                for key, fence in held
                if conn.execute(SQL["renew_lease"], (deadline, key, fence)).rowcount == 0
            ]

        return await self._write(run)

    async def expired_leases(self, now: datetime, limit: int) -> list[tuple[Intent, Attempt | None]]:
        def run(conn: sqlite3.Connection) -> list[tuple[Intent, Attempt | None]]:
            found = []
            for row in conn.execute(SQL["expired_leases"], (to_us(now), limit)).fetchall():
                started = conn.execute(SQL["in_flight_attempt"], (row["seq"], row["fence"])).fetchone()
                found.append((_intent(row), _attempt(started) if started else None))
            return found

        return await self._read(run)

    async def first_submission_at(self, key: str) -> datetime | None:
        def run(conn: sqlite3.Connection) -> datetime | None:
            row = conn.execute(SQL["intent_by_key"], (key,)).fetchone()
            if row is None:
                return None
            return _time(conn.execute(SQL["first_submission"], (row["seq"],)).fetchone()[0])

        return await self._read(run)

    async def next_due_at(self) -> datetime | None:
        def run(conn: sqlite3.Connection) -> datetime | None:
            row = conn.execute(SQL["next_due_at"]).fetchone()
            return None if row is None else _time(row[0])

        return await self._read(run)

    async def prune(self, before: datetime, *, dry_run: bool, limit: int | None) -> list[str]:
        def find(conn: sqlite3.Connection) -> list[tuple[int, str]]:
            rows = conn.execute(SQL["prunable"], (to_us(before), -1 if limit is None else limit))  # -1: no limit
            return [(r[0], r[1]) for r in rows]

        if dry_run:
            return [action_id for _, action_id in await self._read(find)]

        def run(conn: sqlite3.Connection) -> list[str]:
            found = find(conn)
            for name in ("delete_events", "delete_attempts", "delete_intent"):
                conn.executemany(SQL[name], [(seq,) for seq, _ in found])
            return [action_id for _, action_id in found]

        return await self._write(run)

    async def count_by_status(self) -> list[tuple[str, str, int]]:
        return await self._read(lambda conn: [tuple(r) for r in conn.execute(SQL["count_by_status"])])

    async def oldest_due_at(self, now: datetime) -> datetime | None:
        return await self._read(lambda conn: _time(conn.execute(SQL["oldest_due"], (to_us(now),)).fetchone()[0]))

    async def activity(self, since: datetime, now: datetime) -> Activity:
        def read(conn: sqlite3.Connection) -> Activity:
            after = to_us(since)
            return Activity(
                [AttemptMinute(d, _time(m), o, n, ms, _time(last))
                 for d, m, o, n, ms, last in conn.execute(SQL["activity_minutes"], (after,))],
                [Failure(d, _time(at), o, code, error)
                 for d, at, o, code, error in conn.execute(SQL["activity_failures"], (after,))],
                [Waiting(d, n, _time(oldest))
                 for d, n, oldest in conn.execute(SQL["activity_waiting"], (to_us(now),))],
                [Span(_time(start), _time(end), n)
                 for start, end, n in conn.execute(SQL["activity_backlog"], (after,))])

        return await self._read(read)

    async def disable_destination(self, destination_id: str, at: datetime) -> None:
        params = (to_us(at), destination_id)
        await self._write(lambda conn: conn.execute(SQL["disable_destination"], params) and None)

    # -- grants ----------------------------------------------------------------------------

    async def put_grant(self, grant_id: str, spec: GrantSpec, at: datetime) -> tuple[Grant, bool]:
        now = to_us(at)
        params = (grant_id, spec.scope, spec.destination, to_us(spec.expires_at), spec.note, now, now)

        def run(conn: sqlite3.Connection) -> tuple[Grant, bool]:
            row = conn.execute(SQL["put_grant"], params).fetchone()
            return _grant(row), row["revision"] == 1

        return await self._write(run)

    async def get_grant(self, grant_id: str) -> Grant | None:
        def run(conn: sqlite3.Connection) -> Grant | None:
            row = conn.execute(SQL["grant_by_id"], (grant_id,)).fetchone()
            return None if row is None else _grant(row)

        return await self._read(run)

    async def list_grants(self) -> list[Grant]:
        return await self._read(lambda conn: [_grant(r) for r in conn.execute(SQL["list_grants"])])

    async def delete_grant(self, grant_id: str) -> None:
        def run(conn: sqlite3.Connection) -> None:
            if conn.execute(SQL["delete_grant"], (grant_id,)).rowcount == 0:
                raise NotFound(f"grant {grant_id!r} does not exist")

        await self._write(run)

    async def find_grant(self, scope: str, destination: str, now: datetime) -> Grant | None:
        def run(conn: sqlite3.Connection) -> Grant | None:
            row = conn.execute(SQL["matching_grant"], (scope, destination, to_us(now))).fetchone()
            return None if row is None else _grant(row)

        return await self._read(run)

    # -- destinations ----------------------------------------------------------------------

    async def put_destination(self, destination: Destination) -> bool:
        d = destination
        keyring = required(self.keyring)

        def run(conn: sqlite3.Connection) -> bool:
            existed = conn.execute(SQL["destination_by_id"], (d.id,)).fetchone() is not None
            conn.execute(SQL["propose_sealing_key"], (keyring.primary,))
            key = keyring.sealing(conn.execute(SQL["sealing_key"]).fetchone()[0])
            conn.execute(
                SQL["put_destination"],
                (
                    d.id,
                    d.channel,
                    json.dumps(dict(d.settings)),
                    keyring.seal(d.secrets, destination_id=d.id, key=key),
                    int(d.idempotent),
                    d.retention_seconds,
                    d.on_unknown.value,
                    d.timeout_seconds,
                    int(d.requires_approval),
                    int(d.allow_private_network),
                    int(d.disabled),
                    to_us(d.created_at),
                    to_us(d.updated_at),
                    int(d.reconcile),
                    d.ordering.value,
                    d.ordering_on_dead.value,
                ),
            ).fetchall()
            return not existed

        return await self._write(run)

    def _destination(self, row: sqlite3.Row) -> Destination:
        return records.destination(row, from_us, self.keyring)

    async def get_destination(self, destination_id: str) -> Destination | None:
        def run(conn: sqlite3.Connection) -> Destination | None:
            row = conn.execute(SQL["destination_by_id"], (destination_id,)).fetchone()
            return None if row is None else self._destination(row)

        return await self._read(run)

    async def list_destinations(self) -> list[Destination]:
        def run(conn: sqlite3.Connection) -> list[Destination]:
            return [self._destination(row) for row in conn.execute(SQL["list_destinations"])]

        return await self._read(run)

    async def sealing_key(self) -> str | None:
        def run(conn: sqlite3.Connection) -> str | None:
            try:
                row = conn.execute(SQL["sealing_key"]).fetchone()
            except sqlite3.OperationalError as exc:
                raise StoreUnavailable("the database is not migrated; run `outbox migrate`") from exc
            return None if row is None else str(row[0])

        return await self._read(run)

    async def reseal_secrets(self, key: str, *, plain_only: bool = False) -> int:
        keyring = required(self.keyring)

        def changes(conn: sqlite3.Connection) -> tuple[str | None, list[tuple[str, str]]]:
            recorded = conn.execute(SQL["sealing_key"]).fetchone()
            return recorded and recorded[0], [
                (sealed, row["id"]) for row in conn.execute(SQL["destination_secrets"])
                if (sealed := keyring.resealed(row["secrets"], destination_id=row["id"], key=key,
                                               plain_only=plain_only)) is not None]

        recorded, found = await self._read(changes)
        if recorded == key and not found:
            return 0  # nothing to seal: no write

        def run(conn: sqlite3.Connection) -> int:
            _, resealed = changes(conn)
            # what the new values replace (plain text, or values sealed under a retired key) is
            # overwritten in the file, not only unlinked from the table
            secure = conn.execute("PRAGMA secure_delete").fetchone()[0]
            conn.execute("PRAGMA secure_delete = ON")
            try:
                conn.executemany(SQL["put_destination_secrets"], resealed)
            finally:
                conn.execute(f"PRAGMA secure_delete = {('OFF', 'ON', 'FAST')[secure]}")
            conn.execute(SQL["propose_sealing_key"], (key,))
            conn.execute(SQL["set_sealing_key"], (key,))
            return len(resealed)

        resealed = await self._write(run)
        async with self._c.lock:  # and earlier versions of those pages leave the write-ahead log
            await on_thread(self._c.db, lambda conn: conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall())
        return resealed

    async def delete_destination(self, destination_id: str) -> None:
        def run(conn: sqlite3.Connection) -> None:
            decide_destination_delete(
                destination_id,
                exists=conn.execute(SQL["destination_by_id"], (destination_id,)).fetchone() is not None,
                waiting=conn.execute(SQL["open_intents_for_destination"], (destination_id,)).fetchone()[0],
                in_history=conn.execute(SQL["any_intent_for_destination"], (destination_id,)).fetchone() is not None,
                grants=[row[0] for row in conn.execute(SQL["grants_for_destination"], (destination_id,))],
            )
            conn.execute(SQL["delete_destination"], (destination_id,))

        await self._write(run)

    # -- tokens ----------------------------------------------------------------------------

    async def insert_token(self, info: TokenInfo, token_hash: str) -> None:
        params = (
            info.id,
            token_hash,
            info.role.value,
            json.dumps(list(info.scopes)),
            info.label,
            to_us(info.created_at),
        )
        await self._write(lambda conn: conn.execute(SQL["insert_token"], params) and None)

    async def token_by_hash(self, token_hash: str) -> TokenInfo | None:
        def run(conn: sqlite3.Connection) -> TokenInfo | None:
            row = conn.execute(SQL["token_by_hash"], (token_hash,)).fetchone()
            return None if row is None else _token(row)

        return await self._read(run)

    async def list_tokens(self) -> list[TokenInfo]:
        def run(conn: sqlite3.Connection) -> list[TokenInfo]:
            return [_token(row) for row in conn.execute(SQL["list_tokens"])]

        return await self._read(run)

    async def revoke_token(self, token_id: str, at: datetime, *, keep_an_admin: bool = True) -> TokenInfo:
        def run(conn: sqlite3.Connection) -> TokenInfo:
            row = conn.execute(SQL["revoke_token"], (to_us(at), token_id, keep_an_admin)).fetchone()
            if row is None:
                found = conn.execute(SQL["token_by_id"], (token_id,)).fetchone()
                raise not_revoked(token_id, None if found is None else _token(found))
            return _token(row)

        return await self._write(run)

    async def count_active_tokens(self, role: str) -> int:
        def run(conn: sqlite3.Connection) -> int:
            return int(conn.execute(SQL["count_active_tokens"], (role,)).fetchone()[0])

        return await self._read(run)


def _statements(script: str) -> list[str]:
    """Split a migration script into statements (sqlite3 runs one at a time)."""
    statements, current = [], ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            statements.append(current.strip())
            current = ""
    if current.strip() and not all(
        part.strip().startswith("--") or not part.strip() for part in current.splitlines()
    ):
        raise ValueError(f"incomplete statement in migration: {current.strip()[:80]!r}")
    return statements
