"""What an outbox module imports, read from its source with ``ast``: one resolver for the tests
that hold the directions of imports."""

from __future__ import annotations

import ast
from pathlib import Path

OUTBOX = Path(__file__).resolve().parents[2] / "outbox"


def import_targets(path: Path, source: str | None = None) -> list[tuple[ast.stmt, list[str]]]:
    """Every module an import in ``path`` (``source`` instead of its text, if given) may name,
    lazy ones inside functions too, as absolute dotted parts. ``from X import a`` names X and
    X.a, since ``a`` may be a module (``from outbox import api``); relative imports are resolved
    against the file's package."""
    package = path.relative_to(OUTBOX).parent.parts
    found: list[tuple[ast.stmt, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text() if source is None else source, str(path))):
        if isinstance(node, ast.Import):
            found += [(node, alias.name.split(".")) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module.split(".") if node.module else []
            base = ["outbox", *package[: len(package) - (node.level - 1)], *module] if node.level else module
            found += [(node, base), *((node, [*base, alias.name]) for alias in node.names)]
    return found


def module_file(parts: list[str]) -> Path | None:
    """The file of the outbox module named by ``parts`` (below the package), if there is one."""
    base = OUTBOX.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None
