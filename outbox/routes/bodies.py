"""Request bodies: the routes read them themselves, so a body is refused by its declared or
streamed size before it is parsed, must be JSON (``application/json`` or ``+json``), and may
nest no deeper than a payload may plus its envelope.

A body must be I-JSON (RFC 7493) as well, the payload inside it included: UTF-8 (no other
encoding, no byte order mark), no lone surrogate in any string or name (it is no Unicode, and
the payload's digest could not be computed), no name twice in one object (JSON parsers differ on
which one wins: the outbox would act on one and a proxy or the receiver read the other).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
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
#: A ``\\u`` escape of a surrogate, which a lone surrogate needs (a pair is one character once
#: parsed); its match may be an escaped backslash's false alarm, which the parsed body settles.
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class _RepeatedName(ValueError):
    """An object of the body names a member twice."""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object of the body, refused if it names a member twice."""
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise _RepeatedName(name)
            seen.add(name)
    return found


def _strings(value: Any) -> Iterator[str]:
    """Every string in a parsed body, member names included, without recursion."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            yield from item
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)


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
        text = b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Problem(400, "invalid-json", "Invalid JSON",
                      f"the body is not JSON: JSON is sent as UTF-8 (RFC 8259 section 8.1), and this is not: {exc}"
                      ) from None
    try:
        body = json.loads(text, object_pairs_hook=_object)
    except json.JSONDecodeError as exc:
        raise Problem(400, "invalid-json", "Invalid JSON", f"the body is not JSON: {exc}") from None
    except _RepeatedName as exc:
        raise Problem(422, "invalid-input", "Invalid input",
                      f"the body names {exc.args[0]!r} twice in one object; each name once (I-JSON, RFC 7493 "
                      "section 2.3)") from None
    except RecursionError:
        body = None  # far too deep to parse: refused below like any body over the limit
        depth = body_nesting + 1
    else:
        depth = nesting(body, body_nesting)
    if depth > body_nesting:
        raise Problem(422, "invalid-input", "Invalid input",
                      f"the body nests arrays and objects deeper than allowed: a payload may nest "
                      f"{MAX_NESTING} levels")
    if SURROGATE_ESCAPE.search(text) and any(LONE_SURROGATE.search(s) for s in _strings(body)):
        raise Problem(422, "invalid-input", "Invalid input",
                      "the body holds a lone surrogate (a \\ud800-\\udfff escape not in a pair) in a string or a "
                      "name: that is not Unicode text (I-JSON, RFC 7493 section 2.1)")
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
