"""Alembic beside the outbox in one database: the application's migrations (Alembic) own its
tables, the outbox's own (``outbox migrate``) own the outbox's, and neither touches the other's.

Alembic's autogenerate compares the application's metadata with the database and proposes
dropping every table the metadata does not have, the outbox's among them. These hooks tell it
the outbox's tables (``OUTBOX_TABLES``, in the connection's default schema) are not the
application's, so no revision ever drops or alters them:

    # env.py, in run_migrations_online()
    from outbox.contrib.alembic import include_name

    context.configure(connection=connection, target_metadata=target_metadata, include_name=include_name)

``include_name`` (Alembic 1.5 and later) keeps the outbox's tables out of reflection altogether;
``include_object`` is the same for a project that filters objects instead. An ``env.py`` with a
filter of its own calls both: ``include_name=lambda *a: outbox_include_name(*a) and mine(*a)``.
A table of the application's own with one of these names is the same table as the outbox's:
rename it. Nothing here imports Alembic or SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..store.migrator import TABLES

#: The outbox's tables, as ``outbox migrate`` makes them (``schema_migrations``, its record, included).
OUTBOX_TABLES: frozenset[str] = TABLES


def is_outbox_table(name: str | None, schema: str | None = None) -> bool:
    """Whether the table ``name`` in ``schema`` (None: the connection's default) is the outbox's."""
    return schema is None and name in OUTBOX_TABLES


def include_name(name: str | None, type_: str, parent_names: Mapping[str, Any]) -> bool:
    """Alembic's ``include_name`` hook: False for the outbox's tables, True for every other name."""
    return not (type_ == "table" and is_outbox_table(name, parent_names.get("schema_name")))


def include_object(object: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Alembic's ``include_object`` hook: False for an outbox table found in the database and not
    in the application's metadata (which autogenerate would drop), True for everything else."""
    return not (type_ == "table" and reflected and compare_to is None and is_outbox_table(name, object.schema))
