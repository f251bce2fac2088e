"""The registry admins manage and operators read: destinations (where effects may go) and
grants (which scope may reach which destination)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ... import channels
from ...fields import DestinationId, GrantId
from ...grants import GrantSpec
from ...shapes import (
    Destination,
    DestinationList,
    Grant,
    GrantList,
    NewSecretDestination,
    RotateIn,
    destination_json,
    grant_json,
)
from .. import openapi
from .auth import Admin, Operator, box
from .bodies import validated

log = logging.getLogger("outbox.api")

destinations = APIRouter(tags=["destinations"])
grants = APIRouter(tags=["grants"])


# -- destinations --------------------------------------------------------------------------


@destinations.put(
    "/v1/destinations/{destination_id}",
    summary="Register or replace a destination (admin)",
    openapi_extra=openapi.DESTINATION_BODY,
    **openapi.doc({201: (Destination, "registered"), 200: (Destination, "replaced")}, errors=openapi.BODY_ERRORS),
)
async def put_destination(request: Request, destination_id: DestinationId, token: Admin) -> Response:
    raw = await request.json()  # JSON within its limits (``bodies``), read as its channel's spec
    named = raw.get("channel", channels.DEFAULT) if isinstance(raw, dict) else channels.DEFAULT
    # the channel's spec checks its settings and its secret's form (and a channel that is no name)
    spec = validated(channels.get(named if isinstance(named, str) else channels.DEFAULT).spec, raw)
    destination, created = await box(request).put_destination(destination_id, spec)
    log.info("destination %s %s by %s", destination_id, "created" if created else "replaced", token.actor)
    return JSONResponse(destination_json(destination), status_code=201 if created else 200)


@destinations.post(
    "/v1/destinations/{destination_id}/rotate-secret",
    summary="A new signing secret made here, shown here only; the previous one signs beside it for a window (admin)",
    **openapi.doc({200: (NewSecretDestination, "rotated")}, example="RotateIn", errors=[*openapi.BODY_ERRORS, 404]),
)
async def rotate_secret(spec: RotateIn, request: Request, destination_id: DestinationId, token: Admin) -> Response:
    destination, secret = await box(request).rotate_secret(destination_id, window_seconds=spec.window_seconds)
    log.info("destination %s: secret rotated by %s", destination_id, token.actor)
    return JSONResponse({**destination_json(destination), "secret": secret}, headers={"Cache-Control": "no-store"})


@destinations.get("/v1/destinations/{destination_id}", summary="A destination",
                  **openapi.doc({200: Destination}, errors=[403, 404, 422, 503]))
async def get_destination(request: Request, destination_id: DestinationId, token: Operator) -> dict[str, Any]:
    return destination_json(await box(request).get_destination(destination_id))


@destinations.get("/v1/destinations", summary="Every destination",
                  **openapi.doc({200: DestinationList}, errors=[403, 503]))
async def list_destinations(request: Request, token: Operator) -> dict[str, Any]:
    return {"items": [destination_json(d) for d in await box(request).list_destinations()]}


@destinations.delete(
    "/v1/destinations/{destination_id}",
    status_code=204,
    summary="Remove a destination no intent refers to (admin)",
    **openapi.doc({204: "deleted"}, errors=[403, 404, 409, 422, 503]),
)
async def delete_destination(request: Request, destination_id: DestinationId, token: Admin) -> Response:
    await box(request).delete_destination(destination_id)
    log.info("destination %s deleted by %s", destination_id, token.actor)
    return Response(status_code=204)


# -- grants --------------------------------------------------------------------------------


@grants.put(
    "/v1/grants/{grant_id}",
    summary="Create or replace a grant (admin); its revision goes up",
    **openapi.doc({201: (Grant, "created"), 200: (Grant, "replaced")}, example="GrantSpec",
                  errors=openapi.BODY_ERRORS),
)
async def put_grant(spec: GrantSpec, request: Request, grant_id: GrantId, token: Admin) -> Response:
    grant, created = await box(request).put_grant(grant_id, spec)
    log.info("grant %s %s by %s", grant_id, "created" if created else "replaced", token.actor)
    return JSONResponse(grant_json(grant), status_code=201 if created else 200)


@grants.get("/v1/grants/{grant_id}", summary="A grant",
            **openapi.doc({200: Grant}, errors=[403, 404, 422, 503]))
async def get_grant(request: Request, grant_id: GrantId, token: Operator) -> dict[str, Any]:
    return grant_json(await box(request).get_grant(grant_id))


@grants.get("/v1/grants", summary="Every grant",
            **openapi.doc({200: GrantList}, errors=[403, 503]))
async def list_grants(request: Request, token: Operator) -> dict[str, Any]:
    return {"items": [grant_json(g) for g in await box(request).list_grants()]}


@grants.delete("/v1/grants/{grant_id}", status_code=204,
               summary="Remove a grant (admin): later sends it allowed become revoked",
               **openapi.doc({204: "deleted"}, errors=[403, 404, 422, 503]))
async def delete_grant(request: Request, grant_id: GrantId, token: Admin) -> Response:
    await box(request).delete_grant(grant_id)
    log.info("grant %s deleted by %s", grant_id, token.actor)
    return Response(status_code=204)
