"""The receivers' SQLite plumbing and named-SQL loader as the outbox's store uses them: SQLite
answering "not now" raises the outbox's StoreUnavailable (answered 503), and the statements are
the outbox's own, in ``outbox/store/sql/``. The only module of the store that imports the
receivers' SQLite pieces (the group committer, its set jobs, the microsecond times)."""

from __future__ import annotations

import re

from receivers import sqlite_writer as _sqlite
from receivers.queries import Queries
from receivers.sqlite_writer import SetJob, from_us, to_us

from ..errors import StoreUnavailable

SQLITE = _sqlite.Sqlite(StoreUnavailable)
connect, on_thread, unavailable = SQLITE.connect, SQLITE.on_thread, SQLITE.unavailable
queries = Queries(__package__)
__all__ = ["SQLITE", "GroupCommitter", "SetJob", "connect", "from_us", "on_thread", "queries", "statements", "to_us",
           "unavailable"]
#: Where a statement uses a rule about one intents row, ``{rule[row]}``, ``row`` naming the row: the payload
#: an intent of an event sends (``event_payload``), whether its lease's "leased" fact is recorded nowhere yet
#: (``unrecorded_lease``) and that fact as an attempt keeps it (``lease_entry``).
_ROW_RULE = re.compile(r"\{(event_payload|unrecorded_lease|lease_entry)\[(\w+)\]\}")


def statements(dialect: str) -> dict[str, str]:
    """A dialect's named statements (``sql/<dialect>.sql``), each ``{rule[row]}`` filled from its
    block ``rule`` for that row: one rule (where an intent's payload is stored, when a lease's
    fact is to be written) however many statements apply it."""
    sql = queries.load(dialect)
    return {name: _ROW_RULE.sub(lambda found: sql[found[1]].format(of=found[2]), text) for name, text in sql.items()}


class GroupCommitter(_sqlite.GroupCommitter):
    """Group commit whose failed commits raise the outbox's StoreUnavailable."""

    sqlite = SQLITE
