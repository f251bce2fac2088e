"""The outbox's core (model, store and its dialects, the ``Outbox`` library, errors, ids, digest,
clock, destinations, grants, tokens, settings, operations: every module but the app layer) builds
on nothing above it: no core module imports ``sender`` or an app-layer module, not even lazily
inside a function. The app layer (HTTP API and its routers, console, CLI, OpenAPI models, web
pages, and the service that composes them with the sender) may import the core and the sender."""

from __future__ import annotations

import ast
from pathlib import Path

from .imports import OUTBOX, import_targets

#: The app layer, as paths below ``outbox/`` without ``.py`` (a folder stands for everything in it):
#: its package, and the documented import paths of the API and the service it keeps there.
APP_LAYER = {"app", "api", "service"}
SENDER = "sender"


def app_layer(parts: tuple[str, ...]) -> bool:
    return bool(parts) and parts[0] in APP_LAYER


def core_modules() -> list[Path]:
    return sorted(p for p in OUTBOX.rglob("*.py") if not app_layer(p.relative_to(OUTBOX).with_suffix("").parts))


def offending_imports(path: Path, source: str | None = None) -> list[str]:
    """The imports in ``path`` (anywhere in it, lazy ones too) of ``sender`` or of the app layer."""
    return sorted({f"line {node.lineno}: {ast.unparse(node)}" for node, target in import_targets(path, source)
                   if target[:1] == [SENDER] or (target[:1] == ["outbox"] and app_layer(tuple(target[1:])))})


def test_core_modules_import_neither_the_sender_nor_the_app_layer():
    modules = core_modules()
    names = {str(p.relative_to(OUTBOX)) for p in modules}
    # the walk sees the core it is about, and none of the app layer
    assert {"model.py", "outbox.py", "errors.py", "operations.py", "settings.py", "store/sqlite/store.py",
            "store/protocol.py", "store/__init__.py"} <= names
    assert not names & {"api.py", "service.py", "app/api.py", "app/cli/__init__.py", "app/console/pages.py",
                        "app/openapi.py", "app/web.py"}
    offenders = {str(p.relative_to(OUTBOX)): found for p in modules if (found := offending_imports(p))}
    assert offenders == {}


def test_the_walk_sees_lazy_and_relative_imports_of_the_app_layer_and_the_sender():
    inside_store = OUTBOX / "store" / "sqlite.py"
    for source in ("def f():\n    from sender.worker import Worker\n",
                   "import sender\n",
                   "from ..api import create_app\n",
                   "from ..app import cli\n",
                   "from outbox.app import console\n",
                   "from outbox import app\n",
                   "import outbox.app.web\n",
                   "from outbox.app.routes.intents import router\n"):
        assert offending_imports(inside_store, source), source
    for source in ("from ..model import Intent\n", "from . import protocol\n", "from receivers import wire\n",
                   "import outbox.store\n"):
        assert offending_imports(inside_store, source) == [], source
