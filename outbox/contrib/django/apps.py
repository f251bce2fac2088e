"""The app's configuration: it registers no models and nothing in the admin (the outbox's tables
are its own: ``schema``), applies the outbox's migrations after Django's ``migrate``, and checks
the settings it reads when the project's checks run (``manage.py check``, ``runserver``,
``migrate``)."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core import checks
from django.core.exceptions import ImproperlyConfigured


class OutboxConfig(AppConfig):
    """``outbox.contrib.django`` in ``INSTALLED_APPS``."""

    name = "outbox.contrib.django"
    label = "outbox"
    verbose_name = "Outbox"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate
        from django.test.signals import setting_changed

        from .conf import forget
        from .schema import after_migrate

        setting_changed.connect(forget, dispatch_uid="outbox.contrib.django.forget")
        post_migrate.connect(after_migrate, sender=self, dispatch_uid="outbox.contrib.django.after_migrate")
        checks.register(check_settings)


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``OUTBOX`` is a dict of settings the outbox knows, its alias is a SQLite or PostgreSQL
    database, and a SQLite one begins its transactions IMMEDIATE."""
    from django.db import connections

    from .conf import database_alias, outbox_settings

    try:
        outbox_settings()
        alias = database_alias()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="outbox.E001")]
    connection = connections[alias]
    if connection.vendor not in ("sqlite", "postgresql"):
        return [checks.Error(f"the database {alias!r} is {connection.vendor}; the outbox's tables live in SQLite or "
                             "PostgreSQL", hint="set OUTBOX['DATABASE'] to the alias of such a database",
                             id="outbox.E002")]
    mode = str((connection.settings_dict.get("OPTIONS") or {}).get("transaction_mode")).upper()
    settable = hasattr(connection, "transaction_modes")  # (Django 5.1 and later say how SQLite begins)
    if connection.vendor == "sqlite" and settable and mode not in ("IMMEDIATE", "EXCLUSIVE"):
        return [checks.Warning(
            f"the SQLite database {alias!r} begins its transactions DEFERRED: one that reads before it writes fails "
            "with 'database is locked' when the outbox's service (or any writer) commits in between",
            hint=f"DATABASES[{alias!r}]['OPTIONS']['transaction_mode'] = 'IMMEDIATE'", id="outbox.W001")]
    return []
