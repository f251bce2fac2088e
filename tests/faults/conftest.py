"""The fault matrix's closing summary: every run ends with its truth tables per channel and store."""

from __future__ import annotations

import pytest

from .tables import ARTIFACTS, summary


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if text := summary():
        terminalreporter.section("fault matrix: recorded outcome against what happened")
        terminalreporter.write_line(text)
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "faults-summary.txt").write_text(text + "\n")
