"""Where the console's pages are: an intent's (and its actions'), a destination's and an event's,
each naming the scope its id is unique in. The templates call these (``templates.ENV``'s
globals); the actions redirect to them."""

from __future__ import annotations

from urllib.parse import quote, urlencode


def intent_url(action_id: str, scope: str | None, action: str = "", **query: str) -> str:
    """An intent's console page (or one of its actions), naming its scope: action ids are unique
    per scope only."""
    path = f"/console/intents/{quote(action_id, safe='')}" + (f"/{action}" if action else "")
    params = ({"scope": scope} if scope else {}) | query
    return path + ("?" + urlencode(params) if params else "")


def destination_url(destination_id: str) -> str:
    return f"/console/destinations/{quote(destination_id, safe='')}"


def event_url(event_id: str, scope: str) -> str:
    """An event's console page, naming its scope: event ids are unique per scope only."""
    return f"/console/events/{quote(event_id, safe='')}?{urlencode({'scope': scope})}"

