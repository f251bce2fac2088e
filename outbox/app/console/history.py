"""An intent's attempts and timeline as its console page draws them: one row per attempt (where
it went, as recorded when it started; what came back; its error and reply under it) and one
readable row per event (its key fields in words, the raw JSON folded away)."""

from __future__ import annotations

import json
from datetime import datetime
from html import escape
from typing import Any

from ... import channels
from ...destinations import Destination
from ...model import Attempt, Event, EventKind
from .layout import destination_link, pretty, short_id, table, when

#: Characters of a text field an event row shows before it is cut (the raw JSON keeps it whole).
FIELD = 80


def attempts(found: list[Attempt], events: list[Event], destination: Destination | None, now: datetime) -> str:
    """The attempts table. Where each went is what its ``attempt_started`` event recorded; an
    attempt started before attempts recorded it shows the destination's target as registered
    now, labelled so, and marked when the destination changed since."""
    recorded = {e.data.get("attempt_id"): str(e.data["target"]) for e in events
                if e.kind is EventKind.ATTEMPT_STARTED and "target" in e.data}
    name = destination_link(destination.id) if destination else "—"

    def went(a: Attempt) -> str:
        if a.attempt_id in recorded:
            return f"{name} · {escape(recorded[a.attempt_id])}"
        if destination is None:
            return name
        changed = destination.updated_at > a.started_at
        return (f"{name} · {escape(channels.target(destination))} <i>(not recorded; registered now"
                + ("; changed since this attempt" if changed else "") + ")</i>")

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
    return table(["#", "attempt", "fence", "started", "where", "submission", "outcome", "status", "external id", "ms"],
                 rows, numeric=("#", "fence", "status", "ms"))


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
