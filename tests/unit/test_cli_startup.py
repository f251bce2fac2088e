"""The ``outbox`` command starts at once: its help and a shell's completion requests import click
and the core's light modules, never a store, a web framework, a driver or pydantic (what a
command needs to run is imported when it runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

#: Packages that only running a command may import (each costs tens to hundreds of milliseconds).
HEAVY = ("fastapi", "starlette", "uvicorn", "pydantic", "pydantic_settings", "asyncpg", "aiosqlite", "psycopg",
         "psycopg2", "aiokafka", "aiosmtplib", "prometheus_client", "cryptography", "opentelemetry", "sender",
         "sqlalchemy", "httpx")
HEAVY_OUTBOX = ("outbox.store", "outbox.outbox", "outbox.api", "outbox.routes", "outbox.settings", "outbox.shapes",
                "outbox.service", "outbox.console", "outbox.destinations", "outbox.operations", "outbox.keyring")

CHILD = """
import json, sys
from outbox.cli import main
try:
    main(sys.argv[1:], prog_name="outbox")
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def loaded(*args: str, env: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """What ``outbox ARGS`` printed, and the modules it had imported when it ended."""
    done = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})}, check=False)
    return done.stdout, json.loads(done.stderr.strip().splitlines()[-1])


def heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if m.split(".")[0] in HEAVY or m.startswith(HEAVY_OUTBOX)]


@pytest.mark.parametrize("args", [["--help"], ["destinations", "put", "--help"], ["replay", "--help"],
                                  ["serve", "--help"], ["events", "--help"]])
def test_help_imports_no_store_web_framework_driver_or_pydantic(args):
    out, modules = loaded(*args)
    assert "Usage: outbox" in out
    assert heavy(modules) == []


@pytest.mark.parametrize(("words", "cword", "expected"), [("outbox re", "1", {"replay", "reject", "resolve"}),
                                                          ("outbox destinations ", "2", {"put", "list", "delete"})])
def test_a_completion_request_imports_nothing_heavy_and_completes(words, cword, expected):
    out, modules = loaded(env={"_OUTBOX_COMPLETE": "bash_complete", "COMP_WORDS": words, "COMP_CWORD": cword})
    assert expected <= {line.split(",", 1)[1] for line in out.splitlines() if "," in line}
    assert heavy(modules) == []


def test_the_help_still_names_each_choice_that_comes_from_the_core():
    """The option choices the command modules take from the core's light modules at import."""
    out, _ = loaded("resolve", "--help")
    assert "delivered|retry|dead" in out
    out, _ = loaded("replay", "--help")
    assert "dead|revoked|unknown" in out
