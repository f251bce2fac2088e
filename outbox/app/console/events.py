"""The console's events: search them by topic (or pattern), scope and id, and see one event's
fan-out, each destination's intent and its status linking to the intent's page."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ...errors import NotFound, OutboxError
from ...events import EventQuery
from ...outbox import Outbox
from .sessions import signed_page

#: How many events a search shows.
PAGE = 100


def register(pages: APIRouter, box: Callable[[Request], Outbox],
             signed_in: Callable[[Callable[..., Awaitable[Response]]], Callable[..., Awaitable[Response]]]) -> None:
    """Add the events pages to the console's router (``signed_in`` guards each)."""

    @pages.get("/events")
    @signed_in
    async def events_search(request: Request, topic: str = "", scope: str = "", event_id: str = "") -> Response:
        outbox = box(request)
        form = {"fields": [("topic", "topic or pattern (invoice.*)", topic), ("scope", "scope", scope),
                           ("event_id", "event id", event_id)], "now": outbox.clock.now()}
        try:
            found = await outbox.list_events(EventQuery(
                topic=topic or None, scopes=[scope] if scope else None, event_id=event_id or None, limit=PAGE))
        except OutboxError as exc:
            return signed_page(request, "events.html", "Events", status=400, error=exc.message, **form)
        return signed_page(request, "events.html", "Events", error="", events=found.events, **form)

    @pages.get("/events/{event_id}")
    @signed_in
    async def event_page(request: Request, event_id: str, scope: str | None = None) -> Response:
        outbox = box(request)
        try:
            event = await outbox.get_event(event_id, scope=scope)
        except OutboxError as exc:
            return signed_page(request, "error.html", "Event", error=exc.message,
                               status=404 if isinstance(exc, NotFound) else 400)
        return signed_page(request, "event.html", f"Event {event.event_id}", event=event, now=outbox.clock.now())
