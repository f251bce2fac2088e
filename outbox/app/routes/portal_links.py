"""Minting the tenant portal's links (``outbox.portal``): your application asks for one when a
user of its own opens "webhooks" in it, and sends the user's browser to its URL."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ...fields import Scope
from ...shapes import MintedPortalLink, PortalLinkIn
from .. import openapi
from .auth import Producer, box, in_scope

router = APIRouter(tags=["portal"])
#: Where a link opens (``outbox.app.portal``), its token as the query's ``link``.
OPEN_PATH = "/portal/open"


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
    answer = MintedPortalLink(scope=scope, url=f"{OPEN_PATH}?link={link_token}", expires_at=link.expires_at,
                              session_seconds=link.session_seconds, read_only=link.read_only)
    return JSONResponse(answer.model_dump(mode="json"), status_code=201, headers={"Cache-Control": "no-store"})
