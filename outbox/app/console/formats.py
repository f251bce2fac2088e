"""How a value reads on a console page, as the templates' filters (``templates.ENV``): times
relative to now and exact, stored replies pretty-printed, a record's field as text. Each
returns plain text; the template escapes it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any


def ago(at: datetime, now: datetime) -> str:
    """``at`` relative to ``now``: "3 min ago", "in 20 s", "just now"."""
    seconds = (now - at).total_seconds()
    away = abs(seconds)
    if away < 5:
        return "just now"
    amount = (f"{away:.0f} s" if away < 60 else f"{away // 60:.0f} min" if away < 3600
              else f"{away // 3600:.0f} h" if away < 2 * 86_400 else f"{away // 86_400:.0f} days")
    return f"{amount} ago" if seconds > 0 else f"in {amount}"


def exact(at: datetime) -> str:
    """``at`` to the millisecond, with its zone's name (what a time shows on hover)."""
    return (at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " " + (at.tzname() or "")).strip()


def pretty(text: str | None) -> str:
    """A stored reply or payload to show in a ``<pre>``: JSON indented, and JSON held in a string
    (a webhook reply's ``body``) unwrapped, so nothing shows escaped twice; anything else as it came."""
    if not text:
        return ""
    try:
        value = _unwrapped(json.loads(text))
    except ValueError:
        return text
    return json.dumps(value, indent=2, ensure_ascii=False)


def _unwrapped(value: Any, depth: int = 0) -> Any:
    """``value`` with strings that hold a JSON object or array decoded (two levels deep)."""
    if isinstance(value, str) and value.lstrip()[:1] in ("{", "[") and depth < 2:
        try:
            return _unwrapped(json.loads(value), depth + 1)
        except ValueError:
            return value
    if isinstance(value, dict):
        return {k: _unwrapped(v, depth) for k, v in value.items()}
    return value


def text(value: Any) -> str:
    """A field's value as text: a string as it is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def indented(data: Mapping[str, Any]) -> str:
    """A record's whole data as indented JSON (an event's, folded under its timeline row)."""
    return json.dumps(dict(data), indent=2)

