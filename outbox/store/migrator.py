"""Versioned migrations, run the same way for every dialect.

A dialect's scripts are ``migrations/<dialect>/NNNN_name.sql``; the version is the number. The
runner decides which scripts to apply, refuses a database migrated by a newer release
(SchemaTooNew) and records each version with its statements. A dialect only opens the
exclusive transaction (one migrator at a time, across processes) and, inside it, runs a script
and reads and records versions: a ``MigrationSession``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.resources import files
from importlib.resources.abc import Traversable
from itertools import pairwise
from typing import Protocol

from ..errors import SchemaTooNew

#: Every table the migrations make, by dialect, their own record (``schema_migrations``) included: what the
#: outbox owns in a database it shares with an application (PostgreSQL keeps leases in a table of their own).
DIALECT_TABLES: dict[str, frozenset[str]] = {"sqlite": frozenset({
    "schema_migrations", "intents", "attempts", "events", "destinations", "destination_buckets", "grants",
    "tokens", "secrets_key", "topic_events", "subscriptions", "console_sessions", "portal_links",
})}
DIALECT_TABLES["postgres"] = DIALECT_TABLES["sqlite"] | {"intent_leases"}
#: The tables of either dialect: what the application's own migrations must leave alone (``outbox.contrib.alembic``).
TABLES = frozenset().union(*DIALECT_TABLES.values())


@dataclass(frozen=True, slots=True)
class Migration:
    """One versioned script."""

    version: int
    name: str  # the file name without ``.sql``, recorded beside the version
    script: str


class MigrationSession(Protocol):
    """A dialect inside its exclusive migration transaction: committed when the runner returns,
    rolled back when it raises."""

    async def applied_versions(self) -> set[int]:
        """The versions recorded as applied (the record exists, perhaps empty)."""
        ...

    async def run_script(self, script: str) -> None:
        """Run every statement of a migration script."""
        ...

    async def record(self, migration: Migration, at: datetime) -> None:
        """Record ``migration`` as applied at ``at``."""
        ...


def discover(directory: Traversable) -> list[Migration]:
    """The ``NNNN_name.sql`` scripts in ``directory``, by version. Raises ValueError when two
    scripts share a version."""
    found = sorted(
        (Migration(int(item.name.split("_", 1)[0]), item.name.removesuffix(".sql"), item.read_text())
         for item in directory.iterdir() if item.name.endswith(".sql")),
        key=lambda m: (m.version, m.name),
    )
    for before, after in pairwise(found):
        if before.version == after.version:
            raise ValueError(f"migrations {before.name!r} and {after.name!r} share version {before.version}")
    return found


def scripts_for(dialect: str) -> list[Migration]:
    """A dialect's migrations, shipped in ``outbox/store/migrations/<dialect>``."""
    return discover(files(__package__).joinpath(f"migrations/{dialect}"))


def decide_pending(scripts: Sequence[Migration], applied: Collection[int]) -> list[Migration]:
    """The scripts not yet applied, in version order. Raises SchemaTooNew when the database
    records a version above every script's: it was migrated by a newer release, and this one
    would misread it."""
    known = max((m.version for m in scripts), default=0)
    if applied and max(applied) > known:
        raise SchemaTooNew(
            f"the database is at schema version {max(applied)}, this release knows "
            f"up to {known}; upgrade outbox-delivery"
        )
    return [m for m in sorted(scripts, key=lambda m: m.version) if m.version not in applied]


async def run_migrations(
    session: MigrationSession, scripts: Sequence[Migration], *, at: datetime | None = None
) -> list[str]:
    """Apply the pending ``scripts`` in ``session``, each recorded as it is applied; returns the
    names applied (empty when up to date). Raises SchemaTooNew before running anything."""
    when = at or datetime.now(UTC)
    applied: list[str] = []
    for migration in decide_pending(scripts, await session.applied_versions()):
        await session.run_script(migration.script)
        await session.record(migration, when)
        applied.append(migration.name)
    return applied
