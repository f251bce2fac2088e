"""Who may call a route: a bearer token of the right role, acting in the scopes it holds."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ...model import Role
from ...outbox import Outbox
from ...tokens import TokenInfo
from ..problems import Problem


def box(request: Request) -> Outbox:
    """The outbox the application serves."""
    return request.app.state.outbox


CHALLENGE = {"WWW-Authenticate": 'Bearer realm="outbox"'}


#: The request's bearer token (None when it sends none), as the document's ``bearer`` scheme.
BEARER = HTTPBearer(scheme_name="bearer", auto_error=False,
                    description="an API token (`outbox tokens create`): producer, operator, admin or tenant")
Bearer = Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)]


def unauthenticated(detail: str) -> Problem:
    """The 401 for a request without a token it may use."""
    return Problem(401, "unauthenticated", "Unauthenticated", detail, headers=CHALLENGE)


def role(*allowed: Role) -> Callable[..., Coroutine[Any, Any, TokenInfo]]:
    """A dependency answering with the caller's token when its role is one of ``allowed`` (an
    admin's always is); a missing, unknown or revoked token is a 401, another role a 403."""

    async def authorize(request: Request, bearer: Bearer) -> TokenInfo:
        if bearer is None:
            raise unauthenticated("send 'Authorization: Bearer <token>'; create one with `outbox tokens create`")
        return await authorized(request, bearer.credentials, *allowed)

    return authorize


async def authorized(request: Request, token: str, *allowed: Role) -> TokenInfo:
    """The active API token ``token`` is, if its role is one of ``allowed`` (or admin); a 401
    for an unknown or revoked token, a 403 for another role."""
    info = await box(request).authenticate(token)
    if info is None:
        raise unauthenticated("the bearer token is unknown or revoked")
    if info.role not in allowed and info.role is not Role.ADMIN:
        names = " or ".join(r.value for r in allowed)
        raise Problem(
            403, "forbidden", "Forbidden",
            f"a token of role {info.role.value} cannot do this; it needs role {names}",
        )
    return info


async def tenant(request: Request, bearer: Bearer) -> TokenInfo:
    """A dependency answering with the caller's token when it is a tenant's: the ``/v1/tenant``
    routes act in the token's one scope, so no other role (an admin's neither) may call them."""
    if bearer is None:
        raise unauthenticated("send 'Authorization: Bearer <token>'; create one with `outbox tokens create`")
    info = await box(request).authenticate(bearer.credentials)
    if info is None:
        raise unauthenticated("the bearer token is unknown or revoked")
    if info.role is not Role.TENANT:
        raise Problem(403, "forbidden", "Forbidden",
                      f"the /v1/tenant routes act as one tenant: they need a token of role tenant, not "
                      f"{info.role.value} (operators and admins use the other /v1 routes)")
    return info


Tenant = Annotated[TokenInfo, Depends(tenant)]
Producer = Annotated[TokenInfo, Depends(role(Role.PRODUCER))]
Reader = Annotated[TokenInfo, Depends(role(Role.PRODUCER, Role.OPERATOR))]
Admin = Annotated[TokenInfo, Depends(role(Role.ADMIN))]
Operator = Annotated[TokenInfo, Depends(role(Role.OPERATOR))]


def readable(token: TokenInfo) -> list[str] | None:
    """The scopes whose intents a token may read (None: every scope)."""
    return None if token.role is not Role.PRODUCER or "*" in token.scopes else list(token.scopes)


def in_scope(token: TokenInfo, scope: str) -> None:
    """Refuse (403) unless the token may act in ``scope``."""
    if not token.may_act_in(scope):
        raise Problem(
            403, "forbidden-scope", "Forbidden scope",
            f"this token may act in scopes {list(token.scopes)}, not {scope!r}",
        )
