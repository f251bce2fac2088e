"""What operators do to intents: replay (one, or every one a filter matches), resolve, cancel,
approve, reject. Each action is recorded with the token and the reason, and a replay asks the
authority provider the app was given (``app.state.authorize``) first."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat

from .. import openapi, operations
from ..errors import OutboxError
from ..model import EventKind, Intent, Status
from ..outbox import history_json, intent_json
from ..problems import Problem
from ..store import History, IntentQuery
from ..timestamps import Timestamp
from ..tokens import TokenInfo
from .auth import Operator, box
from .bodies import parsed
from .intents import ScopeParam

router = APIRouter(tags=["operators"])


class ReasonIn(BaseModel):
    """Why an operator acts (recorded with the action)."""

    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=1, max_length=1000)


class ReplayIn(ReasonIn):
    """A replay; duplicates must be accepted explicitly where the destination does not dedupe."""

    accept_duplicate_risk: StrictBool = False


class ResolveIn(ReasonIn):
    """An unknown intent's resolution, with the operator's evidence."""

    resolution: operations.Resolution
    external_id: str | None = Field(default=None, max_length=255)


class ApproveIn(ReasonIn):
    """An approval of the exact payload digest the operator looked at."""

    payload_digest: str
    valid_seconds: StrictFloat = Field(default=3600, gt=0, le=operations.MAX_APPROVAL_SECONDS)


class ReplayFilter(BaseModel):
    """Which intents a bulk replay takes (dead, revoked and unknown when no status is named)."""

    model_config = ConfigDict(extra="forbid")
    status: list[Status] | None = None
    scope: list[str] | None = None
    destination: str | None = None
    channel: str | None = Field(default=None, description="an installed channel's name")
    created_after: Timestamp | None = None
    created_before: Timestamp | None = None

    def query(self) -> IntentQuery:
        return IntentQuery(statuses=self.status, scopes=self.scope, destination=self.destination,
                           channel=self.channel, created_after=self.created_after,
                           created_before=self.created_before)


class BulkReplayIn(ReplayIn):
    """A bulk replay."""

    filter: ReplayFilter = Field(default_factory=ReplayFilter)
    dry_run: StrictBool = True


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
async def replay(request: Request, action_id: str, token: Operator, scope: ScopeParam = None) -> dict[str, Any]:
    spec = await parsed(request, ReplayIn)
    intent = await operations.replay(box(request), action_id, actor(token, spec.reason), scope=scope,
                                     authorize=authorize(request),
                                     accept_duplicate_risk=spec.accept_duplicate_risk)
    return await acted(request, intent, EventKind.REPLAYED)


@router.post("/v1/intents/{action_id}/resolve",
             summary="Settle an unknown intent with evidence: delivered, retry or dead",
             **openapi.action(ResolveIn))
async def resolve(request: Request, action_id: str, token: Operator, scope: ScopeParam = None) -> dict[str, Any]:
    spec = await parsed(request, ResolveIn)
    intent = await operations.resolve(box(request), action_id, spec.resolution, actor(token, spec.reason),
                                      scope=scope, external_id=spec.external_id)
    return await acted(request, intent, EventKind.RESOLVED)


@router.post("/v1/intents/{action_id}/cancel", summary="Withdraw an intent", **openapi.action(ReasonIn))
async def cancel(request: Request, action_id: str, token: Operator, scope: ScopeParam = None) -> dict[str, Any]:
    spec = await parsed(request, ReasonIn)
    intent = await operations.cancel(box(request), action_id, actor(token, spec.reason), scope=scope)
    return await acted(request, intent, EventKind.CANCELLED)


@router.post("/v1/intents/{action_id}/approve",
             summary="Approve a held intent's exact payload digest, for a limited time",
             **openapi.action(ApproveIn))
async def approve(request: Request, action_id: str, token: Operator, scope: ScopeParam = None) -> dict[str, Any]:
    spec = await parsed(request, ApproveIn)
    intent = await operations.approve(box(request), action_id, actor(token, spec.reason), scope=scope,
                                      payload_digest=spec.payload_digest, valid_seconds=spec.valid_seconds)
    return await acted(request, intent, EventKind.APPROVED)


@router.post("/v1/intents/{action_id}/reject", summary="Refuse a held intent", **openapi.action(ReasonIn))
async def reject(request: Request, action_id: str, token: Operator, scope: ScopeParam = None) -> dict[str, Any]:
    spec = await parsed(request, ReasonIn)
    intent = await operations.reject(box(request), action_id, actor(token, spec.reason), scope=scope)
    return await acted(request, intent, EventKind.REJECTED)


@router.post("/v1/replay",
             summary="Replay every dead, revoked or unknown intent matching a filter (dry_run first)",
             **openapi.doc({200: openapi.BulkReplayResult}, body=BulkReplayIn, errors=openapi.BODY_ERRORS))
async def bulk_replay(request: Request, token: Operator) -> dict[str, Any]:
    spec = await parsed(request, BulkReplayIn)
    result = await operations.bulk_replay(
        box(request), spec.filter.query(), actor(token, spec.reason), dry_run=spec.dry_run,
        authorize=authorize(request), accept_duplicate_risk=spec.accept_duplicate_risk)
    return {"dry_run": spec.dry_run, "matched": len(result.matched), "action_ids": result.matched,
            "replayed": len(result.replayed), "refused": result.refused}
