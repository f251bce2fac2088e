"""Events: a producer publishes one (or a batch), and reads them back with their fan-outs; an
operator delivers an existing event to one more destination. Scopes as for intents."""

from __future__ import annotations

import logging
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from .. import openapi
from ..cursor import MAX_PAGE, encode_cursor
from ..events import EventQuery, Published, StoredEvent
from ..fields import EventId, Scope, TopicPattern
from ..shapes import (
    MAX_BATCH,
    DeliverIn,
    EventBatchIn,
    EventBatchResult,
    EventIn,
    EventPage,
    PublishedEvent,
    event_json,
)
from ..timestamps import Timestamp
from .auth import Operator, Producer, Reader, box, in_scope, readable
from .batches import answer_each
from .intents import before_seq, trace_headers

log = logging.getLogger("outbox.api")
router = APIRouter(tags=["events"])

EventScope = Annotated[Scope | None, Query(description=(
    "the event's scope; needed only when the event id is used in several scopes you can read"))]


def location(event: StoredEvent) -> str:
    """Where an event is read: event ids are unique per scope, so the scope is part of it."""
    return f"/v1/events/{event.event_id}?scope={quote(event.scope, safe='')}"


def _answer(result: Published) -> Response:
    return JSONResponse(event_json(result.event), status_code=201 if result.created else 200,
                        headers={"Location": location(result.event)})


@router.post(
    "/v1/events",
    status_code=201,
    summary="Publish an event: one intent per subscribed destination, in one commit (idempotent on event_id)",
    **openapi.doc(
        {201: (PublishedEvent, "published"), 200: (PublishedEvent, "the same event was published already")},
        example="EventIn", errors=[*openapi.BODY_ERRORS, 409], headers=dict.fromkeys((200, 201), openapi.LOCATION)),
)
async def publish(spec: EventIn, request: Request, token: Producer) -> Response:
    in_scope(token, spec.scope)
    return _answer(await box(request).publish(actor=token.actor, **_sent(spec, request)))


def _sent(spec: EventIn, request: Request) -> dict[str, Any]:
    """The fields the producer sent (null included), with the request's trace context."""
    return {"trace_context": trace_headers(request), **{name: getattr(spec, name) for name in spec.model_fields_set}}


@router.post(
    "/v1/events:batch",
    summary=f"Publish up to {MAX_BATCH} events, each with its own answer, in one durable commit",
    **openapi.doc({200: EventBatchResult}, example="EventBatchIn", errors=[*openapi.BODY_ERRORS]),
)
async def publish_batch(batch: EventBatchIn, request: Request, token: Producer) -> Response:
    return await answer_each(batch.events, EventIn, token, lambda spec: _sent(spec, request),
                             box(request).publish_each, _published)


def _published(outcome: Published) -> dict[str, Any]:
    """One published item's answer in a batch: the status publishing it alone would have
    answered, with the event (less the payload the caller sent)."""
    return {"status": 201 if outcome.created else 200, "event": event_json(outcome.event, payload=False)}


@router.get("/v1/events/{event_id}", summary="An event with its fan-out: each destination's intent and status",
            **openapi.doc({200: PublishedEvent}, errors=[404, 409, 422, 503]))
async def get_event(request: Request, event_id: EventId, token: Reader, scope: EventScope = None) -> dict[str, Any]:
    return event_json(await box(request).get_event(event_id, scope=scope, scopes=readable(token)))


@router.get("/v1/events", summary="List events with their fan-outs, newest first",
            **openapi.doc({200: EventPage}, errors=[400, 403, 422, 503]))
async def list_events(
    request: Request,
    token: Reader,
    scope: Annotated[list[Scope] | None, Query(description="repeat for several")] = None,
    topic: Annotated[TopicPattern | None, Query(description="a topic, or a pattern (invoice.*)")] = None,
    event_id: EventId | None = None,
    created_after: Timestamp | None = None,
    created_before: Timestamp | None = None,
    cursor: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
) -> dict[str, Any]:
    scopes: list[str] | None = scope
    if (allowed := readable(token)) is not None:
        for wanted in scope or []:
            in_scope(token, wanted)
        scopes = scope or allowed
    page = await box(request).list_events(EventQuery(
        scopes=scopes, topic=topic, event_id=event_id, created_after=created_after, created_before=created_before,
        before_seq=before_seq(cursor), limit=limit))
    return {"items": [event_json(e) for e in page.events],
            "next_cursor": encode_cursor(page.next_seq) if page.next_seq else None}


@router.post(
    "/v1/events/{event_id}/deliver",
    summary="Deliver an existing event to one destination now (operator): its intent, made unless it exists",
    **openapi.doc({201: (PublishedEvent, "the destination's intent was made"),
                   200: (PublishedEvent, "the destination had its intent already")},
                  example="DeliverIn", errors=[*openapi.BODY_ERRORS, 404, 409],
                  headers=dict.fromkeys((200, 201), openapi.LOCATION)),
)
async def deliver(spec: DeliverIn, request: Request, event_id: EventId, token: Operator,
                  scope: EventScope = None) -> Response:
    made, event = await box(request).deliver_event(event_id, spec.destination, scope=scope, actor=token.actor,
                                                   reason=spec.reason)
    log.info("event %s delivered to %s by %s", event_id, spec.destination, token.actor)
    return _answer(Published(event, made.created))
