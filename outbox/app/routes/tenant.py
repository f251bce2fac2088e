"""What a tenant does for itself, under ``/v1/tenant``, with a token of role ``tenant`` (one
scope): manage its own destinations (``Destination.owner``), read its own intents and events,
replay its own dead letters and unknowns, and send a test event to its own endpoint.

Every answer is about the token's scope only, and names nothing of another's: another scope's
destination, intent or event is answered as one that does not exist. What a tenant is shown of
its deliveries leaves out what only operators see (workers, actors, lease owners), and, for an
intent to a shared destination, whatever could tell where that destination is (the target an
attempt records, error texts and replies).
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from ... import channels, operations
from ...cursor import MAX_PAGE, encode_cursor
from ...destinations import Destination as DestinationRecord
from ...destinations import DestinationSpec
from ...errors import IllegalTransition
from ...events import EventQuery
from ...fields import DestinationId, EventId, TopicPattern
from ...ids import uuid7
from ...model import SETTLED, Intent, Status
from ...outbox import Outbox
from ...shapes import (
    ActionId,
    Destination,
    DestinationList,
    DestinationName,
    EventPage,
    IntentDetail,
    IntentHistory,
    IntentPage,
    NewSecretDestination,
    PublishedEvent,
    ReplayIn,
    RotateIn,
    TenantAccount,
    TestIn,
    destination_json,
    event_json,
    history_json,
    intent_json,
    waiting_behind_json,
)
from ...shapes import Intent as IntentAnswer
from ...store import History, IntentQuery
from ...tenants import new_destination_id
from ...timestamps import Timestamp
from .. import openapi
from .auth import Tenant, box
from .bodies import validated
from .intents import before_seq
from .operators import actor, authorize

log = logging.getLogger("outbox.api")
router = APIRouter(tags=["tenant"])

#: The statuses a tenant may replay: its dead letters and unknowns (a revoked intent waits for
#: its grant, which an operator gives back).
TENANT_REPLAYABLE = frozenset({Status.DEAD, Status.UNKNOWN})
#: What a test event's intent carries to the endpoint.
TEST_TOPIC = "outbox.test"


def scope_of(token: Tenant) -> str:
    """The one scope a tenant token acts in."""
    return token.scopes[0]


async def owned_ids(request: Request, scope: str) -> set[str]:
    """The ids of the destinations ``scope`` owns (at most ``tenant_max_destinations``)."""
    return {d.id for d in await box(request).list_destinations(owner=scope)}


def tenant_intent(intent: Intent, own: bool) -> dict[str, Any]:
    """An intent as its tenant sees it: no lease owner, and no error text unless it is of the
    tenant's own destination."""
    shown = intent_json(intent)
    del shown["lease_owner"]
    if not own:
        shown["last_error"] = None
    return shown


def tenant_history(history: History, own: bool) -> dict[str, Any]:
    """An intent's attempts and events as its tenant sees them: no workers or actors; for a shared
    destination, no replies, errors, reasons or data (they may say where it is)."""
    shown = history_json(history)
    for attempt in shown["attempts"]:
        del attempt["worker"]
        if not own:
            attempt["reply"] = attempt["error"] = None
    for event in shown["events"]:
        del event["actor"]
        if not own:
            event["reason"], event["data"] = None, {}
    return shown


async def register_own(outbox_: Outbox, scope: str, spec: DestinationSpec,
                       by: str) -> tuple[DestinationRecord, str | None]:
    """Register ``scope``'s own destination (its id made here), with a new secret unless ``spec``
    gives one: the destination, and that new secret (shown once)."""
    made = None
    if spec.secret is None and (kind := channels.get(spec.channel)).new_secret is not None:
        made = kind.new_secret()
        spec = spec.model_copy(update={"secret": made})
    destination, _ = await outbox_.put_destination(new_destination_id(), spec, owner=scope)
    log.info("destination %s created by %s", destination.id, by)
    return destination, made


async def replace_own(outbox_: Outbox, scope: str, destination_id: str, spec: DestinationSpec,
                      by: str) -> DestinationRecord:
    """Replace one of ``scope``'s destinations (one it does not own is NotFound, never made here)."""
    await outbox_.get_destination(destination_id, owner=scope)
    destination, _ = await outbox_.put_destination(destination_id, spec, owner=scope)
    log.info("destination %s replaced by %s", destination_id, by)
    return destination


async def enqueue_test(outbox_: Outbox, scope: str, destination_id: str, by: str, payload: Any = None) -> Intent:
    """Enqueue a test intent (a new action id each time) to one of ``scope``'s destinations."""
    await outbox_.get_destination(destination_id, owner=scope)
    action_id = f"test~{uuid7()}"
    if payload is None:
        payload = {"type": TEST_TOPIC, "destination": destination_id, "test_id": action_id}
    made = await outbox_.enqueue(action_id=action_id, scope=scope, destination=destination_id, actor=by,
                                 payload=payload)
    return made.intent


