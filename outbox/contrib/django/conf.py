"""The Django app's settings: ``OUTBOX`` in the project's settings, a dict that names the
database alias the outbox's tables live in (``DATABASE``, default ``"default"``), whether Django's
``migrate`` applies the outbox's migrations too (``MIGRATE``, default True), and any of the
outbox's own settings by name (``MAX_PAYLOAD_BYTES``, ``DEFAULT_MAX_ATTEMPTS``, ``DATABASE_URL``,
...: ``outbox.Settings``), over the ``OUTBOX_*`` environment variables and ``outbox.toml`` as the
outbox reads them.

    OUTBOX = {"DATABASE": "default", "MAX_PAYLOAD_BYTES": 262144}
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import cache
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    from ...producer import Producer
    from ...settings import Settings

#: The alias used when ``OUTBOX`` names none.
DEFAULT_ALIAS = "default"

#: PostgreSQL ``OPTIONS`` the outbox's driver (asyncpg) is told as they are: they choose the server
#: and how to reach it.
_PASSED = frozenset({
    "sslmode", "sslrootcert", "sslcert", "sslkey", "sslcrl", "sslpassword", "sslnegotiation",
    "ssl_min_protocol_version", "ssl_max_protocol_version", "target_session_attrs", "passfile", "service",
    "krbsrvname", "gsslib", "application_name",
})
#: PostgreSQL ``OPTIONS`` that only shape Django's own connections, never which database they reach.
_DJANGOS_OWN = frozenset({"isolation_level", "server_side_binding", "pool", "cursor_factory", "connect_timeout"})


def options() -> dict[str, Any]:
    """The project's ``OUTBOX`` setting (empty when it has none)."""
    configured = getattr(settings, "OUTBOX", None) or {}
    if not isinstance(configured, Mapping):
        raise ImproperlyConfigured(f"OUTBOX must be a dict, such as {{'DATABASE': 'default'}}, not {configured!r}")
    return dict(configured)


def database_alias(using: str | None = None) -> str:
    """The database alias enqueues run on: ``using`` when given, else ``OUTBOX["DATABASE"]``."""
    alias = using or options().get("DATABASE", DEFAULT_ALIAS)
    if alias not in settings.DATABASES:
        raise ImproperlyConfigured(f"OUTBOX names the database {alias!r}, which DATABASES does not have")
    return str(alias)


def outbox_settings() -> Settings:
    """The outbox's settings: ``OUTBOX``'s entries (other than ``DATABASE``) over the environment's."""
    from pydantic import ValidationError

    from ...settings import Settings

    given = {str(name).lower(): value for name, value in options().items() if name not in APP_OPTIONS}
    try:
        return Settings(**given)
    except ValidationError as exc:
        raise ImproperlyConfigured("OUTBOX: " + "; ".join(
            f"{'.'.join(map(str, e['loc'])).upper() or 'value'}: {e['msg']}" for e in exc.errors())) from None


@cache
def producer() -> Producer:
    """The project's ``outbox.Producer``, made once with ``outbox_settings`` (again after a test's
    ``override_settings(OUTBOX=...)``)."""
    from ...producer import Producer

    return Producer(outbox_settings())


def forget(*, setting: str, **_: Any) -> None:
    """Django's ``setting_changed`` receiver: a changed ``OUTBOX`` makes the next enqueue read it."""
    if setting == "OUTBOX":
        producer.cache_clear()


#: ``OUTBOX``'s entries that are the app's own, not the outbox's settings.
APP_OPTIONS = ("DATABASE", "MIGRATE")


def migrates_with_django() -> bool:
    """Whether Django's ``migrate`` applies the outbox's migrations too (``OUTBOX["MIGRATE"]``,
    default True)."""
    return options().get("MIGRATE", True) is not False


def database_url(alias: str, *, derived: bool = False) -> str:
    """The outbox's URL for the database of ``alias`` (the one to give ``outbox worker`` as
    ``OUTBOX_DATABASE_URL``): ``OUTBOX["DATABASE_URL"]`` or ``OUTBOX_DATABASE_URL`` when given
    (unless ``derived``), else made from the alias's settings as they are now (under Django's
    test runner: the test database's)."""
    configured = outbox_settings()
    if not derived and "database_url" in configured.model_fields_set:
        return configured.database_url
    from django.db import connections

    connection = connections[alias]
    return url_for(alias, connection.vendor, connection.settings_dict)


def in_memory(settings_dict: Mapping[str, Any]) -> bool:
    """Whether a SQLite database's settings name one in memory (Django's test database by default)."""
    name = str(settings_dict["NAME"])
    return name == ":memory:" or name.startswith("file:") or "mode=memory" in name


def url_for(alias: str, vendor: str, settings_dict: Mapping[str, Any]) -> str:
    """The outbox's URL for a Django database's settings (``vendor``: its backend's, such as
    ``"sqlite"``); raises ImproperlyConfigured for one the outbox cannot reach as Django does."""
    if vendor == "sqlite":
        return _sqlite_url(alias, settings_dict)
    if vendor == "postgresql":
        return _postgres_url(alias, settings_dict)
    raise ImproperlyConfigured(f"the database {alias!r} is {vendor}: the outbox keeps its tables in SQLite or "
                               "PostgreSQL")


def _sqlite_url(alias: str, settings_dict: Mapping[str, Any]) -> str:
    name = str(settings_dict["NAME"])
    if in_memory(settings_dict):
        raise ImproperlyConfigured(
            f"the database {alias!r} is in memory ({name}), which no other process can open; the outbox's "
            "service needs a file (under Django's test runner, set DATABASES[alias]['TEST']['NAME'] to a path)")
    return "sqlite:///" + quote(os.path.abspath(name))


def _postgres_url(alias: str, settings_dict: Mapping[str, Any]) -> str:
    given = dict(settings_dict.get("OPTIONS") or {})
    unknown = sorted(set(given) - _PASSED - _DJANGOS_OWN)
    if unknown:
        raise ImproperlyConfigured(
            f"DATABASES[{alias!r}]['OPTIONS'] has {', '.join(unknown)}, which the outbox cannot tell its own "
            "driver; give the outbox's URL to the same database as OUTBOX['DATABASE_URL'] or OUTBOX_DATABASE_URL")
    query = {name: str(value) for name, value in given.items() if name in _PASSED}
    user, password = settings_dict.get("USER") or "", settings_dict.get("PASSWORD") or ""
    host, port = str(settings_dict.get("HOST") or ""), str(settings_dict.get("PORT") or "")
    if host.startswith("/"):  # a Unix socket's directory
        query["host"], host = host, ""
    credentials = quote(user, safe="") + (":" + quote(password, safe="") if password else "")
    netloc = (credentials + "@" if credentials else "") + host + (":" + port if port and host else "")
    if port and not host:
        query["port"] = port
    name = quote(str(settings_dict.get("NAME") or ""), safe="")
    return f"postgresql://{netloc}/{name}" + ("?" + urlencode(query) if query else "")
