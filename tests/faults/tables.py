"""The truth tables a run printed, gathered per channel and store for the run's closing summary
(tests/faults/conftest.py prints it after the tests, so every run shows it, even without -s)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .checker import render


@dataclass(frozen=True)
class Reported:
    channel: str  # webhook, email, kafka
    store: str  # sqlite or postgres, then the row's name: "sqlite-crashes"
    title: str  # what was injected: seed, intents, fault counts
    table: Counter[tuple[str, str]]
    summed: bool = True  # False: listed, but its cells are not added (its receiver is not idempotent)


#: Where the tables are kept after a run.
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
#: Every table reported in this run, in order.
REPORTS: list[Reported] = []


def store_name(url: str) -> str:
    """The store a row ran on, as the tables name it."""
    return "postgres" if url.startswith("postgres") else "sqlite"


def summary() -> str:
    """One table per channel and store, summed over every row of the matrix that ran on it, each
    followed by the rows it sums; "" when no fault test ran."""
    groups: dict[tuple[str, str], list[Reported]] = {}
    for reported in REPORTS:
        groups.setdefault((reported.channel, reported.store.split("-")[0]), []).append(reported)
    parts = []
    for (channel, store), reports in sorted(groups.items()):
        total = sum((r.table for r in reports if r.summed), Counter[tuple[str, str]]())
        rows = "\n".join(f"  - {r.store}: {r.title}" + ("" if r.summed else " (not summed)") for r in reports)
        summed = sum(r.summed for r in reports)
        parts.append(render(total, title=f"{channel} on {store}, {summed} row(s) of the matrix:") + "\n" + rows)
    return "\n\n".join(parts)
