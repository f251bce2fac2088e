"""The console's events: search them by topic (or pattern), scope and id, and see one event's
fan-out, each destination's intent and its status linking to the intent's page."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from html import escape
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import Response
from markupsafe import Markup

from ...errors import NotFound, OutboxError
from ...events import EventQuery, StoredEvent
from ...outbox import Outbox
from .layout import destination_link, flashes, intent_link, pill, pretty, table, when
from .sessions import signed_page
from .templates import render

#: How many events a search shows.
PAGE = 100


def event_url(event_id: str, scope: str) -> str:
    """An event's console page, naming its scope: event ids are unique per scope only."""
    return f"/console/events/{quote(event_id, safe='')}?{urlencode({'scope': scope})}"


def register(pages: APIRouter, box: Callable[[Request], Outbox],
             signed_in: Callable[[Callable[..., Awaitable[Response]]], Callable[..., Awaitable[Response]]]) -> None:
    """Add the events pages to the console's router (``signed_in`` guards each)."""

    @pages.get("/events")
    @signed_in
    async def events_search(request: Request, topic: str = "", scope: str = "", event_id: str = "") -> Response:
        outbox = box(request)
        form = _form(topic, scope, event_id)
        try:
            found = await outbox.list_events(EventQuery(
                topic=topic or None, scopes=[scope] if scope else None, event_id=event_id or None, limit=PAGE))
        except OutboxError as exc:
            return signed_page(request, "Events", form + flashes(error=exc.message), status=400)
        return signed_page(request, "Events", form + _events(found.events, outbox.clock.now()))

    @pages.get("/events/{event_id}")
    @signed_in
    async def event_page(request: Request, event_id: str, scope: str | None = None) -> Response:
        outbox = box(request)
        try:
            event = await outbox.get_event(event_id, scope=scope)
        except OutboxError as exc:
            return signed_page(request, "Event", flashes(error=exc.message),
                               status=404 if isinstance(exc, NotFound) else 400)
        return signed_page(request, f"Event {event.event_id}", _event(event, outbox.clock.now()))


def _form(topic: str, scope: str, event_id: str) -> str:
    return render("events_form.html", fields=[("topic", "topic or pattern (invoice.*)", topic),
                                              ("scope", "scope", scope), ("event_id", "event id", event_id)])


def _events(events: list[StoredEvent], now: datetime) -> str:
    return table(["event_id", "scope", "topic", "published", "fan-out"], [
        [f"<a href='{escape(event_url(e.event_id, e.scope))}'>{escape(e.event_id)}</a>", escape(e.scope),
         escape(e.topic), when(e.created_at, now),
         " ".join(pill(d.status.value if d.status else "skipped") for d in e.fanout) or "no subscriber"]
        for e in events], empty="no events match")


def _event(event: StoredEvent, now: datetime) -> str:
    fanout = table(["destination", "intent", "status"], [
        [destination_link(d.destination), intent_link(d.action_id, event.scope), pill(d.status.value)] if d.status
        else [destination_link(d.destination), escape(d.action_id), f"{pill('skipped')} {escape(d.skipped or '')}"]
        for d in event.fanout], empty="no destination was subscribed and granted")
    return render("event.html", event=event, published=Markup(when(event.created_at, now)), fanout=Markup(fanout),
                  payload=Markup(pretty(event.payload_json)))
