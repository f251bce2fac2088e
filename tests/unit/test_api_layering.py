"""The HTTP API builds on the outbox and knows nothing of the sender: neither ``outbox.app.api``,
its routers, nor any outbox module they import (at any depth) imports ``sender``. The sender
is composed with the API only by ``outbox.app.service`` and the CLI."""

from __future__ import annotations

from pathlib import Path

from .imports import OUTBOX, import_targets, module_file

API = ["app/api.py", *sorted(str(p.relative_to(OUTBOX)) for p in (OUTBOX / "app" / "routes").glob("*.py"))]


def imports(path: Path) -> tuple[set[str], set[Path]]:
    """What a file imports: the top-level packages outside outbox, and the outbox files."""
    outside: set[str] = set()
    inside: set[Path] = set()
    for _, target in import_targets(path):
        if target[0] != "outbox":
            outside.add(target[0])
        elif (found := module_file(target[1:])) is not None:
            inside.add(found)
    return outside, inside


def test_the_api_and_its_routers_import_nothing_from_the_sender():
    assert "app/routes/intents.py" in API and "app/routes/operators.py" in API  # the walk sees the routers
    seen: dict[Path, set[str]] = {}
    todo = [OUTBOX / name for name in API]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen[path], inside = imports(path)
        todo.extend(inside - seen.keys())
    assert OUTBOX / "app" / "console" / "pages.py" in seen and OUTBOX / "operations.py" in seen
    offenders = sorted(str(path.relative_to(OUTBOX)) for path, outside in seen.items() if "sender" in outside)
    assert offenders == []
    assert OUTBOX / "app" / "service.py" not in seen and not any(path.is_relative_to(OUTBOX / "app" / "cli")
                                                                 for path in seen)


def test_the_walk_finds_a_sender_import():
    outside, _ = imports(OUTBOX / "app" / "service.py")  # the composition root does import it
    assert "sender" in outside