async def replay_dead_or_unknown(outbox_: Outbox, authorize_: operations.Authorize, scope: str, action_id: str,
                                by: operations.Actor, accept_duplicate_risk: bool) -> Intent:
    """Replay one of ``scope``'s dead or unknown intents, under the operators' duplicate-risk rule."""
    found = await outbox_.get(action_id, scope=scope)
    if found.status not in TENANT_REPLAYABLE:
        raise IllegalTransition(f"a tenant replays its dead or unknown intents; {action_id!r} is {found.status.value}"
                                + (" (an operator replays it once its grant is back)"
                                   if found.status is Status.REVOKED else ""))
    return await operations.replay(outbox_, action_id, by, scope=scope, authorize=authorize_,
                                   accept_duplicate_risk=accept_duplicate_risk)


def _spec(raw: Any) -> DestinationSpec:
    """A tenant's destination body, read as its channel's spec (as an admin's is)."""
    named = raw.get("channel", channels.DEFAULT) if isinstance(raw, dict) else channels.DEFAULT
    return validated(channels.get(named if isinstance(named, str) else channels.DEFAULT).spec, raw)


# -- the account ---------------------------------------------------------------------------


@router.get("/v1/tenant", summary="What this tenant token acts as, and its limits",
            **openapi.doc({200: TenantAccount}, errors=[403, 503]))
async def account(request: Request, token: Tenant) -> dict[str, Any]:
    settings, scope = box(request).settings, scope_of(token)
    return TenantAccount(
        scope=scope, channels=settings.tenant_channels, max_destinations=settings.tenant_max_destinations,
        max_subscriptions=settings.tenant_max_subscriptions,
        private_network=scope in settings.tenant_private_networks,
        destinations=len(await owned_ids(request, scope))).model_dump(mode="json")


# -- its destinations ------------------------------------------------------------------------


@router.get("/v1/tenant/destinations", summary="This tenant's own destinations",
            **openapi.doc({200: DestinationList}, errors=[403, 503]))
async def list_own_destinations(request: Request, token: Tenant) -> dict[str, Any]:
    return {"items": [destination_json(d) for d in await box(request).list_destinations(owner=scope_of(token))]}


@router.post(
    "/v1/tenant/destinations",
    status_code=201,
    summary="Register an endpoint of this tenant's own; its id is made here, and its secret unless given",
    openapi_extra=openapi.DESTINATION_BODY,
    **openapi.doc({201: (NewSecretDestination, "registered; the secret is shown here only")},
                  errors=[*openapi.BODY_ERRORS, 409]),
)
async def create_own_destination(request: Request, token: Tenant) -> Response:
    destination, made = await register_own(box(request), scope_of(token), _spec(await request.json()), token.actor)
    return JSONResponse({**destination_json(destination), "secret": made}, status_code=201,
                        headers={"Cache-Control": "no-store"})


@router.get("/v1/tenant/destinations/{destination_id}", summary="One of this tenant's destinations",
            **openapi.doc({200: Destination}, errors=[403, 404, 422, 503]))
async def get_own_destination(request: Request, destination_id: DestinationId, token: Tenant) -> dict[str, Any]:
    return destination_json(await box(request).get_destination(destination_id, owner=scope_of(token)))


@router.put(
    "/v1/tenant/destinations/{destination_id}",
    summary="Replace one of this tenant's destinations (a new secret starts a rotation)",
    openapi_extra=openapi.DESTINATION_BODY,
    **openapi.doc({200: (Destination, "replaced")}, errors=[*openapi.BODY_ERRORS, 404, 409]),
)
async def put_own_destination(request: Request, destination_id: DestinationId, token: Tenant) -> dict[str, Any]:
    return destination_json(await replace_own(box(request), scope_of(token), destination_id,
                                              _spec(await request.json()), token.actor))


@router.delete("/v1/tenant/destinations/{destination_id}", status_code=204,
               summary="Remove one of this tenant's destinations that no intent names (else disable it)",
               **openapi.doc({204: "deleted"}, errors=[403, 404, 409, 422, 503]))
async def delete_own_destination(request: Request, destination_id: DestinationId, token: Tenant) -> Response:
    await box(request).delete_destination(destination_id, owner=scope_of(token))
    log.info("destination %s deleted by %s", destination_id, token.actor)
    return Response(status_code=204)


