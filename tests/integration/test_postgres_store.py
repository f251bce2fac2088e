"""What only the PostgreSQL backend can show: the caller's own connection and transaction,
concurrent migrations, query plans, the database's clock, wake-ups across processes, and the
database going away. Each test has a database of its own (``tests/pg.py``); without a reachable
PostgreSQL they skip, or fail under CI=true."""

from __future__ import annotations

import asyncio
import base64
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from outbox import (
    DestinationSpec,
    IntentConflict,
    ManualClock,
    Outbox,
    Role,
    SchemaTooNew,
    Settings,
    Status,
    StoreUnavailable,
)
from outbox.clock import OffsetClock
from outbox.errors import InvalidInput, NotFound, NoTransaction, StaleWrite
from outbox.flow import RateLimit
from outbox.grants import GrantSpec
from outbox.keyring import generate_key, key_id
from outbox.model import (
    Attempt,
    Cancel,
    Event,
    EventKind,
    Intent,
    Outcome,
    Release,
    Replay,
    Settle,
    Start,
    Submission,
)
from outbox.operations import Actor, replay
from outbox.secrets_key import rotate, unlock
from outbox.store import migrator, moves
from outbox.store.postgres import LISTENER, SQL, PostgresStore, cycle_arguments
from outbox.store.postgres.sql import where
from outbox.store.protocol import Claim
from outbox.store.records import destination_values
from sender import Worker

from .. import pg
from ..conftest import SECRET, eventually, open_box
from ..receiver import Reply


@pytest.fixture
def box_url(pg_url: str) -> str:
    """``box`` on this test's PostgreSQL database."""
    return pg_url


@pytest.fixture
async def conn(pg_url: str) -> AsyncIterator[Any]:
    """The application's own connection, with its own table ``orders``."""
    connection = await asyncpg.connect(pg_url)
    await connection.execute("CREATE TABLE orders (id integer PRIMARY KEY, total integer NOT NULL)")
    try:
        yield connection
    finally:
        await connection.close()


async def orders(url: str) -> list[int]:
    """The committed orders, read on a connection of its own."""
    reader = await asyncpg.connect(url)
    try:
        return [row[0] for row in await reader.fetch("SELECT id FROM orders ORDER BY id")]
    finally:
        await reader.close()


# -- the caller's connection ------------------------------------------------------------------


async def test_an_enqueue_on_the_callers_connection_commits_with_the_callers_transaction(box, conn, pg_url):
    async with conn.transaction():
        await conn.execute("INSERT INTO orders VALUES (1, 990)")
        async with box.transaction(connection=conn) as tx:
            result = await tx.enqueue(destination="billing", scope="acme", action_id="order-1", payload={"order": 1})
        assert result.created
        # written on the caller's connection, not committed by the outbox: nobody else sees it yet
        assert await box.store.get_intent("acme/order-1") is None
        assert await orders(pg_url) == []
    assert (await box.get("order-1", scope="acme")).status is Status.PENDING
    assert await orders(pg_url) == [1]


async def test_an_enqueue_on_the_callers_connection_rolls_back_with_the_callers_transaction(box, conn, pg_url):
    with pytest.raises(RuntimeError, match="card declined"):
        async with conn.transaction():
            await conn.execute("INSERT INTO orders VALUES (1, 990)")
            async with box.transaction(connection=conn) as tx:
                await tx.enqueue(destination="billing", scope="acme", action_id="order-1", payload={"order": 1})
            raise RuntimeError("card declined")
    assert await box.store.get_intent("acme/order-1") is None
    assert await orders(pg_url) == []


async def test_a_conflicting_enqueue_raises_and_leaves_the_callers_transaction_usable(box, conn, pg_url):
    """As documented on PostgresStore.transaction: a refused enqueue writes nothing and raises no
    SQL error, so the caller may catch it and commit the rest, or let it roll everything back."""
    await box.enqueue(destination="billing", scope="acme", action_id="order-1", payload={"order": 1})
    async with conn.transaction():
        await conn.execute("INSERT INTO orders VALUES (1, 990)")
        with pytest.raises(IntentConflict, match="payload_digest"):
            async with box.transaction(connection=conn) as tx:
                await tx.enqueue(destination="billing", scope="acme", action_id="order-1", payload={"order": 2})
        await conn.execute("INSERT INTO orders VALUES (2, 10)")  # the transaction goes on
    assert await orders(pg_url) == [1, 2]
    intent, history = await box.show("order-1", scope="acme")
    assert intent.payload == {"order": 1} and [e.kind for e in history.events] == [EventKind.ENQUEUED]

    with pytest.raises(IntentConflict):  # not caught inside: the caller's transaction rolls back
        async with conn.transaction():
            await conn.execute("INSERT INTO orders VALUES (3, 5)")
            async with box.transaction(connection=conn) as tx:
                await tx.enqueue(destination="billing", scope="acme", action_id="order-1", payload={"order": 3})
    assert await orders(pg_url) == [1, 2]


async def test_a_database_error_aborts_the_callers_transaction_unless_a_savepoint_holds_the_enqueue(
        box, conn, pg_url):
    """An error of the database itself aborts a PostgreSQL transaction: here the destination is
    locked elsewhere past the caller's lock_timeout (StoreUnavailable). Inside a savepoint (a nested
    conn.transaction()) only the enqueue is undone and the caller's transaction goes on."""
    locker = await asyncpg.connect(pg_url)
    try:
        async with locker.transaction():
            await locker.execute("SELECT 1 FROM destinations WHERE id = 'billing' FOR UPDATE")
            async with conn.transaction():
                await conn.execute("SET LOCAL lock_timeout = '100ms'")
                await conn.execute("INSERT INTO orders VALUES (1, 990)")
                with pytest.raises(StoreUnavailable, match="lock timeout"):
                    async with conn.transaction(), box.transaction(connection=conn) as tx:  # a savepoint
                        await tx.enqueue(destination="billing", scope="acme", action_id="o-1", payload={})
                await conn.execute("INSERT INTO orders VALUES (2, 10)")
            with pytest.raises(asyncpg.InFailedSQLTransactionError):
                async with conn.transaction():
                    await conn.execute("SET LOCAL lock_timeout = '100ms'")
                    with pytest.raises(StoreUnavailable):
                        async with box.transaction(connection=conn) as tx:
                            await tx.enqueue(destination="billing", scope="acme", action_id="o-2", payload={})
                    await conn.execute("INSERT INTO orders VALUES (3, 5)")
    finally:
        await locker.close()
    assert await orders(pg_url) == [1, 2]
    assert await box.store.get_intent("acme/o-1") is None and await box.store.get_intent("acme/o-2") is None


async def test_a_callers_connection_outside_a_transaction_is_refused(box, conn):
    with pytest.raises(NoTransaction, match="commit at once and alone"):
        async with box.transaction(connection=conn):
            pass


# -- migrations -------------------------------------------------------------------------------


async def test_migrations_are_recorded_as_the_same_versions_as_sqlites(box, pg_url):
    reader = await asyncpg.connect(pg_url)
    try:
        recorded = [tuple(row) for row in await reader.fetch("SELECT version, name FROM schema_migrations")]
    finally:
        await reader.close()
    assert recorded == [(m.version, m.name) for m in migrator.scripts_for("sqlite")]
    assert await box.store.migrate() == []


