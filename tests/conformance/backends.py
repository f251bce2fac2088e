"""The backends the store conformance suite (``test_store.py``) runs against.

A new backend joins by appending an async factory to STORE_FACTORIES and its dialect's caller
SQL to CALLER_SQL; the suite's tests stay as they are.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from outbox.keyring import Keyring, generate_key
from outbox.store import SqliteStore, Store

from .. import pg

#: Makes a fresh, empty, unopened store with a keyring of its own; ``directory`` is a new empty
#: directory it may use. Its ``__name__`` names the backend in test ids.
StoreFactory = Callable[[Path], Awaitable[Store]]


@dataclass(frozen=True, slots=True)
class CallerSql:
    """An application's own statements in one dialect, run through ``Store.transaction()``."""

    create: str  # creates the table ``orders (id, total)``
    insert: str  # inserts one order; two parameters: id, total
    count: str  # counts the orders
    #: Times no datetime can hold, written by hand: an intent's (its action id, the parameter)
    #: expires_at before year 1 UTC, its next_attempt_at after 9999 or as late as the store can
    #: hold, and grant g1's expires_at as early as the store can hold.
    before_year_1: str
    after_year_9999: str
    latest: str
    grant_earliest: str
    #: Values the API refuses, written by hand into destination ``edge``'s row and bucket: its
    #: pause as late as the store can hold, and its bucket's count at minus infinity.
    edge_paused_latest: str
    edge_bucket_minus_infinity: str
    #: The payload stored, in intents and in events together (its length: the suite's payloads are
    #: ASCII, a byte a character); and the deletion of event ``acme/e1``.
    payload_bytes: str
    delete_event: str


def keyring(directory: Path) -> Keyring:
    """A keyring of one new key, read from a file in ``directory`` (where a test may add keys)."""
    path = directory / "secrets.key"
    path.write_text(generate_key() + "\n")
    return Keyring.read(path)


async def sqlite(directory: Path) -> Store:
    return SqliteStore(directory / "conformance.db", keyring=keyring(directory))


async def postgres(directory: Path) -> Store:
    """A store on a new database of the test server (``tests/pg.py``), dropped when it closes."""
    from outbox.store.postgres import PostgresStore

    class ThrowawayPostgresStore(PostgresStore):
        async def close(self) -> None:
            try:
                await super().close()
            finally:
                await pg.drop_database(self.dsn)

    return ThrowawayPostgresStore(await pg.create_database(), keyring=keyring(directory))


#: Every backend the suite runs against.
STORE_FACTORIES: list[StoreFactory] = [sqlite, postgres]

#: The caller's SQL for each ``Store.dialect`` in STORE_FACTORIES.
CALLER_SQL: dict[str, CallerSql] = {
    "sqlite": CallerSql(
        create="CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER NOT NULL)",
        insert="INSERT INTO orders (id, total) VALUES (?, ?)",
        count="SELECT count(*) FROM orders",
        # integer microseconds since 1970: 0000-12-31T23:00:00Z, and 10000-01-01T00:59:59Z
        before_year_1="UPDATE intents SET expires_at = -62135600400000000 WHERE action_id = ?",
        after_year_9999="UPDATE intents SET next_attempt_at = 253402304399000000 WHERE action_id = ?",
        latest="UPDATE intents SET next_attempt_at = 9223372036854775807 WHERE action_id = ?",
        grant_earliest="UPDATE grants SET expires_at = -9223372036854775808 WHERE id = 'g1'",
        edge_paused_latest="UPDATE destinations SET paused_until = 9223372036854775807 WHERE id = 'edge'",
        edge_bucket_minus_infinity="UPDATE destination_buckets SET tokens = -1e999 WHERE destination = 'edge'",
        payload_bytes="SELECT (SELECT coalesce(sum(length(payload)), 0) FROM intents)"
                      " + (SELECT coalesce(sum(length(payload)), 0) FROM topic_events)",
        delete_event="DELETE FROM topic_events WHERE event_key = 'acme/e1'",
    ),
    "postgres": CallerSql(
        create="CREATE TABLE orders (id integer PRIMARY KEY, total integer NOT NULL)",
        insert="INSERT INTO orders (id, total) VALUES ($1, $2)",
        count="SELECT count(*) FROM orders",
        # what the requests would have stored, had PostgreSQL not refused them in Python
        before_year_1="UPDATE intents SET expires_at = '0001-01-01 00:00:00+01' WHERE action_id = $1",
        after_year_9999="UPDATE intents SET next_attempt_at = '9999-12-31 23:59:59-01' WHERE action_id = $1",
        latest="UPDATE intents SET next_attempt_at = 'infinity' WHERE action_id = $1",
        grant_earliest="UPDATE grants SET expires_at = '-infinity' WHERE id = 'g1'",
        edge_paused_latest="UPDATE destinations SET paused_until = 'infinity' WHERE id = 'edge'",
        edge_bucket_minus_infinity="UPDATE destination_buckets SET tokens = '-Infinity' WHERE destination = 'edge'",
        payload_bytes="SELECT (SELECT coalesce(sum(length(payload)), 0) FROM intents)"
                      " + (SELECT coalesce(sum(length(payload)), 0) FROM topic_events)",
        delete_event="DELETE FROM topic_events WHERE event_key = 'acme/e1'",
    ),
}
