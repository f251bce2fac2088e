"""The overview's headline: what needs someone now, counted, each count a link to the list of
those things. Circuits are counted only where they are known (the sender in this process);
elsewhere the headline says they are not known here rather than show a reassuring zero."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from html import escape

from fastapi import Request

from ...destinations import Destination
from ...model import Status
from .destination import circuit_state, circuits_here

#: The statuses the headline counts: each waits for an operator.
STATUSES = ((Status.DEAD, "dead"), (Status.UNKNOWN, "unknown outcome"), (Status.HELD, "held for approval"),
            (Status.REVOKED, "revoked"))
#: The destination states it counts, by how the destinations list filters them.
STATES = (("open", "circuit open"), ("paused", "paused"), ("disabled", "disabled"),
          ("unusable", "settings unusable"))


def _item(count: int, label: str, href: str, bad: str = "bad") -> str:
    tone = f" class='{bad}'" if count else ""
    return f"<li{tone}><a href='{escape(href)}'><b>{count}</b>{escape(label)}</a></li>"


def headline(request: Request, counts: Mapping[str, int], destinations: list[Destination], now: datetime) -> str:
    """The headline, from the intents by status and the destinations."""
    items = [_item(counts.get(s.value, 0), label, f"/console/intents?status={s.value}") for s, label in STATUSES]
    states = [circuit_state(request, d, now)[0] for d in destinations]
    for state, label in STATES:
        if state == "open" and circuits_here(request) is None:
            items.append("<li><a class='quiet' href='/console/destinations'>circuits: not known here "
                         "(no sender in this process)</a></li>")
            continue
        items.append(_item(states.count(state), label, f"/console/destinations?state={state}", "warn"))
    attention = sum(counts.get(s.value, 0) for s, _ in STATUSES) + sum(s in {state for state, _ in STATES}
                                                                       for s in states)
    summary = "<p class='calm'>Nothing counted here needs an operator.</p>" if not attention else ""
    return f"<ul class='headline' aria-label='needs attention'>{''.join(items)}</ul>{summary}"