async def test_concurrent_migrations_of_a_fresh_database_apply_each_script_once(pg_url):
    stores = [PostgresStore(pg_url), PostgresStore(pg_url)]
    for store in stores:
        await store.open()
    try:
        results = await asyncio.gather(*(store.migrate() for store in stores))
        assert sorted(results, key=len) == [[], [m.name for m in migrator.scripts_for("postgres")]]
        await stores[0].ping()
    finally:
        for store in stores:
            await store.close()


async def test_a_database_from_a_newer_release_is_refused(pg_url):
    async with await Outbox.open(pg_url):
        pass
    writer = await asyncpg.connect(pg_url)
    try:
        await writer.execute("INSERT INTO schema_migrations VALUES (99, '0099_future', now())")
    finally:
        await writer.close()
    with pytest.raises(SchemaTooNew, match="version 99"):
        await Outbox.open(pg_url)


# -- query plans -------------------------------------------------------------------------------


async def test_the_claim_and_expired_lease_lookups_use_their_indexes_among_many_rows(box, pg_url):
    """Among 20,000 intents, 200 of them leased (lease rows, stored pending and due): the claim picks
    the oldest due straight off intents_due, and the sweeper's lookups read the lease rows and find
    each intent by its key; none reads intents whole, and the claim takes none of the leased."""
    writer = await asyncpg.connect(pg_url)
    try:
        await writer.execute("""
            INSERT INTO intents (intent_key, action_id, scope, destination, channel, payload, payload_digest,
                                 status, max_attempts, next_attempt_at, created_at, updated_at)
            SELECT 'acme/' || n, n::text, 'acme', 'billing', 'webhook', '{}', 'sha256:aa',
                   CASE WHEN n % 200 IN (0, 1) THEN 'pending' ELSE 'delivered' END,
                   5, now() - n * interval '1 second', now(), now()
            FROM generate_series(1, 20000) AS n""")
        await writer.execute("""
            INSERT INTO intent_leases (intent_seq, destination, lease_owner, lease_expires_at, fence, leased_at)
            SELECT seq, destination, 'w0', now(), 1, now() FROM intents WHERE action_id::integer % 200 = 1""")
        await writer.execute("ANALYZE intents")
        await writer.execute("ANALYZE intent_leases")
        now = datetime.now(UTC)

        async def plan(statement: str, *args: Any) -> str:
            return "\n".join(row[0] for row in await writer.fetch("EXPLAIN " + statement, *args))

        # the claim's pick: the oldest due, straight off the partial index (its other sorts order
        # the few rows leased, not the table)
        claim = await plan(SQL["cycle"], *cycle_arguments([], [], Claim("w1", now, now, 10)))
        pick = claim.split("CTE due", 1)[1].split("CTE leased", 1)[0]
        assert "Index Scan using intents_due on intents" in pick and "Sort" not in pick, claim
        expired = await plan(SQL["expired_leases"], now, 10)
        recoverable = await plan(SQL["lock_recoverable"], now, 10)
        for found in (expired, recoverable):
            assert "on intent_leases" in found and "intents_pkey on intents" in found, found
        params: list[Any] = [51]  # a listing of a rare status finds its rows through the stored one's index
        listing = await plan(SQL["list_intents"].format(where=where([("status", "in", ["dead"])], params)), *params)
        assert "using intents_status on intents" in listing, listing
        plans = claim + expired + recoverable + listing
        assert "Seq Scan on intents " not in plans, plans
    finally:
        await writer.close()
    claimed = await box.store.claim("w1", now=now, lease_until=now + timedelta(seconds=30), limit=500)
    assert len(claimed) == 100
    assert [i.next_attempt_at for i in claimed] == sorted(i.next_attempt_at for i in claimed)


async def test_the_claim_of_an_ordered_destination_seeks_each_keys_earlier_intents_among_many_rows(box, pg_url):
    writer = await asyncpg.connect(pg_url)
    try:
        await writer.execute("UPDATE destinations SET ordering = 'key' WHERE id = 'billing'")
        await writer.execute("""
            INSERT INTO intents (intent_key, action_id, scope, destination, channel, payload, payload_digest,
                                 status, max_attempts, next_attempt_at, created_at, updated_at, ordering_key)
            SELECT 'acme/' || n, n::text, 'acme', 'billing', 'webhook', '{}', 'sha256:aa',
                   CASE WHEN n % 20 IN (0, 1) THEN 'pending' ELSE 'delivered' END,
                   5, now() - interval '1 hour' + n * interval '1 millisecond', now(), now(), 'k' || n % 1000
            FROM generate_series(1, 20000) AS n""")
        await writer.execute("""
            INSERT INTO intent_leases (intent_seq, destination, lease_owner, lease_expires_at, fence, leased_at)
            SELECT seq, destination, 'w0', now() + interval '1 hour', 1, now() FROM intents
            WHERE action_id::integer % 20 = 1""")
        await writer.execute("ANALYZE intents")
        await writer.execute("ANALYZE intent_leases")
        now = datetime.now(UTC)
        claim = "\n".join(row[0] for row in await writer.fetch(
            "EXPLAIN " + SQL["cycle"], *cycle_arguments([], [], Claim("w1", now, now, 10))))
        pick = claim.split("CTE due", 1)[1].split("CTE leased", 1)[0]
        assert "Index Scan using intents_due on intents due" in pick and "Sort" not in pick, claim
        assert "Index Only Scan using intents_ordering on intents earlier" in pick \
            or "Index Scan using intents_ordering on intents earlier" in pick, claim
        assert "Seq Scan on intents" not in claim, claim
        behind = "\n".join(row[0] for row in await writer.fetch("EXPLAIN " + SQL["waiting_behind"], "acme/20"))
        assert "intents_ordering on intents earlier" in behind and "Seq Scan on intents" not in behind, behind
    finally:
        await writer.close()
    claimed = await box.store.claim("w1", now=now, lease_until=now + timedelta(seconds=30), limit=2000)
    # the 1,000 pending are 20 of each of 50 keys: the first of each is claimed
    assert sorted(i.seq for i in claimed) == list(range(20, 1001, 20))


# -- the moves as sets ------------------------------------------------------------------------

T0 = datetime(2030, 1, 1, 12, tzinfo=UTC)
LEASE = timedelta(seconds=30)


async def leased(box: Outbox, n: int, *, at: datetime = T0) -> list[Intent]:
    """``n`` intents enqueued due at ``at`` and claimed by worker w1 until ``at`` + LEASE."""
    await box.enqueue_many([{"destination": "billing", "scope": "acme", "action_id": f"a{i}", "payload": {"i": i}}
                            for i in range(n)])
    return await box.store.claim("w1", now=at, lease_until=at + LEASE, limit=n)


def start(intent: Intent, at: datetime = T0) -> Start:
    attempt = Attempt(f"{intent.key}-1", 1, intent.fence, "w1", at, None, None, None, None, None, None, None, None)
    return Start(intent.key, intent.fence, attempt, Event(EventKind.ATTEMPT_STARTED, at, "w1"))


