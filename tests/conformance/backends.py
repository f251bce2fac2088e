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
    ),
    "postgres": CallerSql(
        create="CREATE TABLE orders (id integer PRIMARY KEY, total integer NOT NULL)",
        insert="INSERT INTO orders (id, total) VALUES ($1, $2)",
        count="SELECT count(*) FROM orders",
    ),
}
