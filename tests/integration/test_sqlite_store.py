"""What only the SQLite backend can show: its pragmas, migrations, query plans and faults."""

from __future__ import annotations

import asyncio
import json
import secrets
import sqlite3
from dataclasses import replace
from datetime import timedelta

import pytest

from outbox import (
    Attempt,
    DestinationSpec,
    Event,
    IntentQuery,
    Outbox,
    Outcome,
    SchemaTooNew,
    Settings,
    Status,
    StoreUnavailable,
    Submission,
)
from outbox.digest import digest_of
from outbox.model import EventKind, Settle, Start
from outbox.store import migrator, store_for_url
from outbox.store.protocol import Claim
from outbox.store.sqlite import store as dialect
from receivers import verify_signature
from sender import Worker

from ..conftest import snapshot
from ..receiver import Reply
from .conftest import SECRET, SECRET_NEW


async def test_connections_are_wal_with_full_sync(box: Outbox):
    def pragmas(conn: sqlite3.Connection) -> tuple:
        return (conn.execute("PRAGMA journal_mode").fetchone()[0],
                conn.execute("PRAGMA synchronous").fetchone()[0])

    assert await box.store._write(pragmas) == ("wal", 2)  # 2 = FULL


async def test_migrations_are_recorded_and_reapplied_never(db_path, db_url):
    async with await Outbox.open(db_url):
        pass
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT version, name FROM schema_migrations").fetchall() == [
            (1, "0001_initial"), (2, "0002_sender"), (3, "0003_reconcile"), (4, "0004_operators"),
            (5, "0005_scoped_action_ids"), (6, "0006_channel_settings"), (7, "0007_attempt_stage"),
            (8, "0008_ordering"), (9, "0009_activity"), (10, "0010_secrets_key"),
            (11, "0011_hot_path"), (12, "0012_events"), (13, "0013_flow_control"),
            (14, "0014_retry_schedule"), (15, "0015_trace_context"), (16, "0016_bounded_flow"),
            (17, "0017_console_sessions"), (18, "0018_shared_payloads"), (19, "0019_attempt_history"),
            (21, "0021_tenant_destinations"), (22, "0022_portal_links"), (23, "0023_intent_leases")]
    async with await Outbox.open(db_url) as box:
        assert await box.store.migrate() == []


async def test_a_database_from_a_newer_release_is_refused(db_path, db_url):
    async with await Outbox.open(db_url):
        pass
    with sqlite3.connect(db_path) as conn:
        conn.execute("INSERT INTO schema_migrations VALUES (99, '0099_future', 0)")
    with pytest.raises(SchemaTooNew, match="version 99"):
        await Outbox.open(db_url)


async def test_the_claim_and_expired_lease_lookups_use_their_partial_indexes(box: Outbox):
    from outbox.store.sqlite import SQL

    def plan(conn: sqlite3.Connection, name: str) -> str:
        return " ".join(row[-1] for row in conn.execute("EXPLAIN QUERY PLAN " + SQL[name], (0, 10)))

    for name, index in (("due_seqs", "intents_due"), ("expired_leases", "intents_lease")):
        used = await box.store._read(plan, name)
        assert index in used and "SCAN intents" not in used and "TEMP B-TREE" not in used, used


async def test_the_claim_asks_whether_an_earlier_intent_of_a_key_is_in_the_way_with_one_index_seek(box: Outbox):
    from outbox.store.sqlite import SQL

    def plan(conn: sqlite3.Connection, name: str, *args: object) -> list[str]:
        return [row[-1] for row in conn.execute("EXPLAIN QUERY PLAN " + SQL[name], args)]

    claim = await box.store._read(plan, "due_seqs", 0, 10)
    assert "SEARCH earlier USING INDEX intents_ordering (destination=? AND ordering_key=? AND seq<?)" in claim, claim
    behind = await box.store._read(plan, "waiting_behind", "acme/a1")
    assert "SEARCH earlier USING INDEX intents_ordering (destination=? AND ordering_key=? AND seq<?)" in behind, behind
    tables = [step for step in claim + behind if step.startswith("SCAN") and "subquery" not in step]
    assert not tables and not any("TEMP B-TREE" in step for step in claim + behind), claim + behind