def settle(intent: Intent, at: datetime = T0, **changes: Any) -> Settle:
    attempt = Attempt(f"{intent.key}-1", 1, intent.fence, "w1", at, at + timedelta(milliseconds=5),
                      Submission.SUBMITTED, Outcome.DELIVERED, 200, "ok", None, None, 5.0)
    fate = {"status": Status.DELIVERED, "attempts": 1, "attempt": attempt,
            "events": (Event(EventKind.ATTEMPT_FINISHED, at, "w1"), Event(EventKind.DELIVERED, at, "w1")), **changes}
    return Settle(intent.key, intent.fence, **fate)


class Statements:
    """The store's own statements and transaction commands its one pooled connection runs, as
    asyncpg logs them (the driver's introspection of types left out)."""

    def __init__(self) -> None:
        self.sql: list[str] = []

    def __call__(self, record: Any) -> None:
        named = {sql: name for name, sql in SQL.items()}
        if record.query in named or record.query.rstrip(";") in ("BEGIN", "COMMIT"):
            self.sql.append(named.get(record.query, record.query.rstrip(";")))


async def logged_store(url: str) -> tuple[PostgresStore, Statements]:
    store = PostgresStore(url, pool_size=1)
    await store.open()
    statements = Statements()
    async with store._connections.pool.acquire() as conn:
        conn._con.add_query_logger(statements)  # (the connection itself: the pool lends it again)
    return store, statements


async def test_a_cycle_of_starts_settles_and_a_claim_is_one_statement(box, pg_url):
    intents = await leased(box, 8)
    await box.enqueue_many([{"destination": "billing", "scope": "acme", "action_id": f"b{i}", "payload": {}}
                            for i in range(3)])
    store, statements = await logged_store(pg_url)
    try:
        applied = await store.apply([start(i) for i in intents[:4]], claim=Claim("w1", T0, T0 + LEASE, 2))
        assert applied.results == [None] * 4 and len(applied.claimed) == 2
        assert statements.sql == ["cycle"]  # one statement: no transaction around it
        statements.sql.clear()
        later = T0 + timedelta(seconds=1)
        applied = await store.apply([*(settle(i, later) for i in intents[:4]), *(start(i, later) for i in intents[4:])],
                                    claim=Claim("w1", later, later + LEASE, 5))
        assert applied.results == [None] * 8 and len(applied.claimed) == 1
        assert statements.sql == ["cycle"]
        started = await box.store.history(intents[5].key)
        assert started.intent is not None and started.intent.updated_at == intents[5].updated_at  # not written
        assert [(a.number, a.finished_at) for a in started.attempts] == [(1, None)]
        statements.sql.clear()
        await store.apply([settle(i, later) for i in intents[4:]])
        assert statements.sql == ["cycle"]
    finally:
        await store.close()
    history = await box.store.history(intents[0].key)
    assert history.intent is not None and history.intent.status is Status.DELIVERED and history.intent.attempts == 1
    assert [(a.attempt_id, a.outcome, a.finished_at is not None) for a in history.attempts] == [
        (f"{intents[0].key}-1", Outcome.DELIVERED, True)]
    assert [e.kind for e in history.events] == [EventKind.ENQUEUED, EventKind.LEASED, EventKind.ATTEMPT_STARTED,
                                                EventKind.ATTEMPT_FINISHED, EventKind.DELIVERED]


async def test_the_cycles_lease_rule_is_the_one_moves_words(conn):
    """The cycle's start judges a lease running in SQL (``lease_running``), where it locks the row;
    the SQLite store and every refusal's wording judge it with ``moves.lease_running``: the two
    agree at, before and after the instant, and with no end recorded."""
    assert SQL["lease_running"].format(of="lease", at="starting.started_at") in SQL["cycle"]
    judged = SQL["lease_running"].format(of="lease", at="$2")
    for ends in (T0 - timedelta(microseconds=1), T0, T0 + timedelta(microseconds=1), None):
        sql = await conn.fetchval(f"SELECT coalesce({judged}, false) FROM (SELECT $1::timestamptz AS lease_expires_at)"
                                  " AS lease", ends, T0)
        assert sql is moves.lease_running(ends, T0), ends


async def test_the_changes_a_batch_refuses_are_answered_in_place_and_the_rest_commit(box, pg_url):
    intents = await leased(box, 5)
    stale = replace(intents[1], fence=intents[1].fence + 1)
    expired = start(intents[2], T0 + LEASE)  # the lease ends as the attempt would start
    gone = start(replace(intents[3], action_id="nobody"))
    applied = await box.store.apply([start(intents[0]), start(stale), expired, gone,
                                     Cancel(intents[4].key, Status.PENDING, (Event(EventKind.CANCELLED, T0, "op"),))])
    ok, wrong_fence, late, missing, wrong_status = applied.results
    assert ok is None
    assert isinstance(wrong_fence, StaleWrite) and str(wrong_fence) == (
        f"intent {intents[1].key!r} is leased at fence {intents[1].fence}, not leased at fence "
        f"{intents[1].fence + 1}; the write was not applied")
    assert isinstance(late, StaleWrite) and str(late) == (
        f"intent {intents[2].key!r}'s lease ended at {(T0 + LEASE).isoformat()}, before its attempt started at "
        f"{(T0 + LEASE).isoformat()}; the write was not applied")
    assert isinstance(missing, NotFound) and str(missing) == "intent 'acme/nobody' does not exist"
    assert isinstance(wrong_status, StaleWrite) and "is leased at fence 1, not pending" in str(wrong_status)
    for intent, attempts in zip(intents, (1, 0, 0, 0, 0), strict=True):
        history = await box.store.history(intent.key)
        assert len(history.attempts) == attempts and history.intent is not None
        assert history.intent.status is Status.LEASED


async def test_a_key_named_twice_in_a_batch_is_changed_in_turn(box):
    (intent,) = await leased(box, 1)
    applied = await box.store.apply([
        start(intent), settle(intent, status=Status.PENDING, next_attempt_at=T0 + LEASE, events=(
            Event(EventKind.SCHEDULED_RETRY, T0, "w1"),), new_fence=intent.fence + 1),
        Cancel(intent.key, Status.PENDING, (Event(EventKind.CANCELLED, T0, "op"),)),
        Release(intent.key, intent.fence, T0, (Event(EventKind.RELEASED, T0, "w1"),))])
    assert applied.results[:2] == [None, None]
    cancelled = applied.results[2]
    assert isinstance(cancelled, Intent) and cancelled.status is Status.CANCELLED and cancelled.fence == 2
    assert isinstance(applied.results[3], StaleWrite)  # its fence was raised by the settle
    history = await box.store.history(intent.key)
    assert [e.kind for e in history.events][2:] == [EventKind.ATTEMPT_STARTED, EventKind.SCHEDULED_RETRY,
                                                    EventKind.CANCELLED]


