"""An intent filter as the console's forms and links carry it: parsed and checked at the edge
(full-match rules; what the outbox checks itself, it checks), turned into an ``IntentQuery``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from ...errors import InvalidInput
from ...ids import ACTION_ID, check
from ...model import Status
from ...operations import REPLAYABLE
from ...store import IntentQuery

#: The time ranges a search offers, by the value its form sends.
RANGES = {"": None, "1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7)}
PAGE = 50


def _values(params: Mapping[str, Any], name: str) -> list[str]:
    """Every value of ``name`` (from query parameters or a parsed form), blanks dropped."""
    found = params.getlist(name) if hasattr(params, "getlist") else params.get(name, [])
    return [v.strip() for v in found if v.strip()]


def _one(params: Mapping[str, Any], name: str) -> str:
    found = _values(params, name)
    return found[-1] if found else ""


def _time(text: str, what: str) -> datetime | None:
    if not text:
        return None
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInput(f"{what} must be a date and time like 2026-11-30T14:05, not {text!r}") from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Filter:
    """What a search or a bulk replay narrows to; empty fields mean any."""

    action_id: str = ""
    statuses: list[Status] = field(default_factory=list)
    destination: str = ""
    scope: str = ""
    channel: str = ""
    range: str = ""
    after: datetime | None = None
    before_time: datetime | None = None
    before: int | None = None  # the page cursor
    now: datetime | None = None

    @classmethod
    def parse(cls, params: Mapping[str, Any], now: datetime) -> Filter:
        """The filter in a request's query or form. Raises InvalidInput saying what is wrong."""
        try:
            statuses = [Status(s) for s in _values(params, "status")]
        except ValueError:
            raise InvalidInput("status must be one of " + ", ".join(s.value for s in Status)) from None
        action_id = _one(params, "q")
        if action_id:
            check(ACTION_ID, action_id, "action id")
        chosen = _one(params, "range")
        if chosen not in RANGES:
            raise InvalidInput("range must be 1h, 24h or 7d")
        cursor = _one(params, "before")
        if cursor and not cursor.isdigit():
            raise InvalidInput("before must be a page cursor (a number)")
        return cls(action_id, statuses, _one(params, "destination"), _one(params, "scope"), _one(params, "channel"),
                   chosen, _time(_one(params, "after"), "after"), _time(_one(params, "before_time"), "before"),
                   int(cursor) if cursor else None, now)

    def query(self, *, before: int | None = None) -> IntentQuery:
        since = RANGES[self.range]
        after = self.after if since is None or self.now is None else max(
            filter(None, (self.after, self.now - since)))
        return IntentQuery(statuses=self.statuses or None, scopes=[self.scope] if self.scope else None,
                           destination=self.destination or None, channel=self.channel or None,
                           created_after=after, created_before=self.before_time, before_seq=before, limit=PAGE)

    def replayable(self) -> bool:
        """Whether a bulk replay can take this filter (it names only replayable statuses, or none)."""
        return not self.action_id and set(self.statuses) <= REPLAYABLE

    def fields(self) -> list[tuple[str, str]]:
        """The filter as form fields (without the cursor)."""
        pairs = [("q", self.action_id), *(("status", s.value) for s in self.statuses),
                 ("destination", self.destination), ("scope", self.scope), ("channel", self.channel),
                 ("range", self.range), ("after", self.after_text), ("before_time", self.before_text)]
        return [(k, v) for k, v in pairs if v]

    def encode(self, *, before: int | None = None) -> str:
        return urlencode(self.fields() + ([("before", str(before))] if before else []))

    @property
    def after_text(self) -> str:
        return _local(self.after)

    @property
    def before_text(self) -> str:
        return _local(self.before_time)


def _local(at: datetime | None) -> str:
    """A time as a ``datetime-local`` field shows it, in UTC."""
    return "" if at is None else at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M")

