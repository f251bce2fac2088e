"""API tokens over HTTP (admin): what ``outbox tokens`` does on the host, for remote admins.

The same operations as the CLI's (``Outbox.create_token``, ``list_tokens``, ``revoke_token``),
which log who made or revoked each token; a new token's text is in the creating answer only.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from .. import openapi
from ..fields import TokenId
from ..shapes import NewToken, Token, TokenList, token_json
from ..tokens import TokenSpec
from .auth import Admin, box

router = APIRouter(tags=["tokens"])


@router.post(
    "/v1/tokens",
    status_code=201,
    summary="Create a token (admin); its text is in this answer only",
    **openapi.doc({201: (NewToken, "created")}, example="TokenSpec", errors=openapi.BODY_ERRORS),
)
async def create_token(spec: TokenSpec, request: Request, token: Admin) -> Response:
    text, info = await box(request).create_token(spec.role, spec.scopes, spec.label, actor=token.actor)
    return JSONResponse({"token": text, **token_json(info)}, status_code=201,
                        headers={"Cache-Control": "no-store"})


@router.get("/v1/tokens", summary="Every token, active and revoked, never their text (admin)",
            **openapi.doc({200: TokenList}, errors=[403, 503]))
async def list_tokens(request: Request, token: Admin) -> dict[str, Any]:
    return {"items": [token_json(i) for i in await box(request).list_tokens()]}


@router.delete(
    "/v1/tokens/{token_id}",
    summary="Revoke a token (admin): refused from now on (by other processes within token_cache_seconds)",
    **openapi.doc({200: (Token, "revoked")}, errors={
        **{code: openapi.WHEN[code] for code in (403, 404, 422, 503)},
        409: "`last-admin`: the last active admin token (the caller's own included) is never revoked over "
             "the API; create another admin token first"}),
)
async def revoke_token(request: Request, token_id: TokenId, token: Admin) -> dict[str, Any]:
    return token_json(await box(request).revoke_token(token_id, actor=token.actor))
