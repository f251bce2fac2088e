"""The HTTP API (``/v1``): producers enqueue and read, operators act on intents, admins manage
destinations and grants; plus probes, metrics and the console.

Every error is RFC 9457 problem+json, and a refused request changes nothing in the store.
"""

import asyncio
import base64
import binascii
import json
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Annotated, Any, TypeVar
from urllib.parse import quote

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, JsonValue, StrictBool, ValidationError
from starlette.exceptions import HTTPException

from . import console, openapi, operations
from .destinations import DestinationSpec
from .digest import MAX_NESTING, nesting
from .errors import OutboxError
from .grants import GrantSpec
from .ids import DESTINATION_ID, check
from .model import SETTLED, Channel, Intent, Role, Status
from .outbox import MAX_PAGE, Outbox, history_json, intent_json
from .problems import Problem, from_error
from .settings import Settings
from .store import History, IntentQuery
from .tokens import TokenInfo
from .web import allowed_methods

log = logging.getLogger("outbox.api")
M = TypeVar("M", bound=BaseModel)

#: The longest a client may long-poll one intent.
MAX_WAIT_SECONDS = 60.0
#: Room for the envelope around the payload before a body is refused unread.
ENVELOPE_BYTES = 64 * 1024
JSON_TYPES = ("application/json",)
#: A request body is the payload inside an envelope (and a filter object inside it).
BODY_NESTING = MAX_NESTING + 2
ScopeParam = Annotated[str | None, Query(description=(
    "the intent's scope; needed only when the action id is used in several scopes you can read"))]


class IntentIn(BaseModel):
    """An intent as a producer sends it."""

    model_config = ConfigDict(extra="forbid")

    action_id: str | None = Field(
        default=None, description="your operation id; generated (UUIDv7) when omitted"
    )
    scope: str = Field(description="tenant/account on whose authority the effect is made")
    destination: str = Field(description="id of a registered destination")
    payload: JsonValue = Field(description="the JSON the destination receives")
    not_before: AwareDatetime | None = None
    expires_at: AwareDatetime | None = None
    max_attempts: int | None = Field(default=None, ge=1, le=1000)


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
    valid_seconds: float = Field(default=3600, gt=0, le=30 * 86_400)


class ReplayFilter(BaseModel):
    """Which intents a bulk replay takes (dead, revoked and unknown when no status is named)."""

    model_config = ConfigDict(extra="forbid")
    status: list[Status] | None = None
    scope: list[str] | None = None
    destination: str | None = None
    channel: Channel | None = None
    created_after: AwareDatetime | None = None
    created_before: AwareDatetime | None = None

    def query(self) -> IntentQuery:
        return IntentQuery(statuses=self.status, scopes=self.scope, destination=self.destination,
                           channel=self.channel, created_after=self.created_after,
                           created_before=self.created_before)


class BulkReplayIn(ReplayIn):
    """A bulk replay."""

    filter: ReplayFilter = Field(default_factory=ReplayFilter)
    dry_run: StrictBool = True


def _validation_problem(errors: Sequence[Mapping[str, Any]]) -> Problem:
    shown = [
        {"field": ".".join(str(part) for part in e["loc"] if part not in ("body", "query", "path")),
         "message": e["msg"]}
        for e in errors
    ]
    detail = "; ".join(f"{e['field'] or 'body'}: {e['message']}" for e in shown[:5])
    return Problem(422, "invalid-input", "Invalid input", detail, errors=shown)


def _location(intent: Intent) -> str:
    """Where an intent is read: action ids are unique per scope, so the scope is part of it."""
    return f"/v1/intents/{intent.action_id}?scope={quote(intent.scope, safe='')}"


