"""Topics, the patterns destinations subscribe with, and the action ids of an event's intents.

The grammar (every rule applied with ``re.fullmatch``):

- a **topic** is one to eight dot-separated segments of ``[a-z0-9_-]``, at most 200 characters:
  ``invoice.paid``, ``user.signed_up``;
- a **pattern** is a topic (it matches that topic only), a topic followed by ``.*`` (it matches
  every topic under that prefix, at any depth: ``invoice.*`` matches ``invoice.paid`` and
  ``invoice.paid.late`` but neither ``invoice`` nor ``invoices.paid``), or ``*`` alone (every
  topic).

A store matches with SQL over the rows ``subscription_rows`` gives (an exact topic, or a prefix
ending in ``.``, empty for ``*``), which ``matches`` says in Python: the two agree by
construction and the conformance suite checks them against each other.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import InvalidInput
from .ids import DESTINATION_ID, check

TOPIC = re.compile(r"(?=.{1,200}$)[a-z0-9_-]+(?:\.[a-z0-9_-]+){0,7}")
PATTERN = re.compile(r"\*|(?=.{1,202}$)[a-z0-9_-]+(?:\.[a-z0-9_-]+){0,7}(?:\.\*)?")
#: An event's id: as an action id, shorter, so that its intents' derived action ids fit (``action_id_for``).
EVENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:~-]{0,127}")
#: What every action id of an event's intent starts with; producers' own ids do not, in practice.
FANOUT_PREFIX = "evt~"
#: The most subscriptions one destination holds.
MAX_SUBSCRIPTIONS = 50


@dataclass(frozen=True, slots=True)
class Subscription:
    """A destination's interest in the topics ``pattern`` matches, for the scopes named (None:
    every scope that holds a grant for the destination)."""

    pattern: str
    scopes: tuple[str, ...] | None = None

    def json(self) -> dict[str, Any]:
        """As the API shows and the store keeps it."""
        return {"topic": self.pattern, "scopes": None if self.scopes is None else list(self.scopes)}


def checked_topic(value: str, what: str = "topic") -> str:
    """``value`` if it is a topic, else InvalidInput naming ``what`` and the grammar."""
    if not isinstance(value, str) or not TOPIC.fullmatch(value):
        raise InvalidInput(f"{what} {value!r} is malformed: expected 1-8 dot-separated segments of a-z, 0-9, _ "
                           "and -, at most 200 characters (invoice.paid)")
    return value


def checked_pattern(value: str, what: str = "topic") -> str:
    """``value`` if it is a pattern, else InvalidInput naming ``what`` and the grammar."""
    if not isinstance(value, str) or not PATTERN.fullmatch(value):
        raise InvalidInput(f"{what} {value!r} is malformed: expected a topic (invoice.paid), a topic followed by "
                           ".* for every topic under it (invoice.*), or * for every topic")
    return value


def matches(pattern: str, topic: str) -> bool:
    """Whether ``pattern`` matches ``topic`` (both already valid)."""
    if pattern == "*":
        return True
    if pattern.endswith(".*"):
        return topic.startswith(pattern[:-1])
    return pattern == topic


def subscription_rows(destination: str, subscriptions: Sequence[Subscription]) -> list[list[object]]:
    """The rows a store matches topics against: ``[destination, prefix, exact, scope]``, one per
    pattern and scope (scope None: any), ``prefix`` the whole topic when ``exact``, else what a
    matching topic starts with."""
    rows: list[list[object]] = []
    for sub in subscriptions:
        exact = not sub.pattern.endswith("*")
        prefix = sub.pattern if exact else sub.pattern[:-1]
        for scope in sub.scopes if sub.scopes is not None else (None,):
            rows.append([destination, prefix, exact, scope])
    return rows


def action_id_for(event_id: str, destination: str) -> str:
    """The action id of the intent an event makes for a destination: ``evt~<event_id>~<destination>``,
    deterministic (publishing again and an operator's deliver find the same intent) and unique per
    pair (a destination id holds no ``~``, so the last ``~`` splits it). At most 197 characters."""
    check(DESTINATION_ID, destination, "destination")
    return f"{FANOUT_PREFIX}{event_id}~{destination}"
