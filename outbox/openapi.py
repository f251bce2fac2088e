"""The API's OpenAPI document and its documentation page, both complete without the network.

The routes read their bodies themselves (``outbox.api``), so FastAPI cannot see what they take
or answer. Each route's decorator gets :func:`doc`: its request body and answers as ``$ref`` s
into ``components/schemas``, every error as an RFC 9457 problem, and a bearer token. The models
below only document: no route validates or serialises through them. :func:`install` replaces
``app.openapi`` so the schemas referred to are generated with pydantic and merged in, and the
id parameters carry the patterns the API checks; and it serves Swagger UI from the installed
``swagger-ui-bundle-v2`` package (Swagger UI 5, which reads OpenAPI 3.1) instead of a CDN.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, PlainTextResponse, Response
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, JsonValue
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException

from . import channels
from .ids import ACTION_ID, DESTINATION_ID, ORDERING_KEY, SCOPE, TOKEN_ID, TOKEN_LABEL
from .model import OnDead, OnUnknown, Ordering, Outcome, Role, Status, Submission
from .problems import MEDIA_TYPE as PROBLEM_MEDIA_TYPE
from .problems import TYPE_PREFIX

SCHEMAS = "#/components/schemas/"
BEARER = "bearer"

# -- what the API answers (documentation only) ---------------------------------------------


class BatchIntent(BaseModel):
    """An intent as a batch answers it: all but the payload, which the caller sent (its digest
    is here)."""

    action_id: str
    scope: str
    idempotency_key: str = Field(description="what receivers deduplicate on: scope/action_id")
    destination: str
    channel: str
    ordering_key: str | None = Field(description="what the intent is ordered by at its destination, if anything")
    status: Status
    payload_digest: str = Field(description="sha256: over the RFC 8785 canonical payload")
    attempt_count: int
    max_attempts: int
    next_attempt_at: AwareDatetime | None
    not_before: AwareDatetime | None
    expires_at: AwareDatetime | None
    lease_owner: str | None
    lease_expires_at: AwareDatetime | None
    fence: int
    created_at: AwareDatetime
    updated_at: AwareDatetime
    last_error: str | None
    unreadable: str | None = Field(description=(
        "null, unless some of its stored times are beyond what can be read (years 1 to 9999 UTC; a row written "
        "by hand): which, each shown as the nearest time that can be read; the sender sets it aside, dead"))


class Intent(BatchIntent):
    """An intent as the API shows it."""

    payload: JsonValue = Field(description="the JSON the destination receives")


class Attempt(BaseModel):
    """One try at submitting an intent, with what the sender could establish."""

    attempt_id: str
    number: int
    fence: int
    worker: str
    started_at: AwareDatetime
    finished_at: AwareDatetime | None
    submission: Submission | None = Field(description="null while the attempt is in flight")
    outcome: Outcome | None = Field(description="null while the attempt is in flight")
    status_code: int | None
    reply: str | None
    external_id: str | None
    error: str | None
    duration_ms: float | None
    stage: str | None = Field(description="how far the attempt got, for channels with stages (email: connect, "
                                          "tls, ehlo, auth, mail, rcpt, data, message, done)")


class Event(BaseModel):
    """One entry of an intent's append-only history."""

    kind: str
    at: AwareDatetime
    actor: str
    reason: str | None
    data: dict[str, JsonValue]


class IntentHistory(Intent):
    """An intent with its attempts and events, as an operator's action left it."""

    attempts: list[Attempt]
    events: list[Event]


class WaitingBehind(BaseModel):
    """The earliest intent of the same destination and ordering key in the way of a pending intent
    (the destination delivers each key in enqueue order); its fields are null when it is in a scope
    the token cannot read."""

    action_id: str | None
    scope: str | None
    status: Status | None


