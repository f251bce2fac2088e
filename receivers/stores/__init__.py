"""Record stores, one module each, all of one protocol (``receivers.records.RecordStore``): in
memory (``memory``: tests, one process), SQLite (``sqlite``, aiosqlite) and PostgreSQL
(``postgres``, asyncpg); ``rows`` holds what the two SQL stores share.

A single claim, completion, release or probe reads the current record and writes back what
``receivers.records`` decides, atomically: SQLite inside a group-committed transaction (durable
before the handler runs), PostgreSQL under ``SELECT … FOR UPDATE``, memory under a lock.

A batch (the Kafka consumer's ``claim_many``, ``complete_many``, ``release_many`` and
``complete_and_claim``) runs as one statement per kind over the whole batch in the SQL stores,
whatever its size: the same rules spelled in SQL (``INSERT … ON CONFLICT DO UPDATE … WHERE`` for
claims, ``UPDATE … FROM`` for the rest, over ``unnest`` arrays or ``json_each``), each row guarded
on its own, and the refused claims read back to say why; the conformance suite checks the batch
rules against ``decide_claim``. A store imports its driver when it is opened.
"""

from .memory import MemoryRecordStore
from .postgres import PostgresRecordStore
from .sqlite import SqliteRecordStore

__all__ = ["MemoryRecordStore", "PostgresRecordStore", "SqliteRecordStore"]