async def test_a_change_the_database_refuses_is_answered_alone_and_the_rest_commit(box):
    intents = await leased(box, 3)
    applied = await box.store.apply([settle(intents[0]), settle(intents[1], last_error="nul \x00 byte"),
                                     settle(intents[2])])
    assert applied.results[0] is None and applied.results[2] is None
    assert isinstance(applied.results[1], InvalidInput) and intents[1].key in str(applied.results[1])
    assert [(await box.store.get_intent(i.key)).status for i in intents] == [  # type: ignore[union-attr]
        Status.DELIVERED, Status.LEASED, Status.DELIVERED]


# -- leases apart from the record (intent_leases) ----------------------------------------------


async def waiting_on_a_lock(watch: asyncpg.Connection) -> bool:
    """Whether a backend of this database waits on a lock (a row's, a bucket's)."""
    return bool(await watch.fetchval("SELECT count(*) FROM pg_stat_activity"
                                     " WHERE datname = current_database() AND wait_event_type = 'Lock'"))


async def test_a_cancel_that_waited_on_a_claims_row_lock_finds_its_lease_and_withdraws_nothing(box, pg_url):
    """A claim leases a pending intent without writing its row: a cancel that found it pending and
    waited on the claim's lock of the row decides only once it holds the lock, sees the lease the
    claim committed, and refuses, so an intent being delivered is never withdrawn."""
    await box.enqueue(destination="billing", scope="acme", action_id="a1", payload={})
    claimer, watch = await asyncpg.connect(pg_url), await asyncpg.connect(pg_url)
    try:
        claiming = claimer.transaction()
        await claiming.start()
        rows = await claimer.fetch(SQL["cycle"], *cycle_arguments([], [], Claim("w1", T0, T0 + LEASE, 1)))
        assert [row["action_id"] for row in rows] == ["a1"]
        cancel = asyncio.create_task(box.store.apply([
            Cancel("acme/a1", Status.PENDING, (Event(EventKind.CANCELLED, T0, "op"),))]))
        assert await eventually(lambda: waiting_on_a_lock(watch))
        await claiming.commit()
        (refused,) = (await cancel).results
    finally:
        await claimer.close()
        await watch.close()
    assert isinstance(refused, StaleWrite) and "is leased at fence 1, not pending" in str(refused), refused
    intent = await box.store.get_intent("acme/a1")
    assert intent is not None and (intent.status, intent.lease_owner, intent.fence) == (Status.LEASED, "w1", 1)


async def test_a_claim_takes_again_the_places_of_rows_leased_after_its_snapshot(box, pg_url):
    """A claim locks the rows it picks without writing them, so a row another claimer leased after
    the claim's snapshot is locked all the same and its lease refused by intent_leases' key: the
    claim asks again for that place and returns as many as it could take. Here the claim's
    statement waits on a limited destination's bucket (held by the test) after its snapshot, while
    its oldest due intent is leased behind its back."""
    await box.put_destination("metered", DestinationSpec(url="https://metered.example/hook", secret=SECRET,
                                                         rate_limit=RateLimit(per_second=100, burst=10)))
    await box.enqueue_many([{"destination": d, "scope": "acme", "action_id": a, "payload": {}}
                            for d, a in (("billing", "a0"), ("billing", "a1"), ("metered", "m0"))])
    holder, watch = await asyncpg.connect(pg_url), await asyncpg.connect(pg_url)
    try:
        await holder.execute("UPDATE intents SET next_attempt_at = next_attempt_at - interval '1 hour'"
                             " WHERE action_id = 'a0'")  # the claim's first pick
        await holder.execute("INSERT INTO destination_buckets (destination, tokens, refilled_at)"
                             " VALUES ('metered', 10, now())")
        holding = holder.transaction()
        await holding.start()
        await holder.execute("SELECT 1 FROM destination_buckets WHERE destination = 'metered' FOR UPDATE")
        claim = asyncio.create_task(box.store.claim("w1", now=T0, lease_until=T0 + LEASE, limit=2))
        assert await eventually(lambda: waiting_on_a_lock(watch))
        await watch.execute("""
            WITH taken AS (SELECT * FROM intents WHERE action_id = 'a0' FOR UPDATE)
            INSERT INTO intent_leases (intent_seq, destination, lease_owner, lease_expires_at, fence, leased_at)
            SELECT seq, destination, 'w2', $1, fence + 1, $2 FROM taken""", T0 + LEASE, T0)
        await holding.commit()
        claimed = await claim
    finally:
        await holder.close()
        await watch.close()
    assert sorted(i.action_id for i in claimed) == ["a1", "m0"]
    assert all(i.status is Status.LEASED and i.lease_owner == "w1" for i in claimed)
    a0 = await box.store.get_intent("acme/a0")
    assert a0 is not None and (a0.status, a0.lease_owner) == (Status.LEASED, "w2")


async def test_a_delivery_writes_its_intents_row_once_and_its_lease_row_goes_with_the_settle(box, pg_url):
    """The claim and the start leave the intent's row as enqueued (one row version: its xmin
    unchanged), the heartbeat writes the lease row only, and the settle writes the intent's row
    and deletes the lease; stored, a leased intent is pending at the fence before its lease's."""
    (intent,) = await leased(box, 1)
    watch = await asyncpg.connect(pg_url)
    try:
        async def stored() -> tuple[Any, ...]:
            return tuple(await watch.fetchrow("SELECT xmin::text, status, fence FROM intents WHERE seq = $1",
                                              intent.seq))

        enqueued = await stored()
        assert enqueued[1:] == ("pending", 0) and (intent.status, intent.fence) == (Status.LEASED, 1)
        await box.store.apply([start(intent)])
        assert await box.store.renew_leases([(intent.key, intent.fence)], T0 + 2 * LEASE) == []
        assert await stored() == enqueued
        assert await watch.fetchval("SELECT lease_expires_at FROM intent_leases WHERE intent_seq = $1",
                                    intent.seq) == T0 + 2 * LEASE
        await box.store.apply([settle(intent)])
        assert (await stored())[1:] == ("delivered", 1) and (await stored())[0] != enqueued[0]
        assert await watch.fetchval("SELECT count(*) FROM intent_leases") == 0
    finally:
        await watch.close()


