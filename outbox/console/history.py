"""An intent's attempts and timeline as its console page draws them: one row per attempt (where
it went, what came back, its error and reply under it) and one readable row per event (its
key fields in words, the raw JSON folded away)."""

from __future__ import annotations

import json
from datetime import datetime
from html import escape
from typing import Any

from ..destinations import Destination
from ..model import Attempt, Event
from .destination import where
from .layout import destination_link, pretty, short_id, table, when

#: Characters of a text field an event row shows before it is cut (the raw JSON keeps it whole).
FIELD = 80


def attempts(found: list[Attempt], destination: Destination | None, now: datetime) -> str:
    """The attempts table. An attempt does not record where it went, so "where" is the
    destination's target as registered now, and says so when the destination changed since."""
    target = destination_link(destination.id) + " · " + escape(where(destination)) if destination else "—"

    def went(a: Attempt) -> str:
        changed = destination is not None and destination.updated_at > a.started_at
        return target + (" <i>(registered now; changed since this attempt)</i>" if changed else "")

    def under(a: Attempt) -> str:
        parts = ([f"<b>error</b> {escape(a.error)}"] if a.error else []) + (
            [f"<details open><summary>reply</summary>{pretty(a.reply)}</details>"] if a.reply else [])
        return "<br>".join(parts)

    rows: list[tuple[list[str], str]] = [([
        str(a.number), short_id(a.attempt_id), str(a.fence), when(a.started_at, now), went(a),
        escape(a.submission.value if a.submission else ""),
        escape(a.outcome.value if a.outcome else "in flight") + (f" at {escape(a.stage)}" if a.stage else ""),
        str(a.status_code or ""), escape(a.external_id or ""),
        "" if a.duration_ms is None else f"{a.duration_ms:.0f}"], under(a)) for a in found]
    return ("<p>Where each went is the destination as registered now: attempts do not record it.</p>"
            + table(["#", "attempt", "fence", "started", "where", "submission", "outcome", "status",
                     "external id", "ms"], rows, numeric=("#", "fence", "status", "ms")))


def _shown(key: str, value: Any) -> str:
    if key.endswith("_id") and isinstance(value, str):
        return short_id(value)
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return escape(text if len(text) <= FIELD else text[:FIELD] + "…")


def timeline(events: list[Event], now: datetime) -> str:
    """The timeline: time, event, actor, reason, and the event's fields that say something (the
    ones that are set), the whole of its data as JSON folded under them."""
    def fields(e: Event) -> str:
        said = " · ".join(f"<span class='k'>{escape(k)}</span> {_shown(k, v)}" for k, v in e.data.items()
                          if v not in (None, "", [], {}))
        raw = (f"<details><summary>raw</summary><pre>{escape(json.dumps(dict(e.data), indent=2))}</pre></details>"
               if e.data else "")
        return said + raw

    return table(["at", "event", "actor", "reason", "details"], [
        [when(e.at, now), f"<b>{escape(e.kind.value)}</b>", escape(e.actor), escape(e.reason or ""), fields(e)]
        for e in events])
