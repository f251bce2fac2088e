"""The SQLite store itself: writes group-committed on the writer connection, reads on the reader
beside it, its SQL named in ``sql/sqlite.sql``."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from ...destinations import Destination
from ...errors import NoDatabase, NotFound, OutboxError, StoreUnavailable
from ...events import NewEvent, Published
from ...grants import Grant, GrantSpec
from ...keyring import Keyring, required
from ...model import Attempt, Change, Enqueued, Event, Intent, NewIntent, check_change
from ...portal import PortalLink, PortalSession
from ...tenants import TenantLimits, decide_limits
from ...tokens import ConsoleSession, TokenInfo
from .. import timeline
from ..lookups import Lookups
from ..migrator import run_migrations, scripts_for
from ..plumbing import GroupCommitter, connect, from_us, on_thread, to_us, unavailable
from ..protocol import (
    Activity,
    Applied,
    AttemptMinute,
    Claim,
    FailedAttempt,
    Failure,
    History,
    IntentQuery,
    Page,
    Span,
    Waiting,
)
from ..records import Row, destination_values, grant_values, token_values
from ..rules import decide_destination_delete, not_revoked, whole_or_refused
from .changes import Apply, Recover, make_claim
from .intake import insert_each, insert_intent
from .migration import SqliteMigration, begin_migration
from .publishing import SqliteEvents, publish, replace_subscriptions
from .sql import READ, SQL, stored, where

T = TypeVar("T")
R = TypeVar("R")

#: How often ``listen`` looks whether another connection committed to the database file.
WATCH_SECONDS = 0.05
#: Set while this task holds a caller's transaction: a group-committed write would wait for it.
_IN_TRANSACTION: contextvars.ContextVar[bool] = contextvars.ContextVar("in_tx", default=False)


class _SqliteTransaction:
    """The caller's transaction on the writer connection."""

    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    async def execute(self, sql: str, parameters: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        rows = await self._db.execute_fetchall(sql, parameters)
        return [tuple(row) for row in rows]

    async def insert_intent(self, new: NewIntent, event: Event) -> Enqueued:
        return await on_thread(self._db, insert_intent, new, event)

    async def publish(self, new: NewEvent, *, granted_only: bool, max_fanout: int | None = None) -> Published:
        return await on_thread(self._db, publish, new, granted_only, max_fanout)


class SqliteStore(SqliteEvents, Lookups):
    """An outbox in one SQLite file."""

    dialect = "sqlite"
    read = READ
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
    def _open_committer(self) -> GroupCommitter:
        if self._committer is None:
            raise StoreUnavailable("the store is not open")
        return self._committer

    @property
    def _open_reader(self) -> aiosqlite.Connection:
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
        return await self._open_committer.write(job)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[_SqliteTransaction]:
        async with self._open_committer.lock:
            db = self._open_committer.db
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

    async def _execute(self, name: str, args: Sequence[Any]) -> None:
        """Statement ``name`` with ``args``, group-committed."""
        params = tuple(map(stored, args))
        await self._write(lambda conn: conn.execute(SQL[name], params) and None)

    # -- reads -----------------------------------------------------------------------------

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        return await on_thread(self._open_reader, fn, *args)

    async def _one(self, name: str, args: Sequence[Any], record: Callable[[Row], R]) -> R | None:
        def run(conn: sqlite3.Connection) -> R | None:
            row = conn.execute(SQL[name], tuple(map(stored, args))).fetchone()
            return None if row is None else record(row)

        return await self._read(run)

    async def _all(self, name: str, args: Sequence[Any], record: Callable[[Row], R]) -> list[R]:
        return await self._read(lambda conn: [record(row) for row in conn.execute(SQL[name], tuple(map(stored, args)))])

    async def _value(self, name: str, args: Sequence[Any]) -> Any:
        def run(conn: sqlite3.Connection) -> Any:
            row = conn.execute(SQL[name], tuple(map(stored, args))).fetchone()
            return None if row is None else row[0]

        return await self._read(run)

    # -- schema ----------------------------------------------------------------------------

    async def migrate(self) -> list[str]:
        async with self._open_committer.lock:  # no group commit meanwhile
            db = self._open_committer.db
            await on_thread(db, begin_migration)
            try:
                applied = await run_migrations(SqliteMigration(db), scripts_for(self.dialect))
                await on_thread(db, lambda conn: conn.execute("COMMIT") and None)
            except BaseException:
                if db.in_transaction:
                    await on_thread(db, lambda conn: conn.execute("ROLLBACK") and None)
                raise
            return applied

    async def listen(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` whenever another connection commits to the database file (an application
        enqueuing on its own connection, another outbox process), until cancelled; and once at the
        start. It asks the writer's ``PRAGMA data_version`` every WATCH_SECONDS: SQLite changes it
        only when a connection other than that one commits, reading no table and writing nothing,
        so this store's own commits wake nothing (its enqueues notify in the process already)."""
        seen: int | None = None
        wake()
        while True:
            try:
                version: int | None = await on_thread(self._open_committer.db, _data_version)
            except StoreUnavailable:
                version = seen  # (the next look may answer; workers still poll meanwhile)
            if seen is not None and version != seen:
                wake()
            seen = version
            await asyncio.sleep(WATCH_SECONDS)

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
        return await self._write(lambda conn: insert_intent(conn, new, event))

    async def insert_intents(self, items: Sequence[tuple[NewIntent, Event]]) -> list[Enqueued]:
        return await self._write(lambda conn: whole_or_refused(insert_each(conn, items)))

    async def insert_each(self, items: Sequence[tuple[NewIntent, Event]]) -> list[Enqueued | OutboxError]:
        return await self._write(lambda conn: insert_each(conn, items))

    async def history(self, key: str) -> History:
        def run(conn: sqlite3.Connection) -> History:
            conn.execute("BEGIN")  # one snapshot for the intent and its history
            try:
                row = conn.execute(SQL["intent_by_key"], (key,)).fetchone()
                if row is None:
                    return History()
                seq = row["seq"]
                attempts = conn.execute(SQL["attempts_of"], (seq,)).fetchall()
                intent = READ.intent(row)
                return History(
                    attempts=[READ.attempt(r) for r in attempts],
                    events=timeline.merged(((r["id"], READ.event(r)) for r in conn.execute(SQL["events_of"], (seq,))),
                                           ((READ.attempt(r), r["events"]) for r in attempts),
                                           timeline.current_lease(intent, conn.execute(
                                               SQL["lease_unrecorded"], (seq,)).fetchone()[0])),
                    intent=intent,
                )
            finally:
                conn.execute("COMMIT")

        return await self._read(run)

    async def list_intents(self, query: IntentQuery) -> Page:
        params: list[Any] = []
        sql = SQL["list_intents"].format(where=where(query.filters(), params))
        params.append(query.limit + 1)
        return await self._read(lambda conn: query.page([READ.intent(row) for row in conn.execute(sql, params)]))

    # -- the sender's work -----------------------------------------------------------------

    async def apply(self, changes: Sequence[Change], *, claim: Claim | None = None) -> Applied:
        for change in changes:
            check_change(change)
        if claim is None and not changes:
            return Applied([])  # nothing to commit
        return await self._write(Apply(changes, claim))

    async def recover(self, now: datetime, limit: int, actor: str) -> int:
        return await self._write(Recover(now, limit, actor))

    async def claim(
        self, owner: str, *, now: datetime, lease_until: datetime, limit: int
    ) -> list[Intent]:
        claimed, _ = await self._write(functools.partial(make_claim, claim=Claim(owner, now, lease_until, limit)))
        return claimed

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
                found.append((READ.intent(row), READ.attempt(started) if started else None))
            return found

        return await self._read(run)

    async def first_submission_at(self, key: str) -> datetime | None:
        def run(conn: sqlite3.Connection) -> datetime | None:
            row = conn.execute(SQL["intent_by_key"], (key,)).fetchone()
            if row is None:
                return None
            return READ.at(conn.execute(SQL["first_submission"], (row["seq"],)).fetchone()[0])

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

    async def activity(self, since: datetime, now: datetime) -> Activity:
        def read(conn: sqlite3.Connection) -> Activity:
            after = to_us(since)
            return Activity(
                [AttemptMinute(d, READ.at(m), o, n, ms, READ.at(last))
                 for d, m, o, n, ms, last in conn.execute(SQL["activity_minutes"], (after,))],
                [Failure(d, READ.at(at), o, code, error)
                 for d, at, o, code, error in conn.execute(SQL["activity_failures"], (after,))],
                [Waiting(d, n, READ.at(oldest))
                 for d, n, oldest in conn.execute(SQL["activity_waiting"], (to_us(now),))],
                [Span(READ.at(start), READ.at(end), n)
                 for start, end, n in conn.execute(SQL["activity_backlog"], (after,))])

        return await self._read(read)

    async def destination_counts(self, destination_id: str) -> dict[str, int]:
        def read(conn: sqlite3.Connection) -> dict[str, int]:
            return dict(conn.execute(SQL["destination_counts"], (destination_id,)).fetchall())

        return await self._read(read)

    async def failed_attempts(self, destination_id: str, since: datetime, limit: int) -> list[FailedAttempt]:
        def read(conn: sqlite3.Connection) -> list[FailedAttempt]:
            rows = conn.execute(SQL["destination_failures"], (destination_id, to_us(since), limit))
            return [FailedAttempt(a, s, n, READ.at(at), sub, o, code, error)
                    for a, s, n, at, sub, o, code, error in rows]

        return await self._read(read)

    async def disable_destination(self, destination_id: str, at: datetime) -> None:
        await self._execute("disable_destination", (at, destination_id))

    async def pause_destination(self, destination_id: str, until: datetime) -> None:
        await self._execute("pause_destination", (destination_id, until))

    # -- grants ----------------------------------------------------------------------------

    async def put_grant(self, grant_id: str, spec: GrantSpec, at: datetime) -> tuple[Grant, bool]:
        params = tuple(map(stored, grant_values(grant_id, spec, at)))

        def run(conn: sqlite3.Connection) -> tuple[Grant, bool]:
            row = conn.execute(SQL["put_grant"], params).fetchone()
            return READ.grant(row), row["revision"] == 1

        return await self._write(run)

    async def delete_grant(self, grant_id: str) -> None:
        def run(conn: sqlite3.Connection) -> None:
            if conn.execute(SQL["delete_grant"], (grant_id,)).rowcount == 0:
                raise NotFound(f"grant {grant_id!r} does not exist")

        await self._write(run)

    # -- destinations ----------------------------------------------------------------------

    async def put_destination(self, destination: Destination, *, limits: TenantLimits | None = None) -> bool:
        d = destination
        keyring = required(self.keyring)

        def run(conn: sqlite3.Connection) -> bool:
            existed = conn.execute(SQL["destination_by_id"], (d.id,)).fetchone() is not None
            if limits is not None and d.owner is not None:  # (the one writer: counted whole)
                others, subscribed = conn.execute(SQL["owned_counts"], (d.owner, d.id)).fetchone()
                decide_limits(limits, others=others, others_subscriptions=subscribed,
                              subscriptions=len(d.subscriptions))
            conn.execute(SQL["propose_sealing_key"], (keyring.primary,))
            key = keyring.sealing(conn.execute(SQL["sealing_key"]).fetchone()[0])
            sealed = keyring.seal(d.secrets, destination_id=d.id, key=key)
            conn.execute(SQL["put_destination"], tuple(map(stored, destination_values(d, sealed)))).fetchall()
            replace_subscriptions(conn, d)
            return not existed

        return await self._write(run)

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
        committer = self._open_committer
        async with committer.lock:  # and earlier versions of those pages leave the write-ahead log
            await on_thread(committer.db, lambda conn: conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall())
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
            conn.execute(SQL["delete_subscriptions"], (destination_id,))
            conn.execute(SQL["delete_destination"], (destination_id,))

        await self._write(run)

    # -- tokens ----------------------------------------------------------------------------

    async def insert_token(self, info: TokenInfo, token_hash: str) -> None:
        await self._execute("insert_token", token_values(info, token_hash))

    async def revoke_token(self, token_id: str, at: datetime, *, keep_an_admin: bool = True) -> TokenInfo:
        def run(conn: sqlite3.Connection) -> TokenInfo:
            row = conn.execute(SQL["revoke_token"], (to_us(at), token_id, keep_an_admin)).fetchone()
            if row is None:
                found = conn.execute(SQL["token_by_id"], (token_id,)).fetchone()
                raise not_revoked(token_id, None if found is None else READ.token(found))
            return READ.token(row)

        return await self._write(run)

    async def open_console_session(self, session: ConsoleSession, *, keep: int) -> None:
        def run(conn: sqlite3.Connection) -> None:
            conn.execute(SQL["prune_console_sessions"], (to_us(session.created_at),))
            conn.execute(SQL["insert_console_session"], (
                session.id_hash, session.token_id, to_us(session.created_at), to_us(session.expires_at)))
            conn.execute(SQL["trim_console_sessions"], (session.token_id, keep))

        await self._write(run)

    async def close_console_session(self, id_hash: str) -> None:
        await self._execute("close_console_session", (id_hash,))

    async def insert_portal_link(self, link: PortalLink) -> None:
        def run(conn: sqlite3.Connection) -> None:
            conn.execute(SQL["prune_portal_links"], (to_us(link.created_at),))
            conn.execute(SQL["insert_portal_link"], (
                link.link_hash, link.token_id, link.scope, int(link.read_only), link.session_seconds,
                to_us(link.created_at), to_us(link.expires_at)))

        await self._write(run)

    async def open_portal_link(self, link_hash: str, session_hash: str, now: datetime) -> PortalSession | None:
        def run(conn: sqlite3.Connection) -> PortalSession | None:
            row = conn.execute(SQL["open_portal_link"], (link_hash, session_hash, to_us(now))).fetchone()
            return None if row is None else _portal_session(row)

        return await self._write(run)

    async def portal_session(self, session_hash: str, now: datetime) -> PortalSession | None:
        return await self._one("portal_session", (session_hash, now), _portal_session)

    async def close_portal_session(self, session_hash: str) -> None:
        await self._execute("close_portal_session", (session_hash,))


def _portal_session(row: Row) -> PortalSession:
    return PortalSession(row["scope"], bool(row["read_only"]), from_us(row["session_expires_at"]))


def _data_version(conn: sqlite3.Connection) -> int:
    """What changes when a connection other than ``conn`` commits to its database."""
    return int(conn.execute("PRAGMA data_version").fetchone()[0])
