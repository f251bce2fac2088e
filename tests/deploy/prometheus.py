"""The Prometheus side of deploy/: promtool (Debian's prometheus package, which .ci/run installs)
and the PromQL queries of the Grafana dashboard, as Prometheus itself would evaluate them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "outbox.json"

#: Grafana's interval variables, given the value a 15 s scrape interval would give them.
GRAFANA_INTERVALS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "6h"}


def promtool() -> str:
    """The promtool command; a missing one skips the test here, and fails it in CI (CI=true),
    where .ci/run installs it."""
    found = shutil.which("promtool")
    if found:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail("promtool is missing in CI: .ci/run installs Debian's prometheus package for it")
    pytest.skip("promtool is not installed here (apt-get install prometheus; .ci/run does it in CI)")


def check_rules(path: Path) -> str:
    """``promtool check rules path``; asserts success and returns what it said."""
    done = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def dashboard_queries() -> list[tuple[str, str]]:
    """Every query of the dashboard as (panel title and refId, PromQL with Grafana's variables filled)."""
    queries = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in GRAFANA_INTERVALS.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, f"{panel['title']}: a variable Prometheus cannot know in {expr!r}"
            queries.append((f"{panel['title']} ({target['refId']})", expr))
    return queries
