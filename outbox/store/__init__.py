"""Storage backends behind one protocol, chosen by database URL."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from ..errors import InvalidInput
from .protocol import Activity, History, IntentQuery, Page, SharesClock, Store, SupportsListener, Transaction
from .sqlite import SqliteStore

__all__ = [
    "Activity", "History", "IntentQuery", "Page", "SharesClock", "SqliteStore", "Store", "SupportsListener",
    "Transaction", "store_for_url",
]


def store_for_url(url: str, *, busy_timeout_ms: int = 5000, create: bool = True) -> Store:
    """The (unopened) store a database URL names: ``sqlite:///relative.db``,
    ``sqlite:////absolute/path.db``, ``postgresql://user@host/db`` (or ``postgres://``). The
    PostgreSQL store is imported here, when named, so a SQLite process never imports asyncpg.
    Without ``create``, a SQLite file that does not exist is not made (a database server's
    databases are never made by opening them)."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        path = unquote(parts.path)
        if parts.netloc or not path.startswith("/") or path == "/":
            raise InvalidInput(
                f"database URL {url!r} is malformed: use sqlite:///relative/path.db "
                "or sqlite:////absolute/path.db"
            )
        return SqliteStore(path[1:], busy_timeout_ms=busy_timeout_ms, create=create)
    if parts.scheme in ("postgresql", "postgres"):
        from .postgres import PostgresStore

        return PostgresStore(url)
    raise InvalidInput(f"database URL {url!r}: unsupported scheme {parts.scheme!r} (use sqlite:/// or postgresql://)")
