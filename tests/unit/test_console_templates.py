"""The console's and the tenant portal's HTML is all in their templates, which escape by default:
no module of theirs writes markup (a string holding a tag) or escapes by hand (``html``,
``markupsafe``), so no page depends on a call site remembering to escape."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import outbox

APP = Path(outbox.__file__).parent / "app"
#: The start of an HTML tag (or a doctype) in a string.
TAG = re.compile(r"<(/?[A-Za-z][A-Za-z0-9]*|!doctype)[\s>/]", re.IGNORECASE)
BY_HAND = {"html", "markupsafe"}


def _modules() -> Iterator[Path]:
    for package in ("console", "portal"):
        yield from sorted((APP / package).glob("*.py"))


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring nodes in ``tree`` (they may name a tag: "a ``<pre>``")."""
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def test_no_module_of_the_console_or_the_portal_writes_markup_or_escapes_by_hand():
    found = []
    for path in _modules():
        tree = ast.parse(path.read_text(), str(path))
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                found += [f"{path.name}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in BY_HAND]
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                  and TAG.search(node.value)):
                found.append(f"{path.name}:{node.lineno} {node.value[:60]!r}")
    assert found == []


def test_the_check_sees_the_modules_it_checks():
    names = {p.parent.name + "/" + p.name for p in _modules()}
    assert {"console/pages.py", "console/guard.py", "portal/access.py", "portal/pages.py"} <= names
