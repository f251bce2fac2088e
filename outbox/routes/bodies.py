"""Request bodies: the routes read them themselves, so a body is refused by its declared or
streamed size before it is parsed, must be JSON (``application/json`` or ``+json``), and may
nest no deeper than a payload may plus its envelope."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from ..digest import MAX_NESTING, nesting
from ..problems import Problem
from ..settings import Settings
from .handlers import validation_problem

M = TypeVar("M", bound=BaseModel)

#: Room for the envelope around the payload before a body is refused unread.
ENVELOPE_BYTES = 64 * 1024
JSON_TYPES = ("application/json",)
#: A request body is the payload inside an envelope (and a filter object inside it).
BODY_NESTING = MAX_NESTING + 2


async def json_body(request: Request, *, batch: bool = False) -> Any:
    """The request's JSON body, or the problem saying why it is refused (415, 413, 400, 422).
    A ``batch`` body holds many payloads, each inside its own envelope, one level deeper."""
    settings: Settings = request.app.state.settings
    body_limit = settings.max_batch_bytes if batch else settings.max_payload_bytes + ENVELOPE_BYTES
    limit_text = "max_batch_bytes" if batch else f"payload {settings.max_payload_bytes} + envelope"
    body_nesting = BODY_NESTING + 1 if batch else BODY_NESTING
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type not in JSON_TYPES and not media_type.endswith("+json"):
        raise Problem(
            415, "unsupported-media-type", "Unsupported media type",
            f"send the body as application/json, not {media_type or 'nothing'!r}",
        )
    declared = request.headers.get("content-length")
    if declared and declared.isascii() and declared.isdigit() and int(declared) > body_limit:
        raise Problem(
            413, "payload-too-large", "Payload too large",
            f"body is {declared} bytes; the limit is {body_limit} "
            f"({limit_text})",
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
        depth = body_nesting + 1
    else:
        depth = nesting(body, body_nesting)
    if depth > body_nesting:
        raise Problem(422, "invalid-input", "Invalid input",
                      f"the body nests arrays and objects deeper than allowed: a payload may nest "
                      f"{MAX_NESTING} levels")
    return body


async def parsed(request: Request, model: type[M]) -> M:
    """The JSON body validated as ``model``, or the problem saying what is wrong."""
    return validated(model, await json_body(request))


def validated(model: type[M], raw: Any) -> M:
    """``raw`` (a parsed body) validated as ``model``, or the problem saying what is wrong."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise validation_problem(exc.errors()) from None
