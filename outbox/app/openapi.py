"""The API's OpenAPI document, for what the routes' types cannot say, and its documentation page,
both complete without the network.

FastAPI generates the document from the routes: their parameters and bodies (``outbox.shapes``,
whose id types carry their patterns), the answers :func:`doc` declares for each, the bearer
scheme (``routes.auth``) and the operation ids (the routes' names: :func:`operation_id`).
:func:`install` adds what no type says: every error is an RFC 9457 problem as
``application/problem+json`` (FastAPI puts a model's schema under ``application/json`` only, so
the answers refer to the ``Problem`` schema added here), and a destination's body and answer
are those of one installed channel, told apart by ``channel`` (channels are found at run time:
``outbox.channels``). It also serves Swagger UI from the installed ``swagger-ui-bundle-v2``
package (Swagger UI 5, which reads OpenAPI 3.1) instead of a CDN.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, PlainTextResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException

from .. import channels
from ..destinations import DestinationSpec
from ..shapes import Destination, IntentHistory, Problem
from .problems import MEDIA_TYPE as PROBLEM_MEDIA_TYPE

SCHEMAS = "#/components/schemas/"

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
    return {"description": description, "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": SCHEMAS + "Problem"}}}}


Answer = type[BaseModel] | str | tuple[type[BaseModel], str]


def doc(
    answers: dict[int, Answer],
    *,
    errors: Iterable[int] | Mapping[int, str] = (),
    example: str | None = None,
    token: bool = True,
    headers: Mapping[int, dict[str, Any]] | None = None,
    text: bool = False,
) -> dict[str, Any]:
    """A route decorator's documentation arguments: its success ``answers`` (status: a model,
    a model and what the status means, or only what it means for an empty answer), the error
    statuses it can answer besides the ``default`` problem (with what they mean there, unless
    ``WHEN`` says it), the name of its request body's ``example`` (``EXAMPLES``), whether it
    takes a bearer ``token`` (which may be refused: 401), the ``headers`` of its answers, and
    whether it answers plain ``text``."""
    responses: dict[int | str, dict[str, Any]] = {}
    for status, answer in answers.items():
        if isinstance(answer, str):
            responses[status] = {"description": answer}
        else:
            model, meaning = answer if isinstance(answer, tuple) else (answer, _first_line(answer))
            responses[status] = {"description": meaning, "model": model}
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
    documented: dict[str, Any] = {"response_model": None, "responses": responses}
    if example is not None:
        documented["openapi_extra"] = {"requestBody": {"content": {"application/json": {
            "example": EXAMPLES[example]}}}}
    if text:
        documented["response_class"] = PlainTextResponse
    return documented


def _first_line(model: type[BaseModel]) -> str:
    return (model.__doc__ or model.__name__).strip().splitlines()[0]


def action(body: type[BaseModel]) -> dict[str, Any]:
    """An operator's action on one intent: the intent as the action left it."""
    return doc({200: IntentHistory}, example=body.__name__, errors=[*BODY_ERRORS, 404, 409])


#: Where the intent is read back.
LOCATION = {"Location": {"description": "the intent's URL", "schema": {"type": "string"}}}

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
    "EventIn": {"event_id": "invoice-42-paid", "scope": "acme", "topic": "invoice.paid",
                "payload": {"invoice": 42, "amount_cents": 1999}},
    "EventBatchIn": {"events": [
        {"event_id": "invoice-42-paid", "scope": "acme", "topic": "invoice.paid", "payload": {"invoice": 42}},
        {"event_id": "invoice-43-paid", "scope": "acme", "topic": "invoice.paid", "payload": {"invoice": 43}}]},
    "DeliverIn": {"destination": "ledger", "reason": "ledger subscribed after invoice 42 was paid"},
    "PortalLinkIn": {"session_seconds": 3600, "read_only": False},
    "RotateIn": {"window_seconds": 86400},
    "TestIn": {},
}
#: A destination's body, which its channel's spec validates (``routes.registry``): documented
#: by :func:`install` as the spec of one installed channel.
DESTINATION_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"$ref": SCHEMAS + "DestinationSpec"}, "example": EXAMPLES["DestinationSpec"]}}}}


def operation_id(route: APIRoute) -> str:
    """A route's operation id: its function's name (``put_destination``), which generated
    clients name their methods after."""
    return route.name


# -- what no type can say ------------------------------------------------------------------


class _ChannelDestination(Destination):
    model_config = ConfigDict(extra="forbid")


def channel_answer(kind: channels.ChannelKind) -> type[Destination]:
    """How the API shows a destination of ``kind``: the shared fields and the settings its spec
    keeps (every field but the shared ones and those never shown, such as a password)."""
    own = {name: (field.annotation, Field(alias=field.alias, description=field.description))
           for name, field in kind.spec.model_fields.items()
           if name not in DestinationSpec.model_fields and not field.exclude}
    name = kind.spec.__name__.removesuffix("Spec") + "Destination"
    model: type[Destination] = create_model(  # type: ignore[call-overload]
        name, __base__=_ChannelDestination, __doc__=f"A {kind.name} destination as the API shows it.",
        channel=(Literal[kind.name], ...), **own)
    return model


def _secret_needed(schema: dict[str, Any], kind: channels.ChannelKind) -> None:
    """Say on a spec's ``secret`` that a new destination needs one (a replacement keeps its own)."""
    secret = schema.get("properties", {}).get("secret")
    if kind.needs_secret and secret is not None:
        secret["description"] = (f"required when the destination is new: {kind.secret_form}. "
                                 + secret.get("description", ""))


def _generated(models: list[tuple[type[BaseModel], Literal["validation", "serialization"]]]) -> dict[str, Any]:
    _, generated = models_json_schema(models, ref_template=SCHEMAS + "{model}")
    defs: dict[str, Any] = generated.get("$defs", {})
    return defs


def complete(document: dict[str, Any]) -> dict[str, Any]:
    """Finish FastAPI's document in place: the ``Problem`` schema, and the destinations' bodies
    and answers of every installed channel."""
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in _generated([(Problem, "serialization")]).items():
        schemas.setdefault(name, schema)
    kinds = [channels.get(name) for name in channels.names()]
    answers = [channel_answer(kind) for kind in kinds]
    for name, schema in _generated([(kind.spec, "validation") for kind in kinds]
                                   + [(answer, "serialization") for answer in answers]).items():
        schemas.setdefault(name, schema)
    for kind in kinds:
        _secret_needed(schemas[kind.spec.__name__], kind)
    schemas["DestinationSpec"] = {
        "description": "What an admin sends to register or replace a destination: the spec of one "
                       f"installed channel, named by `channel` ({channels.DEFAULT} when omitted).",
        "oneOf": [{"$ref": SCHEMAS + kind.spec.__name__} for kind in kinds]}
    # the shared fields stay described where every destination has them; which channel's
    # settings come with them, ``channel`` says
    schemas[Destination.__name__].update({
        "oneOf": [{"$ref": SCHEMAS + answer.__name__} for answer in answers],
        "discriminator": {"propertyName": "channel", "mapping": {
            kind.name: SCHEMAS + answer.__name__ for kind, answer in zip(kinds, answers, strict=True)}}})
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
