"""The receivers' SQLite plumbing and named-SQL loader as the outbox's store uses them: SQLite
answering "not now" raises the outbox's StoreUnavailable (answered 503), and the statements are
the outbox's own, in ``outbox/store/sql/``. The only module of the store that imports the
receivers' SQLite pieces (the group committer, its set jobs, the microsecond times)."""

from __future__ import annotations

from receivers import sqlite_writer as _sqlite
from receivers.queries import Queries
from receivers.sqlite_writer import SetJob, from_us, to_us

from ..errors import StoreUnavailable

SQLITE = _sqlite.Sqlite(StoreUnavailable)
connect, on_thread, unavailable = SQLITE.connect, SQLITE.on_thread, SQLITE.unavailable
queries = Queries(__package__)
__all__ = ["SQLITE", "GroupCommitter", "SetJob", "connect", "from_us", "on_thread", "queries", "to_us", "unavailable"]


class GroupCommitter(_sqlite.GroupCommitter):
    """Group commit whose failed commits raise the outbox's StoreUnavailable."""

    sqlite = SQLITE
