"""The migration runner (outbox/store/migrator.py) against an in-memory session."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from outbox import SchemaTooNew
from outbox.store.migrator import Migration, decide_pending, discover, run_migrations, scripts_for

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
SCRIPTS = [Migration(1, "0001_initial", "CREATE a;"), Migration(2, "0002_more", "CREATE b; CREATE c;"),
           Migration(3, "0003_last", "CREATE d;")]


class Session:
    """What a dialect gives the runner, kept in memory."""

    def __init__(self, applied: set[int] | None = None) -> None:
        self.applied = set(applied or ())
        self.ran: list[str] = []
        self.recorded: list[tuple[int, str, datetime]] = []

    async def applied_versions(self) -> set[int]:
        return set(self.applied)

    async def run_script(self, script: str) -> None:
        self.ran.append(script)

    async def record(self, migration: Migration, at: datetime) -> None:
        self.applied.add(migration.version)
        self.recorded.append((migration.version, migration.name, at))


def test_scripts_are_discovered_by_version(tmp_path: Path):
    for name, text in (("0010_later.sql", "B;"), ("0002_first.sql", "A;"), ("README.txt", "not a script")):
        (tmp_path / name).write_text(text)
    assert discover(tmp_path) == [Migration(2, "0002_first", "A;"), Migration(10, "0010_later", "B;")]


def test_two_scripts_with_one_version_are_refused(tmp_path: Path):
    (tmp_path / "0001_a.sql").write_text("A;")
    (tmp_path / "0001_b.sql").write_text("B;")
    with pytest.raises(ValueError, match="'0001_a' and '0001_b' share version 1"):
        discover(tmp_path)


def test_the_shipped_scripts_are_numbered_from_one_the_same_in_both_dialects():
    # (a number may be missing while parts of a release are made side by side: gaps are fine)
    scripts = scripts_for("sqlite")
    versions = [m.version for m in scripts]
    assert versions == sorted(set(versions)) and versions[0] == 1
    assert [m.name for m in scripts_for("postgres")] == [m.name for m in scripts]
    assert scripts[0].name == "0001_initial"


def test_pending_scripts_are_those_not_applied_in_version_order():
    assert decide_pending(list(reversed(SCRIPTS)), set()) == SCRIPTS
    assert decide_pending(SCRIPTS, {1, 3}) == [SCRIPTS[1]]
    assert decide_pending(SCRIPTS, {1, 2, 3}) == []


def test_a_database_from_a_newer_release_is_refused():
    with pytest.raises(SchemaTooNew, match="schema version 4, this release knows up to 3; upgrade"):
        decide_pending(SCRIPTS, {1, 2, 3, 4})


async def test_the_runner_runs_and_records_each_pending_script_in_order():
    session = Session({1})
    assert await run_migrations(session, SCRIPTS, at=T0) == ["0002_more", "0003_last"]
    assert session.ran == ["CREATE b; CREATE c;", "CREATE d;"]
    assert session.recorded == [(2, "0002_more", T0), (3, "0003_last", T0)]
    assert await run_migrations(session, SCRIPTS, at=T0) == []


async def test_the_runner_refuses_a_newer_database_before_running_anything():
    session = Session({1, 7})
    with pytest.raises(SchemaTooNew, match="version 7"):
        await run_migrations(session, SCRIPTS)
    assert session.ran == [] and session.recorded == []