class IntentDetail(IntentHistory):
    """An intent with its attempts and events."""

    settled: bool = Field(
        description="delivered, dead, revoked, unknown or cancelled: a long poll need not ask again")
    waiting_behind: WaitingBehind | None = Field(
        description="what a pending intent of an ordered destination waits for; null when it waits for nothing")


class IntentPage(BaseModel):
    """A page of intents, newest first."""

    items: list[Intent]
    next_cursor: str | None = Field(description="pass back as `cursor` for the next page; null on the last")


class Destination(BaseModel):
    """A destination as the API shows it: everything but its secrets, the channel's own
    settings (a webhook's ``url``) beside the shared fields."""

    model_config = ConfigDict(extra="allow")

    id: str
    channel: str
    signing_secrets: int = Field(description="how many signing secrets it has (never the secrets)")
    idempotent: bool
    retention_seconds: int
    on_unknown: OnUnknown
    timeout_seconds: float
    requires_approval: bool
    allow_private_network: bool
    disabled: bool
    reconcile: bool
    ordering: Ordering
    ordering_on_dead: OnDead
    created_at: AwareDatetime
    updated_at: AwareDatetime


class DestinationList(BaseModel):
    """Every destination."""

    items: list[Destination]


class Grant(BaseModel):
    """A grant: scope may have effects made at destination ('*': any) until expires_at."""

    id: str
    scope: str
    destination: str
    revision: int
    expires_at: AwareDatetime | None
    note: str | None
    created_at: AwareDatetime
    updated_at: AwareDatetime


class GrantList(BaseModel):
    """Every grant."""

    items: list[Grant]


class Token(BaseModel):
    """An API token as the API shows it: never its text, which only its creator saw."""

    id: str = Field(description="the token's public id (its text starts obx_<id>_)")
    role: Role
    scopes: list[str] = Field(description="a producer's scopes ('*': all); empty for operators and admins")
    label: str | None
    created_at: AwareDatetime
    revoked_at: AwareDatetime | None


class NewToken(Token):
    """A new token, with its text: shown in this answer only (only its hash is stored)."""

    token: str = Field(description="the bearer token; keep it secret")


class TokenList(BaseModel):
    """Every token, active and revoked."""

    items: list[Token]


class BulkReplayResult(BaseModel):
    """What a bulk replay matched and did."""

    dry_run: bool
    matched: int
    action_ids: list[str] = Field(description="the intents matched")
    replayed: int
    refused: dict[str, str] = Field(description="action_id: why it was not replayed")


class Health(BaseModel):
    """The process is up (degraded: its sender is waiting for the database, or set intents aside
    whose stored times cannot be read)."""

    status: Literal["ok", "degraded"]
    detail: str | None = Field(default=None, description="what the sender waits for, or set aside, when degraded")


class Ready(BaseModel):
    """The store answers."""

    status: Literal["ready"]


class FieldError(BaseModel):
    """One reason an input was refused."""

    field: str = Field(description="dotted path of the field; empty for the body as a whole")
    message: str


class Problem(BaseModel):
    """An RFC 9457 problem: every error is one, as application/problem+json."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(pattern=f"^{re.escape(TYPE_PREFIX)}[a-z0-9-]+$",
                      description="what went wrong; the kinds are listed in the README's Errors table",
                      examples=[TYPE_PREFIX + "unknown-destination"])
    title: str
    status: int = Field(ge=400, le=599)
    detail: str = Field(description="what to change")
    instance: str = Field(default="", description="the path that was asked for")
    errors: list[FieldError] = Field(default_factory=list, description="invalid-input: each refused field")


class BatchItem(BaseModel):
    """One intent's answer in a batch, in the request's order: ``status`` is what POST
    /v1/intents would have answered for it alone (201 created, 200 the same intent already
    existed, 403, 409, 413, 422), with the intent or the problem."""

    status: int
    intent: BatchIntent | None = Field(default=None, description="when status is 200 or 201")
    problem: Problem | None = Field(default=None, description="otherwise: the problem+json a single enqueue answers")


class BatchResult(BaseModel):
    """Every intent's answer, in the request's order (the batch was one durable commit)."""

    results: list[BatchItem]


#: Every schema a route may refer to, by component name: request bodies are documented as the
#: API validates them, answers as it serialises them.
_MODELS: dict[str, tuple[type[BaseModel], Literal["validation", "serialization"]]] = {}


def ref(model: type[BaseModel], mode: Literal["validation", "serialization"] = "serialization") -> dict[str, str]:
    """A ``$ref`` to ``model``'s schema in ``components/schemas``, merged in by :func:`install`."""
    known = _MODELS.setdefault(model.__name__, (model, mode))
    if known != (model, mode):
        raise ValueError(f"two schemas would be named {model.__name__}: {known} and {(model, mode)}")
    return {"$ref": SCHEMAS + model.__name__}


