"""The PostgreSQL store (asyncpg): outbox processes on many hosts share one database.

Each write is its own transaction on a pooled connection, and a claim is one statement that
locks what it leases with ``FOR UPDATE SKIP LOCKED``, so claimers neither wait for each other
nor get the same intent. Hosts judge leases on one timeline, the database's: ``clock_offset``
says how far this host's clock is from it (``Outbox.open`` moves its clock by that much).
Statements that make an intent pending notify at commit, and ``listen`` wakes this process's
workers on it; polling stays the fallback. The caller's own asyncpg connection can carry
enqueues inside the caller's transaction (``transaction(connection=...)``).

One module per concern: ``sql`` (the named statements), ``connection`` (the pool, the time
codec, what "not now" is), ``intake`` (enqueues), ``changes`` (``apply``'s statements),
``listener`` (wake-ups) and ``store`` (``PostgresStore``, each method one unit of work). This
package is the only one that imports asyncpg, and ``store_for_url`` imports it only for a
PostgreSQL URL.
"""

from __future__ import annotations

from .changes import cycle_arguments
from .listener import CHANNEL, LISTENER
from .sql import SQL
from .store import PostgresStore

__all__ = ["CHANNEL", "LISTENER", "SQL", "PostgresStore", "cycle_arguments"]
