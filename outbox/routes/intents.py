"""What producers do: enqueue an intent, read one back (long-polling until it is settled), and
list them; a producer's token reaches only its own scopes."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from .. import openapi, tracing
from ..cursor import decode_cursor, encode_cursor
from ..model import SETTLED, Enqueued, Intent, Status
from ..outbox import MAX_PAGE
from ..problems import Problem
from ..shapes import (
    MAX_BATCH,
    ActionId,
    BatchIn,
    BatchResult,
    DestinationName,
    IntentDetail,
    IntentIn,
    IntentPage,
    Scope,
    history_json,
    intent_json,
    waiting_behind_json,
)
from ..shapes import Intent as IntentAnswer
from ..store import IntentQuery
from ..timestamps import Timestamp
from .auth import Producer, Reader, box, in_scope, readable
from .batches import answer_each

router = APIRouter(tags=["intents"])

#: The longest a client may long-poll one intent.
MAX_WAIT_SECONDS = 60.0
ScopeParam = Annotated[Scope | None, Query(description=(
    "the intent's scope; needed only when the action id is used in several scopes you can read"))]


def location(intent: Intent) -> str:
    """Where an intent is read: action ids are unique per scope, so the scope is part of it."""
    return f"/v1/intents/{intent.action_id}?scope={quote(intent.scope, safe='')}"


def before_seq(cursor: str | None) -> int | None:
    """The seq a listing's ``cursor`` continues after (a 400 problem if it is not one of ours)."""
    try:
        return decode_cursor(cursor) if cursor else None
    except ValueError as exc:
        raise Problem(400, "bad-cursor", "Bad cursor", str(exc)) from None


@router.post(
    "/v1/intents",
    status_code=201,
    summary="Enqueue an intent (idempotent on action_id)",
    **openapi.doc(
        {201: (IntentAnswer, "enqueued"), 200: (IntentAnswer, "the same intent already exists")},
        example="IntentIn", errors=[*openapi.BODY_ERRORS, 409], headers=dict.fromkeys((200, 201), openapi.LOCATION)),
)
async def enqueue(spec: IntentIn, request: Request, token: Producer) -> Response:
    in_scope(token, spec.scope)
    result = await box(request).enqueue(actor=token.actor, **traced(spec, request))
    return JSONResponse(
        intent_json(result.intent),
        status_code=201 if result.created else 200,
        headers={"Location": location(result.intent)},
    )


@router.post(
    "/v1/intents:batch",
    summary=f"Enqueue up to {MAX_BATCH} intents, each with its own answer, in one durable commit",
    **openapi.doc({200: BatchResult}, example="BatchIn", errors=[*openapi.BODY_ERRORS]),
)
async def enqueue_batch(batch: BatchIn, request: Request, token: Producer) -> Response:
    return await answer_each(batch.intents, IntentIn, token, lambda spec: traced(spec, request),
                             box(request).enqueue_each, _enqueued)


def traced(spec: IntentIn, request: Request) -> dict[str, Any]:
    """The fields the producer sent (null included; no copy of the payload), with the trace
    context it goes with: the item's own ``traceparent`` and ``tracestate``, else the request's
    headers (as read; ``tracing.created`` ignores a malformed one)."""
    sent = {name: getattr(spec, name) for name in spec.model_fields_set if name not in tracing.FIELDS}
    if spec.traceparent is None:
        sent["trace_context"] = trace_headers(request)
    else:
        sent["trace_context"] = {name: value for name in tracing.FIELDS if (value := getattr(spec, name)) is not None}
    return sent


def trace_headers(request: Request) -> dict[str, str]:
    """The request's W3C ``traceparent`` and ``tracestate`` headers, as sent."""
    return {name: value for name in tracing.FIELDS if (value := request.headers.get(name)) is not None}


def _enqueued(outcome: Enqueued) -> dict[str, Any]:
    """One enqueued item's answer in a batch: the status the single enqueue would have answered,
    with the intent (less the payload the caller sent: its digest is there)."""
    return {"status": 201 if outcome.created else 200, "intent": intent_json(outcome.intent, payload=False)}


@router.get("/v1/intents/{action_id}", summary="An intent with attempts and events",
            **openapi.doc({200: IntentDetail}, errors=[404, 409, 422, 503]))
async def get_intent(
    request: Request,
    action_id: ActionId,
    token: Reader,
    scope: ScopeParam = None,
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT_SECONDS, description=(
        "long-poll: answer once the intent is delivered, dead, revoked, unknown or "
        "cancelled, or after this many seconds"))] = 0,
) -> dict[str, Any]:
    outbox_ = box(request)
    if wait:
        scope = (await outbox_.get(action_id, scope=scope, scopes=readable(token))).scope
        await outbox_.wait(action_id, wait, scope=scope)
    intent, history = await outbox_.show(action_id, scope=scope, scopes=readable(token))
    behind = await outbox_.waiting_behind(intent, scopes=readable(token))
    return {**intent_json(intent), "settled": intent.status in SETTLED,
            "waiting_behind": waiting_behind_json(behind) if behind else None, **history_json(history)}


@router.get("/v1/intents", summary="List intents, newest first",
            **openapi.doc({200: IntentPage}, errors=[400, 403, 422, 503]))
async def list_intents(
    request: Request,
    token: Reader,
    status: Annotated[list[Status] | None, Query(description="repeat for several")] = None,
    scope: Annotated[list[Scope] | None, Query(description="repeat for several")] = None,
    destination: DestinationName | None = None,
    channel: Annotated[str | None, Query(description="an installed channel's name")] = None,
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
    page = await box(request).list_intents(
        IntentQuery(
            statuses=status,
            scopes=scopes,
            destination=destination,
            channel=channel,
            created_after=created_after,
            created_before=created_before,
            before_seq=before_seq(cursor),
            limit=limit,
        )
    )
    return {
        "items": [intent_json(i) for i in page.intents],
        "next_cursor": encode_cursor(page.next_seq) if page.next_seq else None,
    }