def _encode_cursor(seq: int) -> str:
    return base64.urlsafe_b64encode(f"seq:{seq}".encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> int:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        kind, _, value = text.partition(":")
        if kind != "seq":
            raise ValueError(kind)
        return int(value)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise Problem(
            400, "bad-cursor", "Bad cursor", "cursor is malformed; pass next_cursor back unchanged"
        ) from None


def _ended_by(task: asyncio.Task[None]) -> str:
    if task.cancelled():
        return "cancelled"
    exc = task.exception()
    return "it returned" if exc is None else f"{type(exc).__name__}: {exc}"


def _sender_ended(task: asyncio.Task[None]) -> None:
    """Say at once, not at shutdown, that the embedded sender is gone (``/healthz`` says so too)."""
    if not task.cancelled() and task.exception() is not None:
        log.critical("the embedded sender stopped: %s; nothing is being delivered", _ended_by(task),
                     exc_info=task.exception())


def begin_shutdown(app: FastAPI) -> None:
    """Start shutting down as soon as the server is told to, not once its open requests have
    ended: the embedded sender stops claiming and drains, and long polls answer at once. Safe to
    call from a signal handler (``outbox serve`` calls it on SIGTERM and SIGINT)."""

    def begin() -> None:
        app.state.outbox.begin_closing()
        worker = getattr(app.state, "worker", None)
        if worker is not None:
            worker.stop()

    loop: asyncio.AbstractEventLoop | None = getattr(app.state, "loop", None)
    if loop is not None and not loop.is_closed():
        loop.call_soon_threadsafe(begin)


def create_app(settings: Settings | None = None, *, outbox: Outbox | None = None,
               probes_only: bool = False) -> FastAPI:
    """The API application. Opens the outbox from ``settings`` unless one is given. With
    ``probes_only``, just ``/healthz``, ``/readyz`` and ``/metrics``: what ``outbox worker
    --metrics-port`` serves beside its sender."""
    settings = settings or (outbox.settings if outbox else Settings())
    body_limit = settings.max_payload_bytes + ENVELOPE_BYTES

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.loop = asyncio.get_running_loop()
        app.state.outbox = outbox or await Outbox.open(settings=settings)
        from sender.authority import authorizer  # the sender builds on this package, not the reverse

        app.state.authorize = authorizer(app.state.outbox)
        worker_task = None
        if settings.worker:
            from sender import Worker  # the sender builds on this package, not the reverse

            worker = app.state.worker = Worker(app.state.outbox)
            worker_task = app.state.worker_task = asyncio.create_task(worker.run())
            worker_task.add_done_callback(_sender_ended)
        try:
            yield
        finally:
            if worker_task is not None:
                worker.stop()
                await worker_task
            if outbox is None:
                await app.state.outbox.close()

    app = FastAPI(
        title="outbox-delivery",
        version="0.1.0",
        description="Durable intents delivered at least once, with honest outcomes.",
        lifespan=lifespan,
        docs_url=None,  # served by openapi.install, from local assets
        redoc_url=None,
    )
    openapi.install(app)

    # -- errors ----------------------------------------------------------------------------

    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem) -> Response:
        return exc.response(request.url.path)

    @app.exception_handler(OutboxError)
    async def _outbox_error(request: Request, exc: OutboxError) -> Response:
        return from_error(exc).response(request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        return _validation_problem(exc.errors()).response(request.url.path)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> Response:
        kinds = {404: "not-found", 405: "method-not-allowed"}
        detail = {
            404: f"there is no route {request.url.path}; see /docs",
            405: f"{request.method} is not allowed on {request.url.path}; see /docs",
        }.get(exc.status_code, str(exc.detail))
        problem = Problem(exc.status_code, kinds.get(exc.status_code, "http"), str(exc.detail), detail)
        problem.headers.update(exc.headers or {})
        if exc.status_code == 405:
            problem.headers["Allow"] = allowed_methods(request)
        return problem.response(request.url.path)

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return Problem(
            500, "internal", "Internal error", "the server failed; the error is in its log"
        ).response(request.url.path)

    # -- auth ------------------------------------------------------------------------------

    def box(request: Request) -> Outbox:
        return request.app.state.outbox

    def role(*allowed: Role) -> Callable[[Request], Coroutine[Any, Any, TokenInfo]]:
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
                    f"a {info.role.value} token cannot do this; it needs {names}",
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
        if not token.may_act_in(scope):
            raise Problem(
                403, "forbidden-scope", "Forbidden scope",
                f"this token may act in scopes {list(token.scopes)}, not {scope!r}",
            )

    async def json_body(request: Request) -> Any:
        media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type not in JSON_TYPES and not media_type.endswith("+json"):
            raise Problem(
                415, "unsupported-media-type", "Unsupported media type",
                f"send the body as application/json, not {media_type or 'nothing'!r}",
            )
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > body_limit:
            raise Problem(
                413, "payload-too-large", "Payload too large",
                f"body is {declared} bytes; the limit is {body_limit} "
                f"(payload {settings.max_payload_bytes} + envelope)",
            )
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > body_limit:
                raise Problem(
                    413, "payload-too-large", "Payload too large",
                    f"body exceeds the limit of {body_limit} bytes",
                )
            chunks.append(chunk)
        try:
            body = json.loads(b"".join(chunks))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise Problem(400, "invalid-json", "Invalid JSON", f"the body is not JSON: {exc}") from None
        except RecursionError:
            body = None  # far too deep to parse: refused below like any body over the limit
            depth = BODY_NESTING + 1
        else:
            depth = nesting(body, BODY_NESTING)
        if depth > BODY_NESTING:
            raise Problem(422, "invalid-input", "Invalid input",
                          f"the body nests arrays and objects deeper than allowed: a payload may nest "
                          f"{MAX_NESTING} levels")
        return body

    async def parsed(request: Request, model: type[M]) -> M:
        """The JSON body validated as ``model``, or the problem saying what is wrong."""
        raw = await json_body(request)
        try:
            return model.model_validate(raw)
        except ValidationError as exc:
            raise _validation_problem(exc.errors()) from None

    # -- probes ----------------------------------------------------------------------------

    @app.get("/healthz", tags=["probes"], summary="The process is up, and so is its embedded sender",
             **openapi.doc({200: openapi.Health}, token=False, errors={
                 503: "`sender-stopped`: the embedded sender stopped by itself; restart the process"}))
    async def healthz(request: Request) -> dict[str, str]:
        task: asyncio.Task[None] | None = getattr(request.app.state, "worker_task", None)
        if task is not None and task.done():  # only a crash ends it before shutdown: restart
            raise Problem(503, "sender-stopped", "Sender stopped",
                          f"the embedded sender stopped: {_ended_by(task)}; restart the process")
        return {"status": "ok"}

    @app.get("/readyz", tags=["probes"], summary="The store answers and is migrated",
             **openapi.doc({200: openapi.Ready}, token=False, errors=[503]))
    async def readyz(request: Request) -> dict[str, str]:
        await box(request).store.ping()
        return {"status": "ready"}

    @app.get("/metrics", tags=["probes"], summary="Prometheus metrics",
             **openapi.doc({200: "the Prometheus text exposition format"}, token=False, errors=[503],
                           media_type="text/plain"))
    async def metrics(request: Request) -> Response:
        outbox_ = box(request)
        body = await outbox_.metrics.render(outbox_.store, outbox_.clock.now())
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    if probes_only:
        return app

    # -- intents ---------------------------------------------------------------------------

    @app.post(
        "/v1/intents",
        tags=["intents"],
        status_code=201,
        summary="Enqueue an intent (idempotent on action_id)",
        **openapi.doc(
            {201: (openapi.Intent, "enqueued"), 200: (openapi.Intent, "the same intent already exists")},
            body=IntentIn, errors=[*openapi.BODY_ERRORS, 409], headers=dict.fromkeys((200, 201), openapi.LOCATION)),
    )
    async def enqueue(request: Request, token: Producer) -> Response:
        spec = await parsed(request, IntentIn)
        in_scope(token, spec.scope)
        result = await box(request).enqueue(actor=token.actor, **spec.model_dump(exclude_unset=True))
        return JSONResponse(
            intent_json(result.intent),
            status_code=201 if result.created else 200,
            headers={"Location": _location(result.intent)},
        )

    @app.get("/v1/intents/{action_id}", tags=["intents"], summary="An intent with attempts and events",
             **openapi.doc({200: openapi.IntentDetail}, errors=[404, 409, 422, 503]))
    async def show(
        request: Request,
        action_id: str,
        token: Reader,
        scope: ScopeParam = None,
        wait: Annotated[float, Query(ge=0, le=MAX_WAIT_SECONDS, description=(
            "long-poll: answer once the intent is delivered, dead, revoked, unknown or "
            "cancelled, or after this many seconds"))] = 0,
    ) -> dict[str, Any]:
        outbox_ = box(request)
        intent = await outbox_.get(action_id, scope=scope, scopes=readable(token))
        if wait:
            await outbox_.wait(action_id, wait, scope=intent.scope)
        intent, history = await outbox_.show(action_id, scope=intent.scope)
        return {**intent_json(intent), "settled": intent.status in SETTLED, **history_json(history)}

    @app.get("/v1/intents", tags=["intents"], summary="List intents, newest first",
             **openapi.doc({200: openapi.IntentPage}, errors=[400, 403, 422, 503]))
    async def list_intents(
        request: Request,
        token: Reader,
        status: Annotated[list[Status] | None, Query(description="repeat for several")] = None,
        scope: Annotated[list[str] | None, Query(description="repeat for several")] = None,
        destination: str | None = None,
        channel: Channel | None = None,
        created_after: AwareDatetime | None = None,
        created_before: AwareDatetime | None = None,
        cursor: str | None = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    ) -> dict[str, Any]:
        scopes: list[str] | None = scope
        if token.role is Role.PRODUCER and "*" not in token.scopes:
            for wanted in scope or []:
                in_scope(token, wanted)
            scopes = scope or list(token.scopes)
        if destination is not None:
            check(DESTINATION_ID, destination, "destination")
        page = await box(request).list_intents(
            IntentQuery(
                statuses=status,
                scopes=scopes,
                destination=destination,
                channel=channel,
                created_after=created_after,
                created_before=created_before,
                before_seq=_decode_cursor(cursor) if cursor else None,
                limit=limit,
            )
        )
        return {
            "items": [intent_json(i) for i in page.intents],
            "next_cursor": _encode_cursor(page.next_seq) if page.next_seq else None,
        }

    # -- operators -------------------------------------------------------------------------

    def actor(token: TokenInfo, reason: str) -> operations.Actor:
        try:
            return operations.Actor(token.actor, reason)
        except OutboxError as exc:
            raise Problem(422, "invalid-input", "Invalid input", exc.message) from None

    async def acted(request: Request, intent: Intent, kind: str) -> dict[str, Any]:
        """The intent as the operator's action left it. A worker may have moved it on since, so
        the history stops at the action's own event (``kind``) and the attempts started by then."""
        history = await box(request).history(intent.action_id, scope=intent.scope)
        last = max(i for i, event in enumerate(history.events) if event.kind == kind)
        events = history.events[: last + 1]
        started = sum(event.kind == "attempt_started" for event in events)
        return {**intent_json(intent), **history_json(History(history.attempts[:started], events))}

    @app.post("/v1/intents/{action_id}/replay", tags=["operators"],
              summary="Send a dead, revoked or unknown intent again (same action_id)",
              **openapi.action(ReplayIn))
    async def replay(request: Request, action_id: str, token: Operator, scope: ScopeParam = None) -> dict[str, Any]:
        spec = await parsed(request, ReplayIn)
        intent = await operations.replay(box(request), action_id, actor(token, spec.reason), scope=scope,
                                authorize=request.app.state.authorize,
                                accept_duplicate_risk=spec.accept_duplicate_risk)
        return await acted(request, intent, "replayed")

    @app.post("/v1/intents/{action_id}/resolve", tags=["operators"],
              summary="Settle an unknown intent with evidence: delivered, retry or dead",
              **openapi.action(ResolveIn))
    async def resolve(request: Request, action_id: str, token: Operator, scope: ScopeParam = None) -> dict[str, Any]:
        spec = await parsed(request, ResolveIn)
        intent = await operations.resolve(box(request), action_id, spec.resolution, actor(token, spec.reason),
                                          scope=scope, external_id=spec.external_id)
        return await acted(request, intent, "resolved")

    @app.post("/v1/intents/{action_id}/cancel", tags=["operators"], summary="Withdraw an intent",
              **openapi.action(ReasonIn))
    async def cancel(request: Request, action_id: str, token: Operator, scope: ScopeParam = None) -> dict[str, Any]:
        spec = await parsed(request, ReasonIn)
        intent = await operations.cancel(box(request), action_id, actor(token, spec.reason), scope=scope)
        return await acted(request, intent, "cancelled")

    @app.post("/v1/intents/{action_id}/approve", tags=["operators"],
              summary="Approve a held intent's exact payload digest, for a limited time",
              **openapi.action(ApproveIn))
    async def approve(request: Request, action_id: str, token: Operator, scope: ScopeParam = None) -> dict[str, Any]:
        spec = await parsed(request, ApproveIn)
        intent = await operations.approve(box(request), action_id, actor(token, spec.reason), scope=scope,
                                 payload_digest=spec.payload_digest, valid_seconds=spec.valid_seconds)
        return await acted(request, intent, "approved")

    @app.post("/v1/intents/{action_id}/reject", tags=["operators"], summary="Refuse a held intent",
              **openapi.action(ReasonIn))
    async def reject(request: Request, action_id: str, token: Operator, scope: ScopeParam = None) -> dict[str, Any]:
        spec = await parsed(request, ReasonIn)
        intent = await operations.reject(box(request), action_id, actor(token, spec.reason), scope=scope)
        return await acted(request, intent, "rejected")

    @app.post("/v1/replay", tags=["operators"],
              summary="Replay every dead, revoked or unknown intent matching a filter (dry_run first)",
              **openapi.doc({200: openapi.BulkReplayResult}, body=BulkReplayIn, errors=openapi.BODY_ERRORS))
    async def bulk_replay(request: Request, token: Operator) -> dict[str, Any]:
        spec = await parsed(request, BulkReplayIn)
        result = await operations.bulk_replay(
            box(request), spec.filter.query(), actor(token, spec.reason), dry_run=spec.dry_run,
            authorize=request.app.state.authorize, accept_duplicate_risk=spec.accept_duplicate_risk)
        return {"dry_run": spec.dry_run, "matched": len(result.matched), "action_ids": result.matched,
                "replayed": len(result.replayed), "refused": result.refused}

    app.include_router(console.router(box, lambda request: request.app.state.authorize))

    # -- destinations ----------------------------------------------------------------------

    @app.put(
        "/v1/destinations/{destination_id}",
        tags=["destinations"],
        summary="Register or replace a destination (admin)",
        **openapi.doc({201: (openapi.Destination, "registered"), 200: (openapi.Destination, "replaced")},
                      body=DestinationSpec, errors=openapi.BODY_ERRORS),
    )
    async def put_destination(request: Request, destination_id: str, token: Admin) -> Response:
        check(DESTINATION_ID, destination_id, "destination id")
        spec = await parsed(request, DestinationSpec)
        destination, created = await box(request).put_destination(destination_id, spec)
        log.info("destination %s %s by %s", destination_id, "created" if created else "replaced", token.actor)
        return JSONResponse(destination.public(), status_code=201 if created else 200)

    @app.get("/v1/destinations/{destination_id}", tags=["destinations"], summary="A destination",
             **openapi.doc({200: openapi.Destination}, errors=[403, 404, 422, 503]))
    async def get_destination(request: Request, destination_id: str, token: Operator) -> dict[str, Any]:
        return (await box(request).get_destination(destination_id)).public()

    @app.get("/v1/destinations", tags=["destinations"], summary="Every destination",
             **openapi.doc({200: openapi.DestinationList}, errors=[403, 503]))
    async def list_destinations(request: Request, token: Operator) -> dict[str, Any]:
        return {"items": [d.public() for d in await box(request).list_destinations()]}

    @app.delete(
        "/v1/destinations/{destination_id}",
        tags=["destinations"],
        status_code=204,
        summary="Remove a destination no intent refers to (admin)",
        **openapi.doc({204: "deleted"}, errors=[403, 404, 409, 422, 503]),
    )
    async def delete_destination(request: Request, destination_id: str, token: Admin) -> Response:
        await box(request).delete_destination(destination_id)
        log.info("destination %s deleted by %s", destination_id, token.actor)
        return Response(status_code=204)

    # -- grants ----------------------------------------------------------------------------

    @app.put(
        "/v1/grants/{grant_id}",
        tags=["grants"],
        summary="Create or replace a grant (admin); its revision goes up",
        **openapi.doc({201: (openapi.Grant, "created"), 200: (openapi.Grant, "replaced")},
                      body=GrantSpec, errors=openapi.BODY_ERRORS),
    )
    async def put_grant(request: Request, grant_id: str, token: Admin) -> Response:
        spec = await parsed(request, GrantSpec)
        grant, created = await box(request).put_grant(grant_id, spec)
        log.info("grant %s %s by %s", grant_id, "created" if created else "replaced", token.actor)
        return JSONResponse(grant.public(), status_code=201 if created else 200)

    @app.get("/v1/grants/{grant_id}", tags=["grants"], summary="A grant",
             **openapi.doc({200: openapi.Grant}, errors=[403, 404, 422, 503]))
    async def get_grant(request: Request, grant_id: str, token: Operator) -> dict[str, Any]:
        return (await box(request).get_grant(grant_id)).public()

    @app.get("/v1/grants", tags=["grants"], summary="Every grant",
             **openapi.doc({200: openapi.GrantList}, errors=[403, 503]))
    async def list_grants(request: Request, token: Operator) -> dict[str, Any]:
        return {"items": [g.public() for g in await box(request).list_grants()]}

    @app.delete("/v1/grants/{grant_id}", tags=["grants"], status_code=204,
                summary="Remove a grant (admin): later sends it allowed become revoked",
                **openapi.doc({204: "deleted"}, errors=[403, 404, 422, 503]))
    async def delete_grant(request: Request, grant_id: str, token: Admin) -> Response:
        await box(request).delete_grant(grant_id)
        log.info("grant %s deleted by %s", grant_id, token.actor)
        return Response(status_code=204)

    return app