async def test_the_moves_find_their_intents_by_seq_and_recovery_its_leases_by_index(box: Outbox):
    from outbox.store.sqlite import SQL

    def plan(conn: sqlite3.Connection, name: str, *args: object) -> list[str]:
        return [row[-1] for row in conn.execute("EXPLAIN QUERY PLAN " + SQL[name], args)]

    for move in ("settle", "release", "hold", "replay", "resolve", "cancel", "approve", "reject"):
        # the operators' moves answer with their intents, each one's event's payload found by its seq
        answered = ["CORRELATED SCALAR SUBQUERY 1", "SEARCH shared USING INTEGER PRIMARY KEY (rowid=?)"]
        assert await box.store._read(plan, move, "[]") == [
            "SCAN u VIRTUAL TABLE INDEX 1:", "SEARCH intents USING INTEGER PRIMARY KEY (rowid=?)",
            *(answered if move in ("replay", "resolve", "cancel", "approve", "reject") else [])], move
    recoverable = await box.store._read(plan, "recoverable", 0, 10)
    assert "SEARCH i USING INDEX intents_lease (lease_expires_at<?)" in recoverable, recoverable
    assert not [step for step in recoverable if step.startswith("SCAN") and "subquery" not in step], recoverable


async def test_a_batch_of_changes_is_the_same_few_statements_whatever_its_size(box: Outbox):
    await box.enqueue_many([{"scope": "acme", "action_id": f"s{i}", "destination": "billing", "payload": {"n": i}}
                           for i in range(42)])
    now = box.clock.now() + timedelta(seconds=1)
    lease = now + timedelta(minutes=1)
    statements: list[str] = []

    async def deliver(size: int) -> int:
        """Start and settle ``size`` claimed intents (claiming one more with the settles); the
        statements it took, but the attempts' (``put_attempts`` binds each attempt's values in turn,
        with no JSON to build and take apart)."""
        claimed = await box.store.claim("w1", now=now, lease_until=lease, limit=size)
        tried = {i.key: Attempt(i.key, 1, i.fence, "w1", now, None, None, None, None, None, None, None, None)
                 for i in claimed}
        starts = [Start(i.key, i.fence, tried[i.key], Event(EventKind.ATTEMPT_STARTED, now, "w1")) for i in claimed]
        settles = [Settle(i.key, i.fence, Status.DELIVERED, (Event(EventKind.DELIVERED, now, "w1"),), attempts=1,
                          attempt=replace(tried[i.key], finished_at=now, submission=Submission.SUBMITTED,
                                          outcome=Outcome.DELIVERED)) for i in claimed]
        await box.store._write(lambda conn: conn.set_trace_callback(statements.append))
        try:
            statements.clear()
            assert (await box.store.apply(starts)).results == [None] * size
            applied = await box.store.apply(settles, claim=Claim("w1", now, lease, 1))
            assert applied.results == [None] * size and len(applied.claimed) == 1
        finally:
            await box.store._write(lambda conn: conn.set_trace_callback(None))
        attempts = [sql for sql in statements if "INSERT INTO attempts" in sql]
        assert len(attempts) == 2 * size  # the one attempts statement, run once per row it is bound to
        # (BEGIN and COMMIT left out: the writer may join the trace's own call above to a
        # transaction of the applies or begin one for it, as the machine's timing has it; so is
        # the watch for other processes' writes, PRAGMA data_version, which runs on the writer's
        # connection every WATCH_SECONDS, whenever that falls)
        control = [sql for sql in statements if sql in ("BEGIN IMMEDIATE", "COMMIT", "PRAGMA data_version")]
        return len(statements) - len(attempts) - len(control)

    assert await deliver(1) == await deliver(39)
    page = await box.store.list_intents(IntentQuery(statuses=[Status.DELIVERED], limit=50))
    assert len(page.intents) == 40


async def test_an_acknowledged_enqueue_is_there_after_reopening(db_url):
    box = await Outbox.open(db_url)
    await box.put_destination("billing", __import__("outbox").DestinationSpec(
        url="https://b.example/", secret="whsec_" + "A" * 44))
    result = await box.enqueue(destination="billing", scope="acme", payload={"n": 1})
    await box.close()
    async with await Outbox.open(db_url) as again:
        assert (await again.get(result.intent.action_id)).payload == {"n": 1}


