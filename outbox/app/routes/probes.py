"""The probes and metrics: ``/healthz`` (liveness, and the embedded sender's) and ``/readyz``
(the store answers), open without a token, and ``/metrics`` (Prometheus), which asks for the
metrics token once one is set. They are all that ``outbox worker --metrics-port`` serves."""

from __future__ import annotations

import asyncio
import hmac
from datetime import datetime

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from ...clock import iso
from ...model import Role
from ...shapes import Health, Ready
from .. import openapi
from ..problems import Problem
from .auth import Bearer, authorized, box, unauthenticated

router = APIRouter(tags=["probes"])


def ended_by(task: asyncio.Task[None]) -> str:
    """How a finished task ended, in words."""
    if task.cancelled():
        return "cancelled"
    exc = task.exception()
    return "it returned" if exc is None else f"{type(exc).__name__}: {exc}"


@router.get("/healthz", summary="The process is up, and so is its embedded sender",
            **openapi.doc({200: Health}, token=False, errors={
                503: "`sender-stopped`: the embedded sender stopped by itself; restart the process"}))
async def healthz(request: Request) -> dict[str, str]:
    task: asyncio.Task[None] | None = getattr(request.app.state, "worker_task", None)
    if task is not None and task.done():  # only a crash ends it before shutdown: restart
        raise Problem(503, "sender-stopped", "Sender stopped",
                      f"the embedded sender stopped: {ended_by(task)}; restart the process")
    # The sender keeps trying a database that stopped answering; a restart would not help, so
    # the process stays live and says what it waits for (``/readyz`` fails meanwhile). Cycles
    # failing on another error say which, since the database is not what to look at. Intents it
    # set aside need an operator, not a restart.
    worker = getattr(request.app.state, "worker", None)
    details = [] if (trouble := failing(worker)) is None else [trouble]
    if (aside := set_aside(worker)) is not None:
        details.append(aside)
    return {"status": "degraded", "detail": "; ".join(details)} if details else {"status": "ok"}


def failing(worker: object) -> str | None:
    """What has been failing the sender's cycles in this process (its ``trouble``), in words: the
    database not answering only when that is what it was (StoreUnavailable); any other error named
    as itself. None while they go through."""
    trouble: tuple[str, datetime, bool] | None = getattr(worker, "trouble", None)
    if trouble is None:
        return None
    what, since, unreachable = trouble
    if unreachable:
        return f"the sender cannot reach the database since {since.isoformat()}: {what}; it keeps trying"
    return (f"the sender's cycles fail since {since.isoformat()} on an error that is not the database's: {what} "
            "(the log has its traceback); it keeps trying")


def set_aside(worker: object) -> str | None:
    """What the sender in this process set aside since it started, in words that name no intent
    (the probes need no token); None when nothing was."""
    last: tuple[str, datetime] | None = getattr(worker, "last_set_aside", None)
    if last is None:
        return None
    count: int = getattr(worker, "set_aside", 0)
    return (f"the sender set aside {count} intent{'s' if count != 1 else ''} whose stored times cannot be read, "
            f"the last at {iso(last[1])}: dead, nothing sent; an operator shows and cancels "
            f"{'them' if count != 1 else 'it'} (the console's dead letters, outbox list --status dead)")


@router.get("/readyz", summary="The store answers and is migrated",
            **openapi.doc({200: Ready}, token=False, errors=[503]))
async def readyz(request: Request) -> dict[str, str]:
    await box(request).store.ping()
    return {"status": "ready"}


async def may_scrape(request: Request, bearer: Bearer) -> None:
    """Let the scrape through: anyone while no metrics token is set (``OUTBOX_METRICS_TOKEN``),
    then only with it as the bearer token, or an operator's or admin's API token (they can read
    every destination anyway); a producer's is refused, since the labels name every tenant's
    destinations."""
    expected = box(request).settings.metrics_token
    if expected is None:
        return
    if bearer is None:
        raise unauthenticated("/metrics needs 'Authorization: Bearer <OUTBOX_METRICS_TOKEN>' (in Prometheus, the "
                              "scrape job's authorization.credentials_file), or an operator or admin token")
    if hmac.compare_digest(bearer.credentials.encode(), expected.get_secret_value().encode()):
        return
    await authorized(request, bearer.credentials, Role.OPERATOR)


@router.get("/metrics", summary="Prometheus metrics (with OUTBOX_METRICS_TOKEN set, for its bearer only)",
            dependencies=[Depends(may_scrape)],
            **openapi.doc({200: "the Prometheus text exposition format"}, token=False, text=True,
                          errors={401: "`unauthenticated`: a metrics token is set, and the request does not carry "
                                       "it, or an operator or admin token",
                                  403: "`forbidden`: a producer token", 503: openapi.WHEN[503]}))
async def metrics(request: Request) -> Response:
    outbox_ = box(request)
    body = await outbox_.metrics.render(outbox_.store, outbox_.clock.now())
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
