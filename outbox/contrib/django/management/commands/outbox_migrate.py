"""``manage.py outbox_migrate``: the outbox's own migrations, on the database its enqueues run on."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = (
        "Apply the outbox's own migrations (its tables: intents, events, destinations, grants, ...) to the "
        "database of OUTBOX['DATABASE'], the one enqueue() writes to. Django's migrate neither makes nor touches "
        "these tables and this command touches none of Django's: run both, in either order, on every deploy. "
        "Safe to run again, and from several hosts at once, as `outbox migrate` is."
    )
    requires_system_checks = ()  # (a wrong OUTBOX is reported below, as a CommandError)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", help="The alias to migrate [default: OUTBOX['DATABASE'], or 'default'].")

    def handle(self, *args: Any, **options: Any) -> None:
        from outbox.contrib.django.conf import database_alias, database_url, outbox_settings
        from outbox.errors import OutboxError

        try:
            alias = database_alias(options["database"])
            url = database_url(alias)
            applied = asyncio.run(_migrate(url, outbox_settings().sqlite_busy_timeout_ms))
        except (ImproperlyConfigured, OutboxError) as exc:
            raise CommandError(str(exc)) from None
        where = f"{_shown(url)} (Django's database {alias!r})"
        if applied:
            self.stdout.write(f"applied {len(applied)} outbox migration{'' if len(applied) == 1 else 's'} to {where}: "
                              f"{', '.join(applied)}")
        else:
            self.stdout.write(f"the outbox's tables in {where} are up to date: no migration to apply")


async def _migrate(url: str, busy_timeout_ms: int) -> list[str]:
    """The migrations ``outbox migrate`` applies, applied to ``url``; the names of those applied.
    The secrets key is the service's business: its first start records it."""
    from outbox.store import store_for_url

    store = store_for_url(url, busy_timeout_ms=busy_timeout_ms)
    await store.open()
    try:
        return await store.migrate()
    finally:
        await store.close()


def _shown(url: str) -> str:
    """``url`` without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(":" + parts.password + "@", ":***@", 1)))