async def test_a_read_that_fails_part_way_through_its_rows_keeps_no_snapshot(db_path, box: Outbox):
    """A listing that fails on one row (here an intent written by hand with a status no release
    has) stopped its cursor part way through its rows, and that statement kept the reader
    connection's snapshot open for as long as the exception lived, which the error handling
    around a request keeps until a garbage collection: every later read in the process saw
    nothing written since (the intent just enqueued was not found, its delivery never seen) and
    the WAL could not be checkpointed past it."""
    for action_id in ("a1", "a2"):
        await box.enqueue(destination="billing", scope="acme", action_id=action_id, payload={})
    with sqlite3.connect(db_path) as conn:
        conn.execute("UPDATE intents SET status = 'sideways' WHERE action_id = 'a2'")  # (listed first)
    conn.close()
    with pytest.raises(ValueError, match="'sideways' is not a valid Status") as failed:
        await box.list_intents(IntentQuery())
    kept = failed.value  # (as the server's error handling keeps it, with its traceback)

    await box.enqueue(destination="billing", scope="acme", action_id="a3", payload={})
    assert (await box.get("a3")).action_id == "a3"
    assert kept.__traceback__ is not None  # the traceback still says where it failed


async def test_a_locked_database_is_unavailable_and_the_write_is_not_applied(db_path, db_url, box):
    other = await Outbox.open(db_url, settings=Settings(sqlite_busy_timeout_ms=50))
    before = snapshot(db_path)
    locker = sqlite3.connect(db_path, isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StoreUnavailable, match="locked"):
            await other.enqueue(destination="billing", scope="acme", payload={"n": 1})
    finally:
        locker.execute("ROLLBACK")
        locker.close()
        await other.close()
    assert snapshot(db_path) == before


async def test_a_full_database_is_unavailable_and_other_writes_survive(db_path, box):
    await box.enqueue(destination="billing", scope="acme", payload={"n": 0})
    before = snapshot(db_path)
    # Fault injection: cap the file at its current size so the next big write hits SQLITE_FULL.
    await box.store._write(lambda conn: conn.execute(
        "PRAGMA max_page_count = " + str(conn.execute("PRAGMA page_count").fetchone()[0])))
    with pytest.raises(StoreUnavailable, match="full"):
        await box.enqueue(destination="billing", scope="acme", payload={"blob": "x" * 200_000})
    assert snapshot(db_path) == before


async def test_enqueue_beside_an_open_transaction_is_refused_instead_of_deadlocking(box):
    async with box.transaction() as tx:
        with pytest.raises(RuntimeError, match="tx.enqueue"):
            await asyncio.wait_for(
                box.enqueue(destination="billing", scope="acme", payload={}), timeout=2)
        await tx.enqueue(destination="billing", scope="acme", payload={"ok": True})
    assert len((await box.list_intents(IntentQuery(statuses=[Status.PENDING]))).intents) == 1


def test_database_urls_are_checked():
    from outbox import InvalidInput

    with pytest.raises(InvalidInput, match="sqlite:///"):
        store_for_url("sqlite://host/x.db")
    with pytest.raises(InvalidInput, match="unsupported scheme"):
        store_for_url("mysql://x")


async def test_a_new_database_and_its_wal_files_are_readable_by_their_owner_only(db_path, db_url):
    """The file holds payloads and signing secrets: no other local user may read it."""
    async with await Outbox.open(db_url) as box:
        await box.list_intents(IntentQuery())
        files = [db_path, db_path.with_name(db_path.name + "-wal"), db_path.with_name(db_path.name + "-shm")]
        assert all(f.exists() for f in files)
        assert {oct(f.stat().st_mode & 0o777) for f in files} == {"0o600"}


async def test_the_receivers_record_database_is_readable_by_its_owner_only(tmp_path):
    from receivers import SqliteRecordStore

    store = SqliteRecordStore(tmp_path / "idempotency.db")
    await store.open()
    try:
        assert oct((tmp_path / "idempotency.db").stat().st_mode & 0o777) == "0o600"
    finally:
        await store.close()