async def test_migration_0023_turns_the_leases_held_into_lease_rows_that_settle_as_before(pg_url):
    """A database at 0022 with an intent leased the old way (its lease in its row): 0023 moves the
    lease into intent_leases, the record reads as before, and the holder's settle at its fence
    applies and ends it."""
    scripts = migrator.scripts_for("postgres")
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute(SQL["create_migrations_table"])
        for m in scripts:
            if m.version < 23:
                await conn.execute(m.script)
                await conn.execute(SQL["record_migration"], m.version, m.name, T0)
        await conn.execute("""
            INSERT INTO destinations (id, channel, secrets, idempotent, retention_seconds, on_unknown, timeout_seconds,
                                      requires_approval, allow_private_network, disabled, created_at, updated_at)
            VALUES ('billing', 'webhook', '{}', false, 0, 'declared', 10, false, false, false, $1, $1)""", T0)
        await conn.execute("""
            INSERT INTO intents (intent_key, action_id, scope, destination, channel, payload, payload_digest, status,
                                 max_attempts, next_attempt_at, created_at, updated_at, lease_owner, lease_expires_at,
                                 fence)
            VALUES ('acme/a1', 'a1', 'acme', 'billing', 'webhook', '{}', 'sha256:aa', 'leased', 5, $1, $1, $2, 'w9',
                    $3, 3),
                   ('acme/a2', 'a2', 'acme', 'billing', 'webhook', '{}', 'sha256:aa', 'pending', 5, $1, $1, $1, NULL,
                    NULL, 0)""", T0 - LEASE, T0, T0 + LEASE)
    finally:
        await conn.close()
    store = PostgresStore(pg_url)
    await store.open()
    try:
        assert await store.migrate() == ["0023_intent_leases"]
        a1, a2 = await store.get_intent("acme/a1"), await store.get_intent("acme/a2")
        assert a1 is not None and a2 is not None
        assert (a1.status, a1.lease_owner, a1.lease_expires_at, a1.fence, a1.updated_at) == (
            Status.LEASED, "w9", T0 + LEASE, 3, T0)
        assert (a2.status, a2.lease_owner, a2.lease_expires_at, a2.fence) == (Status.PENDING, None, None, 0)
        assert [i.key for i in await store.claim("w1", now=T0, lease_until=T0 + LEASE, limit=5)] == ["acme/a2"]
        assert (await store.apply([settle(a1)])).results == [None]
        settled = await store.get_intent("acme/a1")
        assert settled is not None and (settled.status, settled.lease_owner, settled.fence) == (
            Status.DELIVERED, None, 3)
        assert [e.kind for e in (await store.history("acme/a1")).events] == [
            EventKind.LEASED, EventKind.ATTEMPT_FINISHED, EventKind.DELIVERED]
    finally:
        await store.close()


async def test_an_operators_batch_answers_each_intent_as_it_became(box):
    intents = await leased(box, 2)
    await box.store.apply([settle(i, status=Status.DEAD, events=(Event(EventKind.DEAD_LETTERED, T0, "w1"),))
                           for i in intents])
    applied = await box.store.apply([Replay(i.key, Status.DEAD, T0, 9, (Event(EventKind.REPLAYED, T0, "op"),))
                                     for i in intents])
    assert [(r.status, r.max_attempts, r.fence) for r in applied.results] == [  # type: ignore[union-attr]
        (Status.PENDING, 9, 1), (Status.PENDING, 9, 1)]


#: A process that arms crash point mid_group_commit and applies a batch: a start and a settle.
CRASHING_BATCH = """
import asyncio, sys
from outbox import crash
from outbox.store.postgres import PostgresStore
from tests.integration.test_postgres_store import settle, start

async def main(url, started, settled):
    store = PostgresStore(url)
    await store.open()
    crash.arm("mid_group_commit")
    await store.apply([start(await store.get_intent(started)), settle(await store.get_intent(settled))])

asyncio.run(main(*sys.argv[1:]))
"""


async def test_a_batch_cut_after_its_outcomes_are_written_commits_nothing(box, pg_url):
    intents = await leased(box, 2)
    await box.store.apply([start(intents[1])])
    crashed = await asyncio.create_subprocess_exec(sys.executable, "-c", CRASHING_BATCH, pg_url, intents[0].key,
                                                   intents[1].key, cwd=Path(__file__).parents[2])
    assert await crashed.wait() == -signal.SIGKILL
    found = [await box.store.history(i.key) for i in intents]
    assert [(h.intent.status, [a.finished_at for a in h.attempts]) for h in found] == [  # type: ignore[union-attr]
        (Status.LEASED, []), (Status.LEASED, [None])]


async def test_recover_gives_back_expired_leases_without_an_attempt_in_one_go(box):
    intents = await leased(box, 3)
    await box.store.apply([start(intents[0])])
    after = T0 + LEASE
    assert await box.store.recover(after, 10, "sweeper") == 2
    assert await box.store.recover(after, 10, "sweeper") == 0
    found = [await box.store.history(i.key) for i in intents]
    assert [(h.intent.status, h.intent.fence) for h in found] == [  # type: ignore[union-attr]
        (Status.LEASED, 1), (Status.PENDING, 2), (Status.PENDING, 2)]
    event = found[1].events[-1]
    assert (event.kind, event.actor, event.reason, dict(event.data)) == (
        EventKind.LEASE_EXPIRED, "sweeper", "lease of w1 expired before any attempt started",
        {"next_attempt_at": after.isoformat()})


async def test_recover_leaves_an_intent_whose_attempt_start_is_under_way(box, pg_url):
    """A Start holds its intent FOR KEY SHARE from its check until it commits: the sweeper's
    recover skips the intent meanwhile, and sees the attempt once it is in."""
    (intent,) = await leased(box, 1)
    starter = await asyncpg.connect(pg_url)
    try:
        async with starter.transaction():
            await starter.execute("SELECT 1 FROM intents WHERE intent_key = $1 FOR KEY SHARE", intent.key)
            assert await box.store.recover(T0 + LEASE, 10, "sweeper") == 0
            await starter.execute(
                "INSERT INTO attempts (attempt_id, intent_seq, number, fence, worker, started_at) "
                "VALUES ('x', $1, 1, $2, 'w1', $3)", intent.seq, intent.fence, T0)
        assert await box.store.recover(T0 + LEASE, 10, "sweeper") == 0
    finally:
        await starter.close()
    assert (await box.store.get_intent(intent.key)).status is Status.LEASED  # type: ignore[union-attr]


# -- the database's clock ----------------------------------------------------------------------