# -- what each route answers ---------------------------------------------------------------

#: When each error status is answered (problem types as in the README's Errors table).
WHEN: dict[int, str] = {
    400: "`invalid-json`: the body is not JSON; `bad-cursor`: a cursor was altered",
    401: "`unauthenticated`: no bearer token, or an unknown or revoked one",
    403: "`forbidden`, `forbidden-scope`: the token's role or scopes do not allow it",
    404: "`not-found`: no such record (or not in the token's scopes)",
    409: "the request conflicts with the record's state (`intent-conflict`, `illegal-transition`, ...)",
    413: "`payload-too-large`: the body or payload is over the limit",
    415: "`unsupported-media-type`: the body is not application/json",
    422: "`invalid-input`, `unknown-destination`: a field is missing, extra or malformed",
    503: "`store-unavailable`: the database is locked or full (`Retry-After` says when to retry)",
}
#: What a route with a bearer token and a JSON body can answer besides its own errors.
BODY_ERRORS = (400, 401, 403, 413, 415, 422, 503)


def problem(description: str) -> dict[str, Any]:
    """A problem+json answer."""
    return {"description": description, "content": {PROBLEM_MEDIA_TYPE: {"schema": ref(Problem)}}}


Answer = type[BaseModel] | str | tuple[type[BaseModel], str]


def doc(
    answers: dict[int, Answer],
    *,
    errors: Iterable[int] | Mapping[int, str] = (),
    body: type[BaseModel] | None = None,
    token: bool = True,
    headers: Mapping[int, dict[str, Any]] | None = None,
    media_type: Literal["application/json", "text/plain"] = "application/json",
) -> dict[str, Any]:
    """A route decorator's documentation arguments: its success ``answers`` (status: a model,
    a model and what the status means, or only what it means for an empty answer), the error
    statuses it can answer besides the ``default`` problem (with what they mean there, unless
    ``WHEN`` says it), its JSON request ``body``, whether it takes a bearer ``token``, and the
    ``headers`` of its answers."""
    responses: dict[int | str, dict[str, Any]] = {}
    for status, answer in answers.items():
        if isinstance(answer, str):
            responses[status] = {"description": answer}
        else:
            model, meaning = answer if isinstance(answer, tuple) else (answer, _first_line(answer))
            responses[status] = {"description": meaning, "content": {media_type: {"schema": ref(model)}}}
        if headers and status in headers:
            responses[status]["headers"] = headers[status]
    meanings = dict(errors) if isinstance(errors, Mapping) else {status: WHEN[status] for status in errors}
    if token:
        meanings.setdefault(401, WHEN[401])
    for status in sorted(meanings):
        responses[status] = problem(meanings[status])
        if status == 401:
            responses[status]["headers"] = {"WWW-Authenticate": {
                "description": 'Bearer realm="outbox"', "schema": {"type": "string"}}}
    responses["default"] = problem("any other error (405, 500, ...)")
    extra: dict[str, Any] = {}
    if body is not None:
        content: dict[str, Any] = {"schema": ref(body, "validation")}
        if body.__name__ in EXAMPLES:
            content["example"] = EXAMPLES[body.__name__]
        extra["requestBody"] = {"required": True, "content": {"application/json": content}}
    if token:
        extra["security"] = [{BEARER: []}]
    documented: dict[str, Any] = {"response_model": None, "responses": responses, "openapi_extra": extra}
    if media_type == "text/plain":
        documented["response_class"] = PlainTextResponse
    return documented


