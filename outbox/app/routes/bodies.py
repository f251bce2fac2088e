"""Request bodies, bounded and strict before any route reads them: ``BodyLimits``, a pure-ASGI
middleware (the shape of ``receivers.asgi``), in front of every route that takes a JSON body
(``POST``, ``PUT`` and ``PATCH`` under ``/v1/``; a request no route answers goes on unread, to
its 404 or 405). A body is refused by its declared or streamed
size before it is parsed, must be JSON (``application/json`` or ``+json``), and may nest no
deeper than a payload may plus its envelope; the route then validates it as its model.

A body must be I-JSON (RFC 7493) as well, the payload inside it included: UTF-8 (no other
encoding, no byte order mark), no lone surrogate in any string or name (it is no Unicode, and
the payload's digest could not be computed), no name twice in one object (JSON parsers differ on
which one wins: the outbox would act on one and a proxy or the receiver read the other).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from receivers.asgi import ClientGone, read_body, replaying

from ...digest import MAX_NESTING, nesting
from ...settings import Settings
from ...shapes import Batch
from ..problems import Problem
from ..web import routes
from .handlers import validation_problem

M = TypeVar("M", bound=BaseModel)

#: Room for the envelope around the payload before a body is refused unread.
ENVELOPE_BYTES = 64 * 1024
#: How many bytes a payload's byte of canonical JSON may take in a body as sent: a character
#: written as an escape (``\u00e9``, which Python's ``json.dumps`` writes for every character
#: outside ASCII) takes up to six. The payload itself is held to ``max_payload_bytes`` of
#: canonical JSON once read, so the body's bound, measured before it is parsed, must not refuse
#: one that JSON merely spells longer.
ESCAPED = 6
JSON_TYPES = ("application/json",)
#: A request body is the payload inside an envelope (and a filter object inside it).
BODY_NESTING = MAX_NESTING + 2
#: A batch is that envelope as an item of a list in an object: a payload one level too deep is
#: still read, and refused in its item's place as the single route refuses it.
BATCH_NESTING = BODY_NESTING + 2
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


#: The methods whose bodies are read, under ``PREFIX``.
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
PREFIX = "/v1/"


@dataclass(frozen=True, slots=True)
class Limit:
    """How large (``size``, in bytes) and how deep (``depth``) a body may be; ``says`` names
    the limit in a 413's detail."""

    size: int
    depth: int
    says: str


def limits(settings: Settings) -> dict[str, Limit]:
    """``BodyLimits``' options for ``settings``: a batch (every route whose body is a
    ``shapes.Batch``), up to ``max_batch_bytes``, its items' payloads as deep as one may be; any
    other body, a payload however its JSON is written (``ESCAPED``) and its envelope. Each item of
    a batch is then held to the single route's limits in its own place (``routes.batches``)."""
    return {"default": Limit(ESCAPED * settings.max_payload_bytes + ENVELOPE_BYTES, BODY_NESTING,
                             f"payload {settings.max_payload_bytes}, each byte written as an escape, + envelope"),
            "batch": Limit(settings.max_batch_bytes, BATCH_NESTING, "max_batch_bytes")}


def takes_batch(route: Any) -> bool:
    """Whether ``route``'s body is a batch (a ``shapes.Batch``, as FastAPI reads its body)."""
    field = getattr(getattr(route, "body_field", None), "field_info", None)
    model = getattr(field, "annotation", None)
    return isinstance(model, type) and issubclass(model, Batch)


