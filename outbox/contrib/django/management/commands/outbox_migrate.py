"""``manage.py outbox_migrate``: the outbox's own migrations, on the database its enqueues run on."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = (
        "Apply the outbox's own migrations (its tables: intents, events, destinations, grants, ...) to the "
        "database of OUTBOX['DATABASE'], the one enqueue() writes to, at OUTBOX['DATABASE_URL'] or "
        "OUTBOX_DATABASE_URL if given, else at the URL made from DATABASES. Django's migrate applies them too "
        "(unless OUTBOX['MIGRATE'] is False), never touching them otherwise, and this command touches none of "
        "Django's tables. Safe to run again, and from several hosts at once, as `outbox migrate` is."
    )
    requires_system_checks = ()  # (a wrong OUTBOX is reported below, as a CommandError)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", help="The alias to migrate [default: OUTBOX['DATABASE'], or 'default'].")

    def handle(self, *args: Any, **options: Any) -> None:
        from outbox.contrib.django.conf import database_alias, database_url
        from outbox.contrib.django.schema import migrate, shown
        from outbox.errors import OutboxError

        try:
            alias = database_alias(options["database"])
            url = database_url(alias)
            applied = migrate(url)
        except (ImproperlyConfigured, OutboxError) as exc:
            raise CommandError(str(exc)) from None
        where = f"{shown(url)} (Django's database {alias!r})"
        if applied:
            self.stdout.write(f"applied {len(applied)} outbox migration{'' if len(applied) == 1 else 's'} to {where}: "
                              f"{', '.join(applied)}")
        else:
            self.stdout.write(f"the outbox's tables in {where} are up to date: no migration to apply")