def _first_line(model: type[BaseModel]) -> str:
    return (model.__doc__ or model.__name__).strip().splitlines()[0]


def action(body: type[BaseModel]) -> dict[str, Any]:
    """An operator's action on one intent: the intent as the action left it."""
    return doc({200: IntentHistory}, body=body, errors=[*BODY_ERRORS, 404, 409])


#: Where the intent is read back.
LOCATION = {"Location": {"description": "the intent's URL", "schema": {"type": "string"}}}


# -- the document --------------------------------------------------------------------------


def ecma(*alternatives: re.Pattern[str] | str) -> str:
    """Python patterns used with ``re.fullmatch`` (or literal strings) as one JSON Schema
    ``pattern`` (ECMA-262, which searches): anchored at both ends, where ``$`` allows no
    trailing newline."""
    cores = [re.escape(a) if isinstance(a, str) else a.pattern.removeprefix("^").removesuffix("$")
             for a in alternatives]
    return f"^(?:{'|'.join(cores)})$"


#: Parameters whose values the API checks against a pattern, by name.
PARAMETER_PATTERNS: dict[str, str] = {
    "action_id": ecma(ACTION_ID),
    "destination_id": ecma(DESTINATION_ID),
    "grant_id": ecma(DESTINATION_ID),
    "destination": ecma(DESTINATION_ID),
    "scope": ecma(SCOPE),
    "token_id": ecma(TOKEN_ID),
}
#: Request body fields the API checks against a pattern, by schema and field.
FIELD_PATTERNS: dict[str, dict[str, str]] = {
    "IntentIn": {"action_id": ecma(ACTION_ID), "scope": ecma(SCOPE), "destination": ecma(DESTINATION_ID),
                 "ordering_key": ecma(ORDERING_KEY)},
    "GrantSpec": {"scope": ecma(SCOPE), "destination": ecma("*", DESTINATION_ID)},
    "ReplayFilter": {"scope": ecma(SCOPE), "destination": ecma(DESTINATION_ID)},
    "TokenSpec": {"scopes": ecma("*", SCOPE), "label": ecma(TOKEN_LABEL)},
}
#: Request bodies as a client would send them (the README's examples).
EXAMPLES: dict[str, dict[str, Any]] = {
    "IntentIn": {"action_id": "invoice-42-send", "scope": "acme", "destination": "billing",
                 "payload": {"invoice": 42, "amount_cents": 1999}},
    "DestinationSpec": {"url": "https://billing.example.com/webhooks",
                        "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "idempotent": True},
    "GrantSpec": {"scope": "acme", "destination": "billing"},
    "TokenSpec": {"role": "producer", "scopes": ["acme"], "label": "acme's billing app"},
    "BatchIn": {"intents": [
        {"action_id": "invoice-42-send", "scope": "acme", "destination": "billing", "payload": {"invoice": 42}},
        {"action_id": "invoice-43-send", "scope": "acme", "destination": "billing", "payload": {"invoice": 43}}]},
    "ReasonIn": {"reason": "order refunded before sending"},
    "ReplayIn": {"reason": "billing outage 02:00-03:00, INC-4711"},
    "ResolveIn": {"resolution": "delivered", "external_id": "inv-981", "reason": "seen in billing's ledger"},
    "ApproveIn": {"payload_digest": "sha256:9f2c4e1f0c8b7a6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d",
                  "valid_seconds": 3600, "reason": "checked with finance"},
    "BulkReplayIn": {"reason": "billing outage 02:00-03:00, INC-4711",
                     "filter": {"status": ["dead"], "destination": "billing"}, "dry_run": True},
}


def _strings(schema: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The string schemas in a parameter's schema (itself, its items, its anyOf branches)."""
    if schema.get("type") == "string":
        yield schema
    if isinstance(schema.get("items"), dict):
        yield from _strings(schema["items"])
    for branch in schema.get("anyOf", []):
        yield from _strings(branch)


def refs(value: Any) -> Iterator[str]:
    """Every ``$ref`` in a document."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "$ref" and isinstance(item, str):
                yield item
            else:
                yield from refs(item)
    elif isinstance(value, list):
        for item in value:
            yield from refs(item)


def complete(document: dict[str, Any]) -> dict[str, Any]:
    """Finish FastAPI's document in place: the schemas referred to, the parameters' patterns,
    the bearer scheme."""
    components = document.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    wanted = {r.removeprefix(SCHEMAS) for r in refs(document["paths"]) if r.startswith(SCHEMAS)}
    models = [_MODELS[name] for name in sorted(wanted) if name in _MODELS]
    if models:
        _, generated = models_json_schema(models, ref_template=SCHEMAS + "{model}")
        for name, schema in generated.get("$defs", {}).items():
            schemas.setdefault(name, schema)
    for operations in document["paths"].values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                pattern = PARAMETER_PATTERNS.get(parameter["name"])
                if pattern is not None and parameter["in"] in ("path", "query"):
                    for string in _strings(parameter.get("schema", {})):
                        string["pattern"] = pattern
    for name, fields in FIELD_PATTERNS.items():
        properties = schemas.get(name, {}).get("properties", {})
        for field, pattern in fields.items():
            for string in _strings(properties.get(field, {})):
                string["pattern"] = pattern
    if "DestinationSpec" in schemas:  # one schema per installed channel, told apart by ``channel``
        kinds = [channels.get(name) for name in channels.names()]
        _, generated = models_json_schema([(kind.spec, "validation") for kind in kinds],
                                          ref_template=SCHEMAS + "{model}")
        for name, schema in generated.get("$defs", {}).items():
            schemas.setdefault(name, schema)
        schemas["DestinationSpec"] = {
            "description": "What an admin sends to register or replace a destination: the spec of one "
                           f"installed channel, named by `channel` ({channels.DEFAULT} when omitted).",
            "oneOf": [{"$ref": SCHEMAS + kind.spec.__name__} for kind in kinds]}
    components.setdefault("securitySchemes", {})[BEARER] = {
        "type": "http", "scheme": "bearer",
        "description": "an API token (`outbox tokens create`): producer, operator or admin"}
    return document


# -- the docs page, served locally ---------------------------------------------------------

DOCS_ASSETS = "/docs/assets"
#: The Swagger UI files the docs page loads, with their media types.
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon-32x32.png": "image/png",
}


def swagger_ui_dir() -> Path:
    """Where the installed ``swagger-ui-bundle-v2`` keeps Swagger UI."""
    from swagger_ui_bundle import swagger_ui_path

    return Path(str(swagger_ui_path))


def install(app: FastAPI) -> None:
    """Complete ``app``'s OpenAPI document and serve ``/docs`` from local assets (create the
    app with ``docs_url=None, redoc_url=None``)."""
    generate: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:  # generate() keeps what it made there; complete it once
            complete(generate())
        assert app.openapi_schema is not None
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    assets = swagger_ui_dir()
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url, title=f"{app.title} · API",
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}/favicon-32x32.png",
        )

    @app.get(DOCS_ASSETS + "/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        media_type = ASSETS.get(name)
        if media_type is None:
            raise HTTPException(404)
        return FileResponse(assets / name, media_type=media_type,
                            headers={"Cache-Control": "public, max-age=86400"})