async def test_a_database_of_the_previous_migrations_migrates_with_nothing_lost_and_still_delivers(
        tmp_path, monkeypatch, receiver):
    """Migration 0006 moves the webhook columns into the channel settings: a destination (its
    secrets mid-rotation included) and an intent written under 0001-0005 come through it, and
    the intent is delivered, signed with both secrets."""
    db = tmp_path / "old.db"
    at = 1_700_000_000_000_000  # microseconds, as the tables store times
    receiver.script("/hook", Reply(200, headers={"External-Id": "rcpt-1"}))
    with monkeypatch.context() as patched:
        previous = [m for m in migrator.scripts_for("sqlite") if m.version <= 5]
        patched.setattr(dialect, "scripts_for", lambda name: previous)
        old = store_for_url(f"sqlite:///{db}")  # as that release made it (today's outbox needs today's schema)
        await old.open()
        await old.migrate()
        await old.close()
        with sqlite3.connect(db) as conn:
            conn.execute(
                "INSERT INTO destinations (id, channel, url, secrets, idempotent, retention_seconds, on_unknown,"
                " timeout_seconds, requires_approval, allow_private_network, disabled, created_at, updated_at,"
                " reconcile) VALUES ('hook', 'webhook', ?, ?, 1, 3600, 'never', 2.5, 0, 1, 0, ?, ?, 1)",
                (f"{receiver.url}/hook", json.dumps([SECRET_NEW, SECRET]), at, at))
            conn.execute("INSERT INTO grants (id, scope, destination, revision, created_at, updated_at)"
                         " VALUES ('g1', 'acme', 'hook', 1, ?, ?)", (at, at))
            # written as that release wrote it (today's enqueue writes columns added since)
            conn.execute(
                "INSERT INTO intents (intent_key, action_id, scope, destination, channel, payload, payload_digest,"
                " status, max_attempts, next_attempt_at, created_at, updated_at) VALUES ('acme/old-1', 'old-1',"
                " 'acme', 'hook', 'webhook', ?, ?, 'pending', 5, ?, ?, ?)",
                ('{"n":1}', digest_of(b'{"n":1}'), at, at, at))
        conn.close()
    with sqlite3.connect(db) as conn:
        assert "url" in {row[1] for row in conn.execute("PRAGMA table_info(destinations)")}
    conn.close()

    async with await Outbox.open(f"sqlite:///{db}", settings=Settings(authority="grants", poll_seconds=0.05)) as box:
        moved = await box.get_destination("hook")
        assert (moved.channel, dict(moved.settings), moved.secrets) == (
            "webhook", {"url": f"{receiver.url}/hook"}, (SECRET_NEW, SECRET))
        assert (moved.idempotent, moved.retention_seconds, moved.on_unknown.value, moved.timeout_seconds,
                moved.allow_private_network, moved.reconcile, moved.created_at.timestamp()) == (
            True, 3600, "never", 2.5, True, True, at / 1e6)
        worker = Worker(box)
        running = asyncio.create_task(worker.run())
        delivered = await box.wait("old-1", timeout=10)
        worker.stop()
        await running
    assert delivered.status is Status.DELIVERED
    [request] = receiver.requests("/hook")
    assert request.headers["webhook-id"] == "acme/old-1" and request.json() == {"n": 1}
    for secret in (SECRET, SECRET_NEW):  # the receiver may hold either while the rotation lasts
        verify_signature(secret, request.headers, request.body)


async def test_sealing_overwrites_the_plain_secrets_it_replaces_in_the_file(db_path, db_url, monkeypatch):
    """Sealing plain secrets (an older release's) leaves none of them in the database file, even
    where the SQLite build does not overwrite deleted content by default: rows with overflow pages,
    the connection's secure_delete off as some builds have it."""
    monkeypatch.delenv("OUTBOX_SECRETS_KEY_FILE", raising=False)
    passwords = [secrets.token_hex(500) for _ in range(9)]
    async with await Outbox.open(db_url) as box:
        store = box.store
        for n in range(3):
            await box.put_destination(f"mail-{n}", DestinationSpec.model_validate({
                "channel": "email", "host": "mail.example.com", "username": "outbox", "secret": "x",
                "from": "outbox@example.com"}))
            plain = json.dumps(passwords[3 * n:3 * n + 3])
            await store._write(lambda conn, n=n, plain=plain: conn.execute(
                "UPDATE destinations SET secrets = ? WHERE id = ?", (plain, f"mail-{n}")))
        await store._write(lambda conn: conn.execute("DELETE FROM secrets_key"))
        await store._write(lambda conn: conn.execute("PRAGMA secure_delete = OFF"))
        assert await store.reseal_secrets(store.keyring.primary, plain_only=True) == 3
        files = b"".join(p.read_bytes() for p in db_path.parent.glob(db_path.name + "*"))
        assert [p for p in passwords if p.encode() in files] == []
        assert [d.secrets for d in await box.list_destinations()] == [
            tuple(passwords[3 * n:3 * n + 3]) for n in range(3)]
