"""A batch's answer, for intents and events alike: each item is validated and scope-checked on its
own (a refused item answers with the status and problem it alone would get, and stops no other),
the accepted ones are made in one durable commit, and each result goes back in its item's place."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from fastapi.responses import Response
from pydantic import BaseModel
from pydantic_core import to_json

from ...errors import OutboxError
from ...tokens import TokenInfo
from ..problems import Problem, from_error
from .auth import in_scope
from .bodies import validated

Spec = TypeVar("Spec", bound=BaseModel)
Made = TypeVar("Made")


def refusal(problem: Problem) -> dict[str, Any]:
    """A refused item's answer: the status and problem the request with it alone would get."""
    return {"status": problem.status, "problem": problem.json()}


async def answer_each(
    items: Sequence[Any], model: type[Spec], token: TokenInfo, fields: Callable[[Spec], dict[str, Any]],
    make: Callable[[list[dict[str, Any]]], Awaitable[Sequence[Made | OutboxError]]],
    answered: Callable[[Made], dict[str, Any]],
) -> Response:
    """``{"results": [...]}`` for ``items``: each read as ``model`` and turned into its ``fields``
    (whose ``scope`` is checked against ``token``), the accepted ones (with the token's actor)
    given to ``make`` at once, each outcome ``answered`` or, where the store refused it, its
    refusal."""
    results: list[dict[str, Any] | None] = [None] * len(items)
    places: list[int] = []
    accepted: list[dict[str, Any]] = []
    for place, item in enumerate(items):
        try:
            sent = fields(validated(model, item))
            in_scope(token, sent["scope"])
        except Problem as problem:
            results[place] = refusal(problem)
            continue
        places.append(place)
        accepted.append({"actor": token.actor, **sent})
    for place, outcome in zip(places, await make(accepted), strict=True):
        results[place] = refusal(from_error(outcome)) if isinstance(outcome, OutboxError) else answered(outcome)
    # JSON-ready already, so neither FastAPI's encoder nor the json module is needed: pydantic's
    # serializer writes the same JSON (compact UTF-8) several times faster
    return Response(to_json({"results": results}), media_type="application/json")
