"""Minting the tenant portal's links (``outbox.portal``): your application asks for one when a
user of its own opens "webhooks" in it, and sends the user's browser to its URL."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ...fields import Scope
from ...shapes import MintedPortalLink, PortalLinkIn, minted_portal_link_json
from .. import openapi
from .auth import Producer, box, in_scope

router = APIRouter(tags=["portal"])


@router.post(
    "/v1/tenants/{scope}/portal-links",
    status_code=201,
    summary="A single-use link into the tenant portal for scope, opening within minutes (admin, or a producer "
            "of the scope)",
    **openapi.doc({201: (MintedPortalLink, "minted; its URL is shown here only")}, example="PortalLinkIn",
                  errors=[*openapi.BODY_ERRORS]),
)
async def mint(spec: PortalLinkIn, request: Request, scope: Scope, token: Producer) -> Response:
    in_scope(token, scope)
    link_token, link = await box(request).mint_portal_link(token, scope, session_seconds=spec.session_seconds,
                                                           read_only=spec.read_only)
    return JSONResponse(minted_portal_link_json(link_token, link), status_code=201,
                        headers={"Cache-Control": "no-store"})