@router.post(
    "/v1/tenant/destinations/{destination_id}/rotate-secret",
    summary="A new signing secret, shown here only; the previous one signs beside it for a window",
    **openapi.doc({200: (NewSecretDestination, "rotated")}, example="RotateIn", errors=[*openapi.BODY_ERRORS, 404]),
)
async def rotate_own_secret(spec: RotateIn, request: Request, destination_id: DestinationId,
                            token: Tenant) -> Response:
    destination, secret = await box(request).rotate_secret(destination_id, owner=scope_of(token),
                                                           window_seconds=spec.window_seconds)
    log.info("destination %s: secret rotated by %s", destination_id, token.actor)
    return JSONResponse({**destination_json(destination), "secret": secret}, headers={"Cache-Control": "no-store"})


@router.post(
    "/v1/tenant/destinations/{destination_id}/test",
    status_code=201,
    summary="Send a test intent to one of this tenant's destinations (a new action id each time)",
    **openapi.doc({201: (IntentAnswer, "enqueued")}, example="TestIn", errors=[*openapi.BODY_ERRORS, 404]),
)
async def send_test(spec: TestIn, request: Request, destination_id: DestinationId, token: Tenant) -> Response:
    made = await enqueue_test(box(request), scope_of(token), destination_id, token.actor, spec.payload)
    return JSONResponse(tenant_intent(made, own=True), status_code=201)


# -- its deliveries --------------------------------------------------------------------------


@router.get("/v1/tenant/intents", summary="This tenant's intents, newest first",
            **openapi.doc({200: IntentPage}, errors=[400, 403, 422, 503]))
async def list_own_intents(
    request: Request,
    token: Tenant,
    status: Annotated[list[Status] | None, Query(description="repeat for several")] = None,
    destination: DestinationName | None = None,
    created_after: Timestamp | None = None,
    created_before: Timestamp | None = None,
    cursor: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
) -> dict[str, Any]:
    scope = scope_of(token)
    page = await box(request).list_intents(IntentQuery(
        statuses=status, scopes=[scope], destination=destination, created_after=created_after,
        created_before=created_before, before_seq=before_seq(cursor), limit=limit))
    own = await owned_ids(request, scope)
    return {"items": [tenant_intent(i, i.destination in own) for i in page.intents],
            "next_cursor": encode_cursor(page.next_seq) if page.next_seq else None}


@router.get("/v1/tenant/intents/{action_id}", summary="One of this tenant's intents, with attempts and events",
            **openapi.doc({200: IntentDetail}, errors=[403, 404, 422, 503]))
async def get_own_intent(request: Request, action_id: ActionId, token: Tenant) -> dict[str, Any]:
    scope = scope_of(token)
    intent, history = await box(request).show(action_id, scope=scope)
    own = intent.destination in await owned_ids(request, scope)
    behind = await box(request).waiting_behind(intent, scopes=[scope])
    return {**tenant_intent(intent, own), "settled": intent.status in SETTLED,
            "waiting_behind": waiting_behind_json(behind) if behind else None, **tenant_history(history, own)}


@router.post("/v1/tenant/intents/{action_id}/replay",
             summary="Send one of this tenant's dead or unknown intents again (same action_id)",
             **openapi.doc({200: IntentHistory}, example="ReplayIn", errors=[*openapi.BODY_ERRORS, 404, 409]))
async def replay_own(spec: ReplayIn, request: Request, action_id: ActionId, token: Tenant) -> dict[str, Any]:
    outbox_, scope = box(request), scope_of(token)
    intent = await replay_dead_or_unknown(outbox_, authorize(request), scope, action_id, actor(token, spec.reason),
                                          spec.accept_duplicate_risk)
    own = intent.destination in await owned_ids(request, scope)
    return {**tenant_intent(intent, own), **tenant_history(await outbox_.history(action_id, scope=scope), own)}


@router.get("/v1/tenant/events", summary="This tenant's events with their fan-outs, newest first",
            **openapi.doc({200: EventPage}, errors=[400, 403, 422, 503]))
async def list_own_events(
    request: Request,
    token: Tenant,
    topic: Annotated[TopicPattern | None, Query(description="a topic, or a pattern (invoice.*)")] = None,
    created_after: Timestamp | None = None,
    created_before: Timestamp | None = None,
    cursor: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
) -> dict[str, Any]:
    page = await box(request).list_events(EventQuery(
        scopes=[scope_of(token)], topic=topic, created_after=created_after, created_before=created_before,
        before_seq=before_seq(cursor), limit=limit))
    return {"items": [event_json(e) for e in page.events],
            "next_cursor": encode_cursor(page.next_seq) if page.next_seq else None}


@router.get("/v1/tenant/events/{event_id}", summary="One of this tenant's events with its fan-out",
            **openapi.doc({200: PublishedEvent}, errors=[403, 404, 422, 503]))
async def get_own_event(request: Request, event_id: EventId, token: Tenant) -> dict[str, Any]:
    return event_json(await box(request).get_event(event_id, scope=scope_of(token)))
