"""What operators do to intents: replay (one, or every one a filter matches), resolve, cancel,
approve, reject. Each action is recorded with the token and the reason, and a replay asks the
authority provider the app was given (``app.state.authorize``) first."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request

from ... import operations
from ...errors import OutboxError
from ...model import EventKind, Intent
from ...shapes import (
    ActionId,
    ApproveIn,
    BulkReplayIn,
    BulkReplayResult,
    ReasonIn,
    ReplayFilter,
    ReplayIn,
    ResolveIn,
    history_json,
    intent_json,
)
from ...store import History, IntentQuery
from ...tokens import TokenInfo
from .. import openapi
from ..problems import Problem
from .auth import Operator, box
from .intents import ScopeParam

router = APIRouter(tags=["operators"])


def query(matching: ReplayFilter) -> IntentQuery:
    """The intents a bulk replay's filter matches."""
    return IntentQuery(statuses=matching.status, scopes=matching.scope, destination=matching.destination,
                       channel=matching.channel, created_after=matching.created_after,
                       created_before=matching.created_before)


def actor(token: TokenInfo, reason: str) -> operations.Actor:
    try:
        return operations.Actor(token.actor, reason)
    except OutboxError as exc:
        raise Problem(422, "invalid-input", "Invalid input", exc.message) from None


def authorize(request: Request) -> operations.Authorize:
    """The authority check the application was given, for replays."""
    return request.app.state.authorize


async def acted(request: Request, intent: Intent, kind: EventKind) -> dict[str, Any]:
    """The intent as the operator's action left it. A worker may have moved it on since, so
    the history stops at the action's own event (``kind``) and the attempts started by then."""
    history = await box(request).history(intent.action_id, scope=intent.scope)
    last = max(i for i, event in enumerate(history.events) if event.kind == kind)
    events = history.events[: last + 1]
    started = sum(event.kind is EventKind.ATTEMPT_STARTED for event in events)
    return {**intent_json(intent), **history_json(History(history.attempts[:started], events))}


@router.post("/v1/intents/{action_id}/replay",
             summary="Send a dead, revoked or unknown intent again (same action_id)",
             **openapi.action(ReplayIn))
async def replay(spec: ReplayIn, request: Request, action_id: ActionId, token: Operator,
                 scope: ScopeParam = None) -> dict[str, Any]:
    intent = await operations.replay(box(request), action_id, actor(token, spec.reason), scope=scope,
                                     authorize=authorize(request),
                                     accept_duplicate_risk=spec.accept_duplicate_risk)
    return await acted(request, intent, EventKind.REPLAYED)


@router.post("/v1/intents/{action_id}/resolve",
             summary="Settle an unknown intent with evidence: delivered, retry or dead",
             **openapi.action(ResolveIn))
async def resolve(spec: ResolveIn, request: Request, action_id: ActionId, token: Operator,
                  scope: ScopeParam = None) -> dict[str, Any]:
    intent = await operations.resolve(box(request), action_id, spec.resolution, actor(token, spec.reason),
                                      scope=scope, external_id=spec.external_id)
    return await acted(request, intent, EventKind.RESOLVED)


def with_reason(name: str, act: Callable[..., Awaitable[Intent]], kind: EventKind, summary: str) -> None:
    """Route ``POST /v1/intents/{action_id}/<name>``: an action that takes nothing but a reason
    (cancel, reject), answered with the intent as it left it."""

    async def action(spec: ReasonIn, request: Request, action_id: ActionId, token: Operator,
                     scope: ScopeParam = None) -> dict[str, Any]:
        intent = await act(box(request), action_id, actor(token, spec.reason), scope=scope)
        return await acted(request, intent, kind)

    router.post(f"/v1/intents/{{action_id}}/{name}", name=name, summary=summary,
                **openapi.action(ReasonIn))(action)


with_reason("cancel", operations.cancel, EventKind.CANCELLED, "Withdraw an intent")


@router.post("/v1/intents/{action_id}/approve",
             summary="Approve a held intent's exact payload digest, for a limited time",
             **openapi.action(ApproveIn))
async def approve(spec: ApproveIn, request: Request, action_id: ActionId, token: Operator,
                  scope: ScopeParam = None) -> dict[str, Any]:
    intent = await operations.approve(box(request), action_id, actor(token, spec.reason), scope=scope,
                                      payload_digest=spec.payload_digest, valid_seconds=spec.valid_seconds)
    return await acted(request, intent, EventKind.APPROVED)


with_reason("reject", operations.reject, EventKind.REJECTED, "Refuse a held intent")


@router.post("/v1/replay",
             summary="Replay every dead, revoked or unknown intent matching a filter (dry_run first)",
             **openapi.doc({200: BulkReplayResult}, example="BulkReplayIn", errors=openapi.BODY_ERRORS))
async def bulk_replay(spec: BulkReplayIn, request: Request, token: Operator) -> dict[str, Any]:
    result = await operations.bulk_replay(
        box(request), query(spec.filter), actor(token, spec.reason), dry_run=spec.dry_run,
        authorize=authorize(request), accept_duplicate_risk=spec.accept_duplicate_risk)
    return {"dry_run": spec.dry_run, "matched": len(result.matched), "action_ids": result.matched,
            "replayed": len(result.replayed), "refused": result.refused}
