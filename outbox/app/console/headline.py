"""The overview's headline: what needs someone now, counted, each count a link to the list of
those things. Circuits are counted only where they are known (the sender in this process);
elsewhere the headline says they are not known here rather than show a reassuring zero."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

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


@dataclass(frozen=True)
class Item:
    """One count of the headline and the list it links to; a count of None says it is not known here.
    A count above zero is drawn in its ``tone`` (``bad``: intents; ``warn``: destinations)."""

    count: int | None
    label: str
    href: str
    tone: str = "bad"


@dataclass(frozen=True)
class Headline:
    """The items, and whether nothing they count needs an operator."""

    items: list[Item]
    calm: bool


def headline(request: Request, counts: Mapping[str, int], destinations: list[Destination], now: datetime) -> Headline:
    """The headline, from the intents by status and the destinations."""
    items = [Item(counts.get(s.value, 0), label, f"/console/intents?status={s.value}") for s, label in STATUSES]
    states = [circuit_state(request, d, now)[0] for d in destinations]
    for state, label in STATES:
        if state == "open" and circuits_here(request) is None:
            items.append(Item(None, "circuits: not known here (no sender in this process)", "/console/destinations"))
            continue
        items.append(Item(states.count(state), label, f"/console/destinations?state={state}", "warn"))
    attention = sum(counts.get(s.value, 0) for s, _ in STATUSES) + sum(s in {state for state, _ in STATES}
                                                                       for s in states)
    return Headline(items, calm=not attention)
