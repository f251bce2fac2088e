"""The console's actions: an intent's replay, resolve, cancel, approve and reject, and the start of a
bulk replay. Each is a form of the signed-in operator's session (its CSRF value checked), goes
through the same ``outbox.operations`` as the API and CLI, and is recorded with the token and the
reason; a refused action answers with the intent's page and the refusal."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from ... import operations
from ...errors import InvalidInput, OutboxError
from ...outbox import Outbox
from .. import problems
from .access import Access
from .filters import Filter
from .links import intent_url
from .pages import intent_view
from .replays import Replays
from .sessions import signed_page


def register(pages: APIRouter, access: Access, authorize: Callable[[Request], Any], replays: Replays) -> None:
    """Add the actions' routes to the console's router (``authorize``: the replay authority)."""

    async def act(request: Request, action_id: str, scope: str | None, name: str,
                  run: Callable[[Outbox, operations.Actor, dict[str, str]], Awaitable[object]]) -> Response:
        answer = await access.signed_form(request)
        if isinstance(answer, Response):
            return answer
        who, raw = answer
        fields = {k: v[-1] for k, v in raw.items()}
        try:
            await run(access.box(request), operations.Actor(who.actor, fields.get("reason", "")), fields)
        except OutboxError as exc:
            return await intent_view(access, request, action_id, scope, error=exc.message,
                                     status=problems.from_error(exc).status)
        return RedirectResponse(intent_url(action_id, scope, done=name), status_code=303)

    @pages.post("/intents/{action_id}/replay")
    async def replay(request: Request, action_id: str, scope: str | None = None) -> Response:
        return await act(request, action_id, scope, "replay", lambda b, who, f: operations.replay(
            b, action_id, who, scope=scope, authorize=authorize(request),
            accept_duplicate_risk=f.get("accept_duplicate_risk") == "yes"))

    @pages.post("/intents/{action_id}/resolve")
    async def resolve(request: Request, action_id: str, scope: str | None = None) -> Response:
        async def run(b: Outbox, who: operations.Actor, f: dict[str, str]) -> object:
            try:
                resolution = operations.Resolution(f.get("resolution", ""))
            except ValueError:
                raise InvalidInput("choose the outcome to resolve it as: delivered, retry or dead "
                                   "(nothing is chosen for you)") from None
            return await operations.resolve(b, action_id, resolution, who, scope=scope,
                                            external_id=f.get("external_id") or None)

        return await act(request, action_id, scope, "resolve", run)

    @pages.post("/intents/{action_id}/cancel")
    async def cancel(request: Request, action_id: str, scope: str | None = None) -> Response:
        return await act(request, action_id, scope, "cancel",
                         lambda b, who, f: operations.cancel(b, action_id, who, scope=scope))

    @pages.post("/intents/{action_id}/approve")
    async def approve(request: Request, action_id: str, scope: str | None = None) -> Response:
        return await act(request, action_id, scope, "approve", lambda b, who, f: operations.approve(
            b, action_id, who, scope=scope, payload_digest=f.get("payload_digest", "")))

    @pages.post("/intents/{action_id}/reject")
    async def reject(request: Request, action_id: str, scope: str | None = None) -> Response:
        return await act(request, action_id, scope, "reject",
                         lambda b, who, f: operations.reject(b, action_id, who, scope=scope))

    @pages.post("/replay")
    async def replay_start(request: Request) -> Response:
        answer = await access.signed_form(request)
        if isinstance(answer, Response):
            return answer
        who, raw = answer
        outbox = access.box(request)
        try:
            chosen = Filter.parse(raw, outbox.clock.now())
            actor = operations.Actor(who.actor, raw.get("reason", [""])[-1])
            job = await replays.start(outbox, chosen.query(), actor, authorize=authorize(request),
                                      accept_duplicate_risk=raw.get("accept_duplicate_risk", [""])[-1] == "yes")
        except OutboxError as exc:
            return signed_page(request, "error.html", "Bulk replay", error=exc.message, status=400)
        return RedirectResponse(f"/console/replay/{job}", status_code=303)
