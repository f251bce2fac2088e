"""Who may call a route: a bearer token of the right role, acting in the scopes it holds."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, Request

from ..model import Role
from ..outbox import Outbox
from ..problems import Problem
from ..tokens import TokenInfo


def box(request: Request) -> Outbox:
    """The outbox the application serves."""
    return request.app.state.outbox


def role(*allowed: Role) -> Callable[[Request], Coroutine[Any, Any, TokenInfo]]:
    """A dependency answering with the caller's token when its role is one of ``allowed`` (an
    admin's always is); a missing, unknown or revoked token is a 401, another role a 403."""
    names = " or ".join(r.value for r in allowed)

    async def authorize(request: Request) -> TokenInfo:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        challenge = {"WWW-Authenticate": 'Bearer realm="outbox"'}
        if scheme.lower() != "bearer" or not token.strip():
            raise Problem(
                401, "unauthenticated", "Unauthenticated",
                "send 'Authorization: Bearer <token>'; create one with `outbox tokens create`",
                headers=challenge,
            )
        info = await box(request).authenticate(token.strip())
        if info is None:
            raise Problem(
                401, "unauthenticated", "Unauthenticated",
                "the bearer token is unknown or revoked", headers=challenge,
            )
        if info.role not in allowed and info.role is not Role.ADMIN:
            raise Problem(
                403, "forbidden", "Forbidden",
                f"a token of role {info.role.value} cannot do this; it needs role {names}",
            )
        return info

    return authorize


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
