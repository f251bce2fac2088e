"""No import circles: over ``outbox``, ``sender`` and ``receivers``, the modules and what they
import at run time (at the top or inside a function; ``if TYPE_CHECKING:`` blocks, which never
run, are left out) form a graph without a cycle, so each module's dependencies can be read
downwards and none is half-initialised when another uses it."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("outbox", "sender", "receivers")


def module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_of(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def imported(module: str, source: str) -> set[str]:
    """The project's modules that ``module`` (whose text is ``source``) imports at run time: for
    ``from X import a``, X.a when it is a module, else X."""
    tree = ast.parse(source)
    skipped = {id(n) for node in ast.walk(tree) if _type_checking(node)
               for stmt in node.body for n in ast.walk(stmt)}  # type: ignore[attr-defined]
    package = module if MODULES.get(module, Path()).name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                origin = ".".join([*base, *([node.module] if node.module else [])])
            else:
                origin = node.module or ""
            found |= {f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in MODULES else origin
                      for alias in node.names}
    return {name for name in found if name in MODULES and name != module}


def graph(overrides: dict[str, str] | None = None) -> dict[str, set[str]]:
    sources = {name: path.read_text() for name, path in MODULES.items()} | (overrides or {})
    return {name: imported(name, source) for name, source in sources.items()}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    try:
        tuple(graphlib.TopologicalSorter(edges).static_order())
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return None


def test_no_module_imports_itself_back_through_others():
    edges = graph()
    assert {"outbox.shapes", "outbox.store.sqlite.store", "sender.worker", "receivers.engine"} <= edges.keys()
    assert cycle(edges) is None


def test_the_walk_finds_a_circle_through_a_lazy_import_and_ignores_type_checking_ones():
    lazy = "def f():\n    from .shapes import destination_json\n"
    assert cycle(graph({"outbox.fields": MODULES["outbox.fields"].read_text() + lazy})) is not None
    typing_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .shapes import Destination\n"
    assert cycle(graph({"outbox.fields": MODULES["outbox.fields"].read_text() + typing_only})) is None
