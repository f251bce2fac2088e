"""The HTTP API builds on the outbox and knows nothing of the sender: neither ``outbox.api``,
its routers, nor any outbox module they import (at any depth) imports ``sender``. The sender
is composed with the API only by ``outbox.service`` and the CLI."""

from __future__ import annotations

import ast
from pathlib import Path

OUTBOX = Path(__file__).resolve().parents[2] / "outbox"
API = ["api.py", *sorted(str(p.relative_to(OUTBOX)) for p in (OUTBOX / "routes").glob("*.py"))]


def module_file(parts: list[str]) -> Path | None:
    """The file of the outbox module named by ``parts`` (below the package), if there is one."""
    base = OUTBOX.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imports(path: Path) -> tuple[set[str], set[Path]]:
    """What a file imports: the top-level packages outside outbox, and the outbox files."""
    package = list(path.relative_to(OUTBOX).parent.parts)
    outside: set[str] = set()
    inside: set[Path] = set()

    def within(parts: list[str], names: list[str]) -> None:
        for found in [module_file(parts), *(module_file([*parts, name]) for name in names)]:
            if found is not None:
                inside.add(found)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top, *rest = alias.name.split(".")
                if top == "outbox":
                    within(rest, [])
                else:
                    outside.add(top)
        elif isinstance(node, ast.ImportFrom):
            names = [alias.name for alias in node.names]
            module = (node.module or "").split(".") if node.module else []
            if node.level:
                parts = package[: len(package) - (node.level - 1)] + module
                within(parts, names)
            elif module[0] == "outbox":
                within(module[1:], names)
            else:
                outside.add(module[0])
    return outside, inside


def test_the_api_and_its_routers_import_nothing_from_the_sender():
    assert "routes/intents.py" in API and "routes/operators.py" in API  # the walk sees the routers
    seen: dict[Path, set[str]] = {}
    todo = [OUTBOX / name for name in API]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen[path], inside = imports(path)
        todo.extend(inside - seen.keys())
    assert OUTBOX / "console.py" in seen and OUTBOX / "operations.py" in seen
    offenders = sorted(str(path.relative_to(OUTBOX)) for path, outside in seen.items() if "sender" in outside)
    assert offenders == []
    assert OUTBOX / "service.py" not in seen and OUTBOX / "cli.py" not in seen


def test_the_walk_finds_a_sender_import():
    outside, _ = imports(OUTBOX / "service.py")  # the composition root does import it
    assert "sender" in outside
