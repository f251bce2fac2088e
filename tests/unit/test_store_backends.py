"""Which store a database URL opens, the capabilities each declares, what a SQLite-only process
leaves unimported, the caller's own connection, which only the PostgreSQL store takes, and the
dialects' migrations, which name the same versions."""

from __future__ import annotations

import subprocess
import sys

import pytest

from outbox.store import SharesClock, SqliteStore, SupportsListener, store_for_url
from outbox.store.migrator import scripts_for


@pytest.mark.parametrize("url", ["postgresql://outbox@db.internal:5432/outbox", "postgres://outbox@db/outbox"])
def test_postgresql_urls_open_the_postgresql_store_without_connecting(url):
    from outbox.store.postgres import PostgresStore

    store = store_for_url(url)
    assert isinstance(store, PostgresStore) and store.dialect == "postgres" and store.dsn == url


def test_both_stores_declare_a_listener_and_only_the_shared_one_a_clock(tmp_path):
    """``Outbox.open`` follows a store's clock and wake-ups by the capabilities it declares: the
    PostgreSQL store has both; the embedded SQLite store (one host) tells of commits by other
    connections to its file, and keeps the host's clock."""
    from outbox.store.postgres import PostgresStore

    shared = PostgresStore("postgresql://outbox@db/outbox")
    assert isinstance(shared, SupportsListener) and isinstance(shared, SharesClock)
    embedded = SqliteStore(tmp_path / "outbox.db")
    assert isinstance(embedded, SupportsListener) and not isinstance(embedded, SharesClock)


def test_a_sqlite_process_never_imports_asyncpg(tmp_path):
    """The PostgreSQL driver is imported with the PostgreSQL store only, which a SQLite URL never
    names: an outbox on SQLite runs (and installs nothing else to run) without it."""
    script = f"""
import asyncio, sys
from outbox import Outbox
import outbox.app.api, outbox.app.cli, outbox.app.service, sender

async def main():
    async with await Outbox.open("sqlite:///{tmp_path}/outbox.db") as box:
        async with box.transaction() as tx:
            await tx.execute("SELECT 1")

asyncio.run(main())
assert "asyncpg" not in sys.modules, "asyncpg was imported"
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_every_schema_version_has_a_script_in_every_dialect():
    """A version names one schema in both dialects: a change written for one is written for the
    other under the same number and name (else one dialect's schema_migrations reads otherwise)."""
    assert [(m.version, m.name) for m in scripts_for("postgres")] == [
        (m.version, m.name) for m in scripts_for("sqlite")]