async def test_a_flow_limited_claim_writes_no_event_row_and_reads_as_the_other_claims_leases(box, pg_url):
    """The flow-limited claim (the function the store creates) records its lease as the other
    claims do: nowhere but its lease row until its attempt starts or its lease ends, and the
    timeline shows it the same."""
    await box.put_destination("metered", DestinationSpec(url="https://metered.example/hook", secret=SECRET,
                                                         rate_limit=RateLimit(per_second=100, burst=10)))
    await box.enqueue_many([{"destination": d, "scope": "acme", "action_id": d, "payload": {}}
                            for d in ("metered", "billing")])
    claimed = await box.store.claim("w1", now=T0 + LEASE, lease_until=T0 + 2 * LEASE, limit=10)
    assert sorted(i.destination for i in claimed) == ["billing", "metered"]
    conn = await asyncpg.connect(pg_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM events WHERE kind = 'leased'") == 0
    finally:
        await conn.close()
    limited, unlimited = [await box.store.history(f"acme/{d}") for d in ("metered", "billing")]
    assert [e.kind for e in limited.events] == [e.kind for e in unlimited.events] == ["enqueued", "leased"]


async def test_migrate_creates_the_stores_functions_from_their_named_sql_and_replaces_an_older_body(box, pg_url):
    """outbox_claim_limited is the store's named SQL (its ordering rule the claims' own), made at
    migrate, not a migration's body: a database whose function another release made gets this
    one's, and an unchanged one is left alone."""
    signature = "outbox_claim_limited(text, timestamptz, timestamptz, integer)"
    script = next(m.script for m in migrator.scripts_for("postgres") if m.name == "0016_bounded_flow")
    conn = await asyncpg.connect(pg_url)
    try:
        made = await conn.fetchval(f"SELECT xmin FROM pg_proc WHERE oid = '{signature}'::regprocedure")
        await box.store.migrate()
        assert await conn.fetchval(f"SELECT xmin FROM pg_proc WHERE oid = '{signature}'::regprocedure") == made
        await conn.execute(f"DROP FUNCTION {signature}")  # (0016's returned intents rows, not records)
        await conn.execute(script)  # the body 0016 made, which writes a "leased" event row
        body = "SELECT pg_get_functiondef(to_regprocedure($1))"  # (by name when it runs: the function is made anew)
        assert "INSERT INTO events" in await conn.fetchval(body, signature)
        await box.store.migrate()
        assert "INSERT INTO events" not in await conn.fetchval(body, signature)
    finally:
        await conn.close()


async def test_an_outbox_on_postgresql_reads_the_databases_clock(box, pg_url):
    offset = await box.store.clock_offset()
    assert abs(offset) < 0.5  # the database runs on this host
    assert isinstance(box.clock, OffsetClock) and abs(box.clock.offset - offset) < 0.5
    manual = ManualClock()
    async with await Outbox.open(pg_url, clock=manual) as given:
        assert given.clock is manual  # a clock given is kept


# -- wake-ups across processes -----------------------------------------------------------------


async def listener_pid(url: str, other_than: int | None = None) -> int:
    """The backend pid of the outbox's listening connection to ``url``, once it listens."""
    name = url.rsplit("/", 1)[1]
    admin = await asyncpg.connect(pg.ADMIN_DSN)
    try:
        async with asyncio.timeout(10):
            while True:
                pid = await admin.fetchval(
                    "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND application_name = $2 "
                    "AND query LIKE 'LISTEN%' AND pid IS DISTINCT FROM $3", name, LISTENER, other_than)
                if pid is not None:
                    return int(pid)
                await asyncio.sleep(0.02)
    finally:
        await admin.close()


async def wakes(box: Outbox, action: Any, timeout: float = 5) -> bool:
    """Whether ``box``'s workers are woken while (or after) ``action`` runs."""
    woken = asyncio.create_task(box.enqueued.wait(timeout))
    await asyncio.sleep(0)  # waiting now
    await action
    return await woken


async def test_an_enqueue_or_a_replay_in_another_process_wakes_the_workers_at_commit(box, pg_url):
    await listener_pid(pg_url)
    other = await open_box(pg_url)
    try:
        assert await wakes(box, other.enqueue(destination="billing", scope="acme", action_id="a1", payload={}))

        async def rolled_back() -> None:
            with pytest.raises(RuntimeError):
                async with other.transaction() as tx:
                    await tx.enqueue(destination="billing", scope="acme", action_id="a2", payload={})
                    raise RuntimeError("undone")

        assert not await wakes(box, rolled_back(), timeout=0.5)  # nothing was made due

        now = other.clock.now()
        (intent,) = await other.store.claim("w1", now=now, lease_until=now + LEASE, limit=1)
        await other.store.apply([Settle(intent.key, intent.fence, Status.DEAD,
                                        (Event(EventKind.DEAD_LETTERED, now, "test"),))])
        assert await wakes(box, replay(other, "a1", Actor("ops", "the receiver is fixed"), scope="acme"))
    finally:
        await other.close()


async def test_the_listener_listens_again_after_its_connection_is_lost(box, pg_url):
    first = await listener_pid(pg_url)
    admin = await asyncpg.connect(pg.ADMIN_DSN)
    try:
        assert await wakes(box, admin.fetchval("SELECT pg_terminate_backend($1)", first))  # woken on listening again
    finally:
        await admin.close()
    await listener_pid(pg_url, other_than=first)
    other = await open_box(pg_url)
    try:
        assert await wakes(box, other.enqueue(destination="billing", scope="acme", payload={}))
    finally:
        await other.close()


async def test_a_worker_delivers_what_another_process_enqueues_without_waiting_for_its_poll(pg_url, receiver):
    receiver.script("/hook", Reply(200))
    settings = Settings(authority="grants", authority_seconds=0, poll_seconds=60)
    sending = await Outbox.open(pg_url, settings=settings)
    try:
        await sending.put_grant("g1", GrantSpec(scope="acme", destination="*"))
        await sending.put_destination("hook", DestinationSpec(
            url=f"{receiver.url}/hook", secret=SECRET, allow_private_network=True, timeout_seconds=2))
        worker = Worker(sending)
        running = asyncio.create_task(worker.run())
        try:
            await listener_pid(pg_url)
            await asyncio.sleep(0.2)  # the worker found nothing due: it waits out its 60 s poll
            producer = await Outbox.open(pg_url)
            try:
                await producer.enqueue(destination="hook", scope="acme", action_id="a1", payload={"n": 1})
            finally:
                await producer.close()
            assert await eventually(lambda: status_is(sending, "a1", Status.DELIVERED), timeout=10)
            assert len(receiver.requests("/hook")) == 1
        finally:
            worker.stop()
            await asyncio.wait_for(running, 10)
    finally:
        await sending.close()


async def status_is(box: Outbox, action_id: str, status: Status) -> bool:
    return (await box.get(action_id, scope="acme")).status is status


# -- the database going away -------------------------------------------------------------------


async def test_an_unreachable_server_is_unavailable():
    with pytest.raises(StoreUnavailable, match="cannot use the PostgreSQL database"):
        await Outbox.open("postgresql://postgres@127.0.0.1:1/outbox")


async def test_a_lost_connection_is_unavailable_and_the_store_goes_on(box):
    with pytest.raises(StoreUnavailable, match="unavailable"):
        async with box.transaction() as tx:
            await tx.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    await box.enqueue(destination="billing", scope="acme", payload={})
    await box.store.ping()


async def test_a_database_that_is_gone_is_unavailable(box, pg_url):
    await pg.drop_database(pg_url)
    with pytest.raises(StoreUnavailable):
        await box.store.ping()
    with pytest.raises(StoreUnavailable):
        await box.enqueue(destination="billing", scope="acme", payload={})


async def test_the_callers_session_settings_do_not_stay_on_the_pooled_connection(pg_url):
    """The caller's SQL in ``transaction()`` runs on a pooled connection; a SET it makes must not
    follow that connection into the store's own work."""
    from outbox.store.postgres import PostgresStore

    store = PostgresStore(pg_url, pool_size=1)  # one connection: the next call gets the same one
    await store.open()
    try:
        await store.migrate()
        async with store.transaction() as tx:
            await tx.execute("SET search_path TO nowhere")
            await tx.execute("SET statement_timeout = '1ms'")
        assert await store.list_destinations() == []
        async with store.transaction() as tx:
            assert (await tx.execute("SHOW search_path"))[0][0] == '"$user", public'
            assert (await tx.execute("SHOW statement_timeout"))[0][0] == "0"
    finally:
        await store.close()


async def test_the_stores_sessions_run_without_jit_also_after_the_callers_sql_reset_them(pg_url):
    """PostgreSQL's JIT compiled the claim once its cost estimate grew with the backlog, so every
    pooled session starts with it off, and one the caller's SQL changed is reset and started
    again with it off, not the server's default."""
    from outbox.store.postgres import PostgresStore

    store = PostgresStore(pg_url, pool_size=1)  # one connection: the next call gets the same one
    await store.open()
    try:
        await store.migrate()
        async with store.transaction() as tx:
            assert (await tx.execute("SHOW jit"))[0][0] == "off"
            await tx.execute("SET jit = on")
        async with store.transaction() as tx:
            assert (await tx.execute("SHOW jit"))[0][0] == "off"
    finally:
        await store.close()


async def test_a_session_the_store_cannot_reset_is_dropped_not_given_back(pg_url, monkeypatch):
    """The reset after the caller's block can fail (a statement_timeout the caller set cuts it
    short, on a loaded server): that connection must not go back to the pool with the caller's
    settings on it; the store's next work gets a fresh one."""
    from outbox.store.postgres import PostgresStore

    store = PostgresStore(pg_url, pool_size=1)
    await store.open()
    try:
        await store.migrate()
        async def reset(*args: object, **kwargs: object) -> None:
            raise asyncpg.QueryCanceledError("canceling statement due to statement timeout")

        async with store.transaction() as tx:
            await tx.execute("SET search_path TO nowhere")
            monkeypatch.setattr(asyncpg.Connection, "reset", reset)  # the precise fault: the reset itself fails
        monkeypatch.undo()
        assert await store.list_destinations() == []
    finally:
        await store.close()


class _Proxy:
    """A TCP relay to the test server that can go silent (connections stay open, nothing moves)
    or pass on the server's closing of a connection ``hold_close`` seconds late, as a network
    may: the client has the server's last words (its goodbye) that long before it learns the
    connection is gone. ``closed`` is set whenever the server closes one."""

    def __init__(self, host: str, port: int, *, hold_close: float | None = None) -> None:
        self.target = (host, port)
        self.silent = False
        self.hold_close = hold_close
        self.closed = asyncio.Event()
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            while data := await source.read(65536):
                while self.silent:
                    await asyncio.sleep(0.05)
                sink.write(data)
                await sink.drain()

        async def downstream() -> None:
            await pipe(upstream_reader, writer)
            if self.hold_close is not None:  # the server closed it: everything it said is passed on
                self.closed.set()
                await asyncio.sleep(self.hold_close)
                writer.close()

        await asyncio.gather(pipe(reader, upstream_writer), downstream(), return_exceptions=True)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


async def test_a_database_that_goes_silent_is_unavailable_within_the_statement_limit(pg_url):
    """A network that stops carrying packets (no reset, no error) answers StoreUnavailable after
    the statement limit, not after the many minutes a kernel takes to give up on a connection."""
    from urllib.parse import urlsplit, urlunsplit

    from outbox import StoreUnavailable
    from outbox.store.postgres import PostgresStore

    parts = urlsplit(pg_url)
    proxy = _Proxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    port = await proxy.start()
    store = PostgresStore(urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{port}")),
                          pool_size=1, statement_seconds=1.0)
    await store.open()
    try:
        await store.migrate()
        assert await store.next_due_at() is None
        proxy.silent = True
        with pytest.raises(StoreUnavailable):  # (without the limit: the wait_for's TimeoutError)
            await asyncio.wait_for(store.next_due_at(), 20)
    finally:
        proxy.silent = False
        await asyncio.wait_for(store.close(), 10)
        proxy.close()


async def test_a_connection_the_server_ended_while_idle_is_never_given_the_next_work(pg_url):
    """The server ends an idle pooled connection's session (pg_terminate_backend) and its goodbye
    arrives before the close: asyncpg reads it as an operation under way until the close comes,
    and refuses a statement in between ("cannot switch to state 12; another operation (2) is in
    progress"). The store's next work, a statement or a transaction, must not fail on that
    connection, nor cost the pool its only place: it runs on a new one. A block of the caller's,
    which cannot be run again, is told the store was unavailable and that nothing of it took effect."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(pg_url)
    proxy = _Proxy(parts.hostname or "127.0.0.1", parts.port or 5432, hold_close=2.0)
    port = await proxy.start()
    url = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{port}", query="application_name=cut"))
    store = PostgresStore(url, pool_size=1, statement_seconds=5.0)  # one connection: the next work meets it
    await store.open()
    box = Outbox(store)
    admin = await asyncpg.connect(pg_url)
    try:
        await store.migrate()
        await unlock(store, Settings(secrets_key_file=pg.key_file()))  # as Outbox.open gives the store its keyring
        await box.put_destination("billing", DestinationSpec(url="https://billing.example/hook", secret=SECRET))

        async def cut() -> None:
            """End the pooled connection's session; return once its goodbye has reached the store."""
            proxy.closed.clear()
            (pid,) = [row[0] for row in await admin.fetch(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'cut' AND state = 'idle'")]
            assert await admin.fetchval("SELECT pg_terminate_backend($1, 5000)", pid)  # (waits for its end)
            await asyncio.wait_for(proxy.closed.wait(), 5)
            await asyncio.sleep(0.1)  # the store's loop reads the goodbye; the close is held 2 s

        await cut()
        assert await store.next_due_at() is None  # a statement
        await cut()
        assert (await box.enqueue(destination="billing", scope="acme", action_id="a-1", payload={})).created
        await cut()
        with pytest.raises(StoreUnavailable, match="had ended the connection"):  # a block of the caller's
            async with box.transaction() as tx:  # cannot run again: it is told, in the outbox's words
                await tx.execute("SELECT 1")
        assert [intent.action_id for intent in await store.intents_named("a-1")] == ["a-1"]
    finally:
        await admin.close()
        await asyncio.wait_for(store.close(), 10)
        proxy.close()


async def test_a_driver_fault_on_a_live_connection_is_not_called_unavailable(box, monkeypatch):
    """Only work refused because the session had ended is "not now" (StoreUnavailable, a 503);
    a fault of the driver on a connection still open has an unknown effect and goes through as
    it is, to be seen. The precise fault (asyncpg's InternalClientError on a live connection) no
    server can cause is injected into the driver for one statement."""
    async def faulty(*_: Any, **__: Any) -> list[Any]:
        raise asyncpg.InternalClientError("injected: the driver lost track of the protocol")

    async with box.transaction() as tx:
        with monkeypatch.context() as patch:
            patch.setattr(asyncpg.connection.Connection, "fetch", faulty)
            with pytest.raises(asyncpg.InternalClientError, match="injected"):
                await tx.execute("SELECT 1")


async def test_a_statement_cancelled_or_past_the_limit_leaves_its_connection_to_no_other_work(pg_url):
    """A task cancelled in the middle of a statement, or a statement past the limit, leaves the
    server still running it until asyncpg's cancel request lands; the store's one connection goes
    to no other work before that (no "another operation is in progress"), then serves again."""
    store = PostgresStore(pg_url, pool_size=1, statement_seconds=1.0)
    await store.open()
    admin = await asyncpg.connect(pg_url)
    try:
        await store.migrate()
        async with admin.transaction():
            await admin.execute("LOCK TABLE destinations IN ACCESS EXCLUSIVE MODE")
            reading = asyncio.create_task(store.list_destinations())  # waits for the lock, on the server

            async def waiting() -> bool:
                return bool(await admin.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"))

            assert await eventually(waiting)
            reading.cancel()
            with pytest.raises(asyncio.CancelledError):
                await reading
            with pytest.raises(StoreUnavailable, match="unavailable"):  # the limit: asyncpg's TimeoutError
                await store.list_destinations()
        assert await store.list_destinations() == []
        assert await asyncio.gather(*(store.next_due_at() for _ in range(20))) == [None] * 20
    finally:
        await admin.close()
        await store.close()


async def test_a_write_of_secrets_waits_for_a_rotation_under_way_and_seals_under_its_key(pg_url, tmp_path):
    """A rotation holds the database's sealing key locked until it commits; a process writing a
    destination meanwhile waits, then seals under the new key, so nothing is left sealed under
    the key the rotation retires."""
    key_file = tmp_path / "secrets.key"
    key_file.write_text(generate_key() + "\n")
    async with await Outbox.open(pg_url, settings=Settings(secrets_key_file=key_file)) as box:
        await box.put_destination("hook", DestinationSpec(url="https://hook.example/", secret=SECRET))
        new = generate_key()
        key_file.write_text(new + "\n" + key_file.read_text())
        rotation = await asyncpg.connect(pg_url)
        try:
            under_way = rotation.transaction()
            await under_way.start()
            await rotation.execute(SQL["lock_sealing_key"])
            await rotation.execute(SQL["set_sealing_key"], key_id(base64.b64decode(new)))
            write = asyncio.create_task(box.put_destination(
                "other", DestinationSpec(url="https://other.example/", secret=SECRET)))
            await asyncio.sleep(0.5)
            assert not write.done(), "the write waits for the rotation"
            await under_way.commit()
            await write
            sealed = await rotation.fetchval("SELECT secrets->>'key' FROM destinations WHERE id = 'other'")
        finally:
            await rotation.close()
        assert sealed == key_id(base64.b64decode(new))
        assert (await box.get_destination("other")).secrets == (SECRET,)


async def test_a_rotation_waits_for_a_write_of_secrets_under_way_and_seals_it_too(pg_url, tmp_path):
    """The other order: a destination being written (its secrets sealed under the current key, not
    yet committed) holds the sealing key shared, so a rotation waits for it, then seals it again."""
    key_file = tmp_path / "secrets.key"
    key_file.write_text(generate_key() + "\n")
    async with await Outbox.open(pg_url, settings=Settings(secrets_key_file=key_file)) as box:
        await box.put_destination("hook", DestinationSpec(url="https://hook.example/", secret=SECRET))
        writer = await asyncpg.connect(pg_url)
        try:
            under_way = writer.transaction()  # put_destination's statements, stopped before its commit
            await under_way.start()
            key = await writer.fetchval(SQL["share_sealing_key"])
            other = replace(await box.store.get_destination("hook"), id="other",
                            settings={"url": "https://other.example/"})
            written = box.store.keyring.seal([SECRET], destination_id="other", key=key)
            await writer.execute(SQL["put_destination"], *destination_values(other, written))
            key_file.write_text(generate_key() + "\n" + key_file.read_text())
            rotation = asyncio.create_task(rotate(box.store))
            await asyncio.sleep(0.5)
            assert not rotation.done(), "the rotation waits for the write"
            await under_way.commit()
            done = await rotation
            sealed = {row[0] for row in await writer.fetch("SELECT secrets->>'key' FROM destinations")}
        finally:
            await writer.close()
        assert done.resealed == 2 and sealed == {done.key}
        assert (await box.get_destination("other")).secrets == (SECRET,)


# -- the last admin token ---------------------------------------------------------------------


async def test_revocations_of_the_last_two_admins_held_back_together_cannot_both_pass(box, pg_url):
    """Both revocations start while another transaction holds the admin rows, so each begins
    seeing the other admin active (a statement that only counts would let both through); the
    revocation locks those rows before counting, so the second counts again after the first."""
    for _ in range(2):
        await box.create_token(Role.ADMIN)
    ids = [info.id for info in await box.list_tokens()]
    holder, watcher = await asyncpg.connect(pg_url), await asyncpg.connect(pg_url)
    try:
        held = holder.transaction()
        await held.start()
        await holder.execute("SELECT id FROM tokens WHERE role = 'admin' FOR UPDATE")
        revocations = [asyncio.create_task(box.revoke_token(token_id)) for token_id in ids]

        async def both_wait() -> bool:  # asked outside a transaction: pg_stat_activity is read afresh
            waiting = await watcher.fetchval("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                             "AND datname = current_database()")
            return waiting == 2

        assert await eventually(both_wait, timeout=10), "the revocations never waited for the held rows"
        await held.commit()
        results = await asyncio.gather(*revocations, return_exceptions=True)
    finally:
        await holder.close()
        await watcher.close()
    assert sorted(type(r).__name__ for r in results) == ["LastAdmin", "TokenInfo"], results
    assert await box.store.count_active_tokens("admin") == 1


# -- the hot path's schema ----------------------------------------------------------------------

#: The attempt columns an attempt's finish sets (the settle's outcome).
FINISH = {"finished_at", "submission", "outcome", "status_code", "reply", "external_id", "error", "duration_ms",
          "stage", "events"}


async def test_no_index_names_a_column_an_attempts_finish_sets_so_the_finish_can_be_hot(box, pg_url):
    conn = await asyncpg.connect(pg_url)
    try:
        named = await conn.fetch(
            "SELECT i.indexrelid::regclass::text AS index, a.attname FROM pg_index i "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND (a.attnum = ANY (i.indkey) OR pg_get_expr(i.indpred, i.indrelid) ~ ('\\m' || a.attname || '\\M')) "
            "WHERE i.indrelid = 'attempts'::regclass")
        options = await conn.fetchval("SELECT reloptions FROM pg_class WHERE relname = 'attempts'")
    finally:
        await conn.close()
    assert {row["attname"] for row in named} & FINISH == set(), [tuple(row) for row in named]
    assert "attempts_started" in {row["index"] for row in named}  # what the console's activity seeks
    assert options == ["fillfactor=50"]  # room on the page for the finished version of the row (0019: with its events)


async def test_a_claimed_record_has_the_views_columns_in_the_views_order(box, pg_url):
    """The claim returns its records as ``leased_record`` builds them, beside rows of
    ``intent_records`` that a UNION ALL matches by position: the two column lists must name the
    same columns with the same types in the same order, or a column added to one reads as another."""
    conn = await asyncpg.connect(pg_url)
    try:
        view = await conn.prepare("SELECT * FROM intent_records LIMIT 0")
        leased = await conn.prepare(
            f"SELECT {SQL['leased_record'].format(of='due', lease='leased')} "
            "FROM intents AS due JOIN intent_leases AS leased ON leased.intent_seq = due.seq LIMIT 0")

        def columns(statement: Any) -> list[tuple[str, str]]:
            return [(a.name, a.type.name) for a in statement.get_attributes()]

        assert columns(leased) == columns(view)
    finally:
        await conn.close()
