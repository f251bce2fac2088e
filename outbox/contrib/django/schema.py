"""The outbox's tables in the Django database they live in: its own migrations (those of
``outbox migrate``, recorded in its ``schema_migrations``), applied by ``manage.py
outbox_migrate`` and, unless ``OUTBOX["MIGRATE"]`` is False, after each Django ``migrate`` of
that database, the test databases Django's test runner makes included (so every clone of one,
under ``--parallel``, has them too)."""

from __future__ import annotations

import asyncio
import sys
from typing import Any
from urllib.parse import urlsplit, urlunsplit


def migrate(url: str) -> list[str]:
    """Apply the outbox's pending migrations to the database at ``url``; the names of those
    applied. It needs no secrets key: that is the service's, recorded at its first start."""
    from outbox.store import store_for_url

    from .conf import outbox_settings

    async def run() -> list[str]:
        store = store_for_url(url, busy_timeout_ms=outbox_settings().sqlite_busy_timeout_ms)
        await store.open()
        try:
            return await store.migrate()
        finally:
            await store.close()

    return asyncio.run(run())


def shown(url: str) -> str:
    """``url`` without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(":" + parts.password + "@", ":***@", 1)))


def after_migrate(*, using: str, plan: Any = None, verbosity: int = 1, stdout: Any = None, **_: Any) -> None:
    """Django's ``post_migrate`` receiver: the outbox's migrations on the database Django has
    just migrated, when it is the outbox's alias, at the URL made from its settings (never
    another database). Not after a ``flush`` (no ``plan``), nor with ``OUTBOX["MIGRATE"] = False``.
    A database the outbox's service could not open (SQLite in memory) or whose settings it
    cannot follow is left, saying so: ``manage.py outbox_migrate`` names one by URL."""
    from django.core.exceptions import ImproperlyConfigured
    from django.db import connections

    from .conf import database_alias, database_url, in_memory, migrates_with_django

    if plan is None or not migrates_with_django() or using != database_alias():
        return
    out = stdout or sys.stdout
    connection = connections[using]
    if connection.vendor == "sqlite" and in_memory(connection.settings_dict):
        if verbosity >= 1:
            out.write(f"  The outbox's tables are not made in {using!r}, a SQLite database in memory, which its "
                      "service could not open: give it a file to enqueue there (TEST NAME, under the test runner)\n")
        return
    try:
        url = database_url(using, derived=True)
    except ImproperlyConfigured as exc:
        out.write(f"  The outbox's migrations were not applied: {exc}; run manage.py outbox_migrate\n")
        return
    applied = migrate(url)
    if verbosity >= 1:
        out.write(f"  Applied the outbox's migrations to {shown(url)}: {', '.join(applied)}\n" if applied else
                  f"  The outbox's tables in {shown(url)} are up to date\n")