class BodyLimits:
    """Reads a JSON body whole, within its ``Limit`` (``batch`` for a route that takes a batch,
    else ``default``), and answers the problem saying why it is refused (415, 413, 400, 422); a
    body it lets through is handed on to the app as it came."""

    def __init__(self, app: ASGIApp, *, router: Any, default: Limit, batch: Limit) -> None:
        self.app = app
        self.router = router
        self.default = default
        self.batch = batch
        self._bodied: list[tuple[re.Pattern[str], frozenset[str], Limit]] | None = None

    def _limit(self, scope: Scope) -> Limit | None:
        """The limit of the route that answers ``scope`` with a body, or None. The routes are
        looked at once (at the first request: all are in by then), and only those that take
        a body are matched, path first, which costs a few regular expressions a request."""
        if self._bodied is None:
            self._bodied = [(route.path_regex, frozenset(route.methods),
                             self.batch if takes_batch(route) else self.default)
                            for route in routes(self.router) if getattr(route, "methods", None)
                            and route.methods & BODY_METHODS and route.path.startswith(PREFIX)]
        return next((limit for pattern, methods, limit in self._bodied
                     if scope["method"] in methods and pattern.match(scope["path"])), None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS or (limit := self._limit(scope)) is None:
            await self.app(scope, receive, send)
            return
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        try:
            body = await _read(headers, receive, limit)
        except Problem as refused:
            await refused.response(scope["path"])(scope, receive, send)
            return
        if body is not None:
            await self.app(scope, replaying(body, receive), send)


async def _read(headers: Mapping[str, str], receive: Receive, limit: Limit) -> bytes | None:
    """The body, once it is known to be JSON within ``limit``; None if the client left before
    sending all of it. Raises the Problem saying why it is refused."""
    media_type = headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type not in JSON_TYPES and not media_type.endswith("+json"):
        raise Problem(
            415, "unsupported-media-type", "Unsupported media type",
            f"send the body as application/json, not {media_type or 'nothing'!r}",
        )
    declared = headers.get("content-length")
    if declared and declared.isascii() and declared.isdigit() and int(declared) > limit.size:
        raise Problem(
            413, "payload-too-large", "Payload too large",
            f"body is {declared} bytes; the limit is {limit.size} ({limit.says})",
        )
    try:
        body = await read_body(receive, limit.size)
    except ClientGone:
        return None
    if body is None:
        raise Problem(
            413, "payload-too-large", "Payload too large",
            f"body exceeds the limit of {limit.size} bytes",
        )
    _check(body, limit.depth)
    return body


def _check(body: bytes, depth_limit: int) -> None:
    """Refuse a body that is not I-JSON within ``depth_limit`` levels (a Problem: 400, 422)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Problem(400, "invalid-json", "Invalid JSON",
                      f"the body is not JSON: JSON is sent as UTF-8 (RFC 8259 section 8.1), and this is not: {exc}"
                      ) from None
    try:
        parsed = json.loads(text, object_pairs_hook=_object)
    except json.JSONDecodeError as exc:
        raise Problem(400, "invalid-json", "Invalid JSON", f"the body is not JSON: {exc}") from None
    except _RepeatedName as exc:
        raise Problem(422, "invalid-input", "Invalid input",
                      f"the body names {exc.args[0]!r} twice in one object; each name once (I-JSON, RFC 7493 "
                      "section 2.3)") from None
    except RecursionError:
        parsed = None  # far too deep to parse: refused below like any body over the limit
        depth = depth_limit + 1
    else:
        depth = nesting(parsed, depth_limit)
    if depth > depth_limit:
        raise Problem(422, "invalid-input", "Invalid input",
                      f"the body nests arrays and objects deeper than allowed: a payload may nest "
                      f"{MAX_NESTING} levels")
    if SURROGATE_ESCAPE.search(text) and any(LONE_SURROGATE.search(s) for s in _strings(parsed)):
        raise Problem(422, "invalid-input", "Invalid input",
                      "the body holds a lone surrogate (a \\ud800-\\udfff escape not in a pair) in a string or a "
                      "name: that is not Unicode text (I-JSON, RFC 7493 section 2.1)")


def validated(model: type[M], raw: Any) -> M:
    """``raw`` (a parsed body, or part of one) validated as ``model``, or the problem saying
    what is wrong."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise validation_problem(exc.errors()) from None
