"""The PostgreSQL store itself: each method one unit of work on a pooled connection
(``connection.Connections``), its SQL named in ``sql/postgres.sql``."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, TypeVar

import asyncpg

from ... import crash
from ...destinations import Destination
from ...errors import InvalidInput, NotFound, OutboxError, StoreUnavailable
from ...events import NewEvent, Published
from ...grants import Grant, GrantSpec
from ...keyring import Keyring, required
from ...model import Attempt, Change, Enqueued, Event, Intent, NewIntent, check_change
from ...portal import PortalLink, PortalSession
from ...tenants import TenantLimits, decide_limits
from ...tokens import ConsoleSession, TokenInfo
from .. import moves, timeline
from ..lookups import Lookups
from ..migrator import Migration, run_migrations, scripts_for
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
from ..records import Row, destination_values, event_data, grant_values, token_values
from ..rules import decide_destination_delete, not_revoked, whole_or_refused
from .changes import apply_rounds, crashing, rounds_by_move, statements
from .connection import (
    MIGRATION_SECONDS,
    READ,
    SNAPSHOT,
    STATEMENT_SECONDS,
    UNAVAILABLE,
    Connections,
    gone,
    start_session,
    unavailable,
)
from .intake import insert_batch, insert_intent
from .listener import listen
from .publishing import PostgresEvents, publish, replace_subscriptions
from .sql import SQL, where

log = logging.getLogger("outbox.store")
T = TypeVar("T")
R = TypeVar("R")


class _PostgresTransaction:
    """A transaction on one of the store's pooled connections."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn

    async def execute(self, sql: str, parameters: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with unavailable(self._conn):
            return [tuple(row) for row in await self._conn.fetch(sql, *parameters)]

    async def insert_intent(self, new: NewIntent, event: Event) -> Enqueued:
        with unavailable(self._conn):
            return await insert_intent(self._conn, new, event)

    async def publish(self, new: NewEvent, *, granted_only: bool, max_fanout: int | None = None) -> Published:
        with unavailable(self._conn):
            return await publish(self._conn, new, granted_only, max_fanout)


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


class PostgresStore(PostgresEvents, Lookups):
    """An outbox in a PostgreSQL database, shared by every process that opens it."""

    dialect = "postgres"
    read = READ

    def __init__(self, dsn: str, *, pool_size: int = 10, statement_seconds: float = STATEMENT_SECONDS,
                 keyring: Keyring | None = None) -> None:
        self.dsn = dsn
        self.keyring = keyring
        self._connections = Connections(dsn, pool_size=pool_size, statement_seconds=statement_seconds)

    # -- connections ---------------------------------------------------------------------

    async def open(self) -> None:
        await self._connections.open()

    async def close(self) -> None:
        await self._connections.close()

    async def _run(self, work: Callable[[asyncpg.Connection], Awaitable[T]], *,
                   transaction: Mapping[str, Any] | None = None) -> T:
        return await self._connections.run(work, transaction=transaction)

    async def _one(self, name: str, args: Sequence[Any], record: Callable[[Row], R]) -> R | None:
        row = await self._connections.fetchrow(name, *args)
        return None if row is None else record(row)

    async def _all(self, name: str, args: Sequence[Any], record: Callable[[Row], R]) -> list[R]:
        return [record(row) for row in await self._connections.fetch(name, *args)]

    async def _value(self, name: str, args: Sequence[Any]) -> Any:
        return await self._connections.fetchval(name, *args)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[_PostgresTransaction]:
        """A transaction for the caller's SQL and enqueues on a pooled connection, committed when
        the block ends. A refused enqueue writes nothing and raises no SQL error, so the block
        may catch it and go on; an error of the database itself aborts the transaction."""
        async with self._connections.connection() as conn:
            try:
                tx = conn.transaction()
                with unavailable(conn):
                    await tx.start()
                try:
                    yield _PostgresTransaction(conn)
                except BaseException:
                    with contextlib.suppress(*UNAVAILABLE):  # a lost connection's transaction is the server's to undo
                        await tx.rollback()
                    raise
                with unavailable(conn):
                    await tx.commit()
            finally:
                try:  # the caller's SQL may have changed the session (SET, ...)
                    await conn.reset()
                    await start_session(conn)
                except Exception:  # (a statement_timeout it set can cut the reset itself short)
                    if not gone(conn):  # (one the server cut is the pool's to replace already)
                        conn.terminate()  # a session that could not be reset serves no one else

    # -- schema, clock and wake-ups ----------------------------------------------------------

    async def migrate(self) -> list[str]:
        async def work(conn: asyncpg.Connection) -> list[str]:
            await conn.execute(SQL["lock_migrations"])
            await conn.execute(SQL["create_migrations_table"])
            applied = await run_migrations(_PostgresMigration(conn), scripts_for(self.dialect))
            await _create_functions(conn)
            return applied

        return await self._run(work, transaction={})

    async def ping(self) -> None:
        try:
            await self._value("applied_migrations", ())
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
        a retry) commits, in any process, until cancelled (``listener.listen``)."""
        await listen(self.dsn, wake)

    # -- intents ---------------------------------------------------------------------------

    async def insert_intent(self, new: NewIntent, event: Event) -> Enqueued:
        return await self._run(lambda conn: insert_intent(conn, new, event), transaction={})

    async def insert_intents(self, items: Sequence[tuple[NewIntent, Event]]) -> list[Enqueued]:
        async def work(conn: asyncpg.Connection) -> list[Enqueued]:
            return whole_or_refused(await insert_batch(conn, items))

        return await self._run(work, transaction={})

    async def insert_each(self, items: Sequence[tuple[NewIntent, Event]]) -> list[Enqueued | OutboxError]:
        return await self._run(lambda conn: insert_batch(conn, items), transaction={})

    async def history(self, key: str) -> History:
        async def work(conn: asyncpg.Connection) -> History:
            row = await conn.fetchrow(SQL["intent_by_key"], key)
            if row is None:
                return History()
            attempts = await conn.fetch(SQL["attempts_of"], row["seq"])
            logged = await conn.fetch(SQL["events_of"], row["seq"])
            intent = READ.intent(row)
            return History(
                attempts=[READ.attempt(r) for r in attempts],
                events=timeline.merged(((r["id"], READ.event(r)) for r in logged),
                                       ((READ.attempt(r), r["events"]) for r in attempts),
                                       timeline.current_lease(intent, await conn.fetchval(SQL["lease_unrecorded"],
                                                                                          row["seq"]))),
                intent=intent,
            )

        return await self._run(work, transaction=SNAPSHOT)

    async def list_intents(self, query: IntentQuery) -> Page:
        params: list[Any] = [query.limit + 1]
        sql = SQL["list_intents"].format(where=where(query.filters(), params))
        rows = await self._run(lambda conn: conn.fetch(sql, *params))
        return query.page([READ.intent(row) for row in rows])

    # -- the sender's work -----------------------------------------------------------------

    async def apply(self, changes: Sequence[Change], *, claim: Claim | None = None) -> Applied:
        for change in changes:
            check_change(change)
        if not changes and claim is None:
            return Applied([], [])
        rounds = rounds_by_move(changes)
        crash_armed = crashing(changes)

        async def together(conn: asyncpg.Connection) -> Applied:
            applied = await apply_rounds(conn, changes, rounds, claim)
            if crash_armed:
                crash.crash_point("mid_group_commit")
            return applied

        try:  # one statement (a worker's usual cycle) needs no transaction of its own around it
            return await self._run(together, transaction={} if statements(rounds, claim) > 1 or crash_armed else None)
        except asyncpg.PostgresError as exc:  # ("not now" is StoreUnavailable by here, and raised)
            log.info("a batch of %d change(s) failed (%s: %s); applying each alone", len(changes),
                     type(exc).__name__, exc)

        async def each(conn: asyncpg.Connection) -> Applied:
            results: list[Intent | OutboxError | None] = []
            for change in changes:
                try:
                    async with conn.transaction():  # a savepoint: a change that fails undoes itself only
                        results += (await apply_rounds(conn, [change], rounds_by_move([change]), None)).results
                except asyncpg.PostgresError as exc:
                    if isinstance(exc, UNAVAILABLE):
                        raise
                    results.append(InvalidInput(f"the change to intent {change.key!r} cannot be written: {exc}"))
            if crash_armed:
                crash.crash_point("mid_group_commit")
            claimed = await apply_rounds(conn, [], [], claim)
            return Applied(results, claimed.claimed, claimed.held)

        return await self._run(each, transaction={})

    async def recover(self, now: datetime, limit: int, actor: str) -> int:
        async def work(conn: asyncpg.Connection) -> int:
            held = await conn.fetch(SQL["lock_recoverable"], now, limit)
            if not held:
                return 0
            logged = [moves.recovered_event(row["lease_owner"], now, actor) for row in held]
            return len(await conn.fetch(SQL["recover"], [row["seq"] for row in held], [e.reason for e in logged],
                                        now, actor, event_data(logged[0])))

        return await self._run(work, transaction={})

    async def claim(
        self, owner: str, *, now: datetime, lease_until: datetime, limit: int
    ) -> list[Intent]:
        return (await self.apply([], claim=Claim(owner, now, lease_until, limit))).claimed

    async def renew_leases(self, held: Sequence[tuple[str, int]], until: datetime) -> list[str]:
        ordered = sorted(held)  # key order: renewals that overlap meet their rows in the same order
        rows = await self._connections.fetch("renew_leases", until, [key for key, _ in ordered],
                                             [fence for _, fence in ordered])
        renewed = {(row["intent_key"], row["fence"]) for row in rows}
        return [key for key, fence in held if (key, fence) not in renewed]

    async def expired_leases(self, now: datetime, limit: int) -> list[tuple[Intent, Attempt | None]]:
        return [(READ.intent(row), None if row["in_flight"] is None else READ.attempt(row["in_flight"]))
                for row in await self._connections.fetch("expired_leases", now, limit)]

    async def first_submission_at(self, key: str) -> datetime | None:
        found: datetime | None = READ.at(await self._connections.fetchval("first_submission", key))
        return found

    async def prune(self, before: datetime, *, dry_run: bool, limit: int | None) -> list[str]:
        return [row[0] for row in await self._connections.fetch("prunable" if dry_run else "prune", before, limit)]

    async def activity(self, since: datetime, now: datetime) -> Activity:
        async def work(conn: asyncpg.Connection) -> Activity:
            return Activity(
                [AttemptMinute(d, READ.at(m), o, n, ms, READ.at(last))
                 for d, m, o, n, ms, last in await conn.fetch(SQL["activity_minutes"], since)],
                [Failure(d, READ.at(at), o, code, error)
                 for d, at, o, code, error in await conn.fetch(SQL["activity_failures"], since)],
                [Waiting(d, n, READ.at(oldest)) for d, n, oldest in await conn.fetch(SQL["activity_waiting"], now)],
                [Span(READ.at(start), READ.at(end), n)
                 for start, end, n in await conn.fetch(SQL["activity_backlog"], since)])

        return await self._run(work, transaction=SNAPSHOT)

    async def destination_counts(self, destination_id: str) -> dict[str, int]:
        return {status: n for status, n in await self._connections.fetch("destination_counts", destination_id)}

    async def failed_attempts(self, destination_id: str, since: datetime, limit: int) -> list[FailedAttempt]:
        rows = await self._connections.fetch("destination_failures", destination_id, since, limit)
        return [FailedAttempt(a, s, n, READ.at(at), sub, o, code, error) for a, s, n, at, sub, o, code, error in rows]

    async def disable_destination(self, destination_id: str, at: datetime) -> None:
        await self._connections.execute("disable_destination", at, destination_id)

    async def pause_destination(self, destination_id: str, until: datetime) -> None:
        await self._connections.execute("pause_destination", destination_id, until)

    # -- grants ----------------------------------------------------------------------------

    async def put_grant(self, grant_id: str, spec: GrantSpec, at: datetime) -> tuple[Grant, bool]:
        row = await self._connections.fetchrow("put_grant", *grant_values(grant_id, spec, at))
        return READ.grant(row), row["revision"] == 1

    async def delete_grant(self, grant_id: str) -> None:
        if await self._connections.fetchval("delete_grant", grant_id) is None:
            raise NotFound(f"grant {grant_id!r} does not exist")

    # -- destinations ----------------------------------------------------------------------

    async def put_destination(self, destination: Destination, *, limits: TenantLimits | None = None) -> bool:
        d = destination
        keyring = required(self.keyring)

        async def work(conn: asyncpg.Connection) -> bool:
            if limits is not None and d.owner is not None:  # the owner's puts take turns: counted whole
                await conn.execute(SQL["lock_owner"], d.owner)
                counted = await conn.fetchrow(SQL["owned_counts"], d.owner, d.id)
                decide_limits(limits, others=counted["destinations"], others_subscriptions=counted["subscriptions"],
                              subscriptions=len(d.subscriptions))
            await conn.execute(SQL["propose_sealing_key"], keyring.primary)
            key = keyring.sealing(await conn.fetchval(SQL["share_sealing_key"]))
            created: bool = await conn.fetchval(
                SQL["put_destination"], *destination_values(d, keyring.seal(d.secrets, destination_id=d.id, key=key)))
            await replace_subscriptions(conn, d)
            return created

        return await self._run(work, transaction={})

    async def sealing_key(self) -> str | None:
        try:
            key: str | None = await self._value("sealing_key", ())
        except asyncpg.UndefinedTableError as exc:
            raise StoreUnavailable("the database is not migrated; run `outbox migrate`") from exc
        return key

    async def reseal_secrets(self, key: str, *, plain_only: bool = False) -> int:
        keyring = required(self.keyring)

        def changes(rows: list[asyncpg.Record]) -> list[tuple[str, str]]:
            return [(row["id"], sealed) for row in rows
                    if (sealed := keyring.resealed(row["secrets"], destination_id=row["id"], key=key,
                                                   plain_only=plain_only)) is not None]

        if await self.sealing_key() == key and not changes(await self._connections.fetch("destination_secrets")):
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
            await conn.execute(SQL["delete_subscriptions"], destination_id)
            await conn.execute(SQL["delete_destination"], destination_id)

        await self._run(work, transaction={})

    # -- tokens ----------------------------------------------------------------------------

    async def insert_token(self, info: TokenInfo, token_hash: str) -> None:
        await self._connections.execute("insert_token", *token_values(info, token_hash))

    async def revoke_token(self, token_id: str, at: datetime, *, keep_an_admin: bool = True) -> TokenInfo:
        async def work(conn: asyncpg.Connection) -> TokenInfo:
            row = await conn.fetchrow(SQL["revoke_token"], at, token_id, keep_an_admin)
            if row is None:
                found = await conn.fetchrow(SQL["token_by_id"], token_id)
                raise not_revoked(token_id, None if found is None else READ.token(found))
            return READ.token(row)

        return await self._run(work, transaction={})

    async def open_console_session(self, session: ConsoleSession, *, keep: int) -> None:
        async def work(conn: asyncpg.Connection) -> None:
            await conn.execute(SQL["prune_console_sessions"], session.created_at)
            await conn.execute(SQL["insert_console_session"], session.id_hash, session.token_id,
                               session.created_at, session.expires_at)
            await conn.execute(SQL["trim_console_sessions"], session.token_id, keep)

        await self._run(work, transaction={})

    async def close_console_session(self, id_hash: str) -> None:
        await self._connections.execute("close_console_session", id_hash)

    async def insert_portal_link(self, link: PortalLink) -> None:
        async def work(conn: asyncpg.Connection) -> None:
            await conn.execute(SQL["prune_portal_links"], link.created_at)
            await conn.execute(SQL["insert_portal_link"], link.link_hash, link.token_id, link.scope, link.read_only,
                               link.session_seconds, link.created_at, link.expires_at)

        await self._run(work, transaction={})

    async def open_portal_link(self, link_hash: str, session_hash: str, now: datetime) -> PortalSession | None:
        row = await self._connections.fetchrow("open_portal_link", link_hash, session_hash, now)
        return None if row is None else _portal_session(row)

    async def close_portal_session(self, session_hash: str) -> None:
        await self._connections.execute("close_portal_session", session_hash)

    async def portal_session(self, session_hash: str, now: datetime) -> PortalSession | None:
        row = await self._connections.fetchrow("portal_session", session_hash, now)
        return None if row is None else _portal_session(row)


def _portal_session(row: Row) -> PortalSession:
    return PortalSession(row["scope"], row["read_only"], row["session_expires_at"])


#: The functions the store creates from its named SQL (not from a migration's body), by signature, each with the
#: relation its body needs: their bodies share the statements' rules (the flow-limited claim takes the ordering
#: rule, ``claimable``, and returns records of intent_records, migration 0023).
FUNCTIONS = {"outbox_claim_limited(text, timestamptz, timestamptz, integer)": ("claim_limited_function",
                                                                               "intent_records")}


async def _create_functions(conn: asyncpg.Connection) -> None:
    """(Re)create each of FUNCTIONS whose body in the database is not this release's (the text
    between its ``$$``), inside the migrations' transaction and lock: changing a function is a
    change of its named SQL, not a new migration, and one another release made is replaced (dropped
    first: what it returns may differ, which a replacement cannot change); none before the migrations
    have made what its body needs (a database migrated only part of the way, as tests of old rows do)."""
    for signature, (name, needs) in FUNCTIONS.items():
        if await conn.fetchval(SQL["relation_exists"], needs) is None:
            continue
        if await conn.fetchval(SQL["function_body"], signature) != SQL[name].split("$$")[1]:
            await conn.execute(f"DROP FUNCTION IF EXISTS {signature}")
            await conn.execute(SQL[name])
