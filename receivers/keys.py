"""Idempotency keys, the identity they name, and the fingerprint of "the same request".

Follows the IETF Idempotency-Key draft: the header is an sf-string (``"abc"``); a bare token is
accepted as the same key. The body is never part of the key, only of the fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qsl

import rfc8785

MAX_KEY_LENGTH = 255
#: How deeply a JSON body may nest arrays and objects (``max_json_depth``) unless told otherwise.
MAX_JSON_DEPTH = 64


#: A fence is an integer from 0 to 10**18-1 (at most 18 digits): it fits every store's 64-bit column.
MAX_FENCE_DIGITS = 18


class MalformedKey(ValueError):
    """The Idempotency-Key header is malformed or repeated."""


class MalformedFence(ValueError):
    """The Outbox-Fence header is malformed or repeated."""


class InvalidJsonBody(ValueError):
    """A JSON body that parses but cannot be fingerprinted: nested deeper than the limit, or
    holding text that is not Unicode (a lone surrogate escape such as ``"\\ud800"``). The same
    bytes can never succeed, so it is a client error, not a reason to retry."""


def parse_key(values: Sequence[str]) -> str | None:
    """The key from the Idempotency-Key header values (None when absent). Raises MalformedKey."""
    if not values:
        return None
    if len(values) > 1:
        raise MalformedKey("send exactly one Idempotency-Key header")
    raw = values[0].strip()
    key = _unquote(raw[1:-1]) if raw.startswith('"') and len(raw) >= 2 and raw.endswith('"') else raw
    # 1 to MAX_KEY_LENGTH visible ASCII (0x21-0x7e): printable ASCII but the space; string
    # methods, since every request and record asks
    if not (0 < len(key) <= MAX_KEY_LENGTH and key.isascii() and key.isprintable() and " " not in key):
        raise MalformedKey(f"Idempotency-Key must be 1-{MAX_KEY_LENGTH} visible ASCII characters")
    return key


def parse_fence(values: Sequence[str]) -> int | None:
    """The fence from the Outbox-Fence header values (None when absent). Raises MalformedFence."""
    if not values:
        return None
    text = values[0].strip()
    if len(values) > 1 or not (len(text) <= MAX_FENCE_DIGITS and text.isascii() and text.isdigit()):
        raise MalformedFence("Outbox-Fence must be one integer from 0 to 10**18-1")
    return int(text)


def _unquote(inner: str) -> str:
    out, escaped = [], False
    for char in inner:
        if escaped:
            if char not in '"\\':
                raise MalformedKey('Idempotency-Key: only \\" and \\\\ may be escaped in an sf-string')
            out.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            raise MalformedKey("Idempotency-Key: unescaped quote inside the sf-string")
        else:
            out.append(char)
    if escaped:
        raise MalformedKey("Idempotency-Key: the sf-string ends inside an escape")
    return "".join(out)


def identity(scope: str, key: str) -> str:
    """One string for (scope, key), length-prefixed so ``a`` + ``b:c`` never equals ``a:b`` + ``c``."""
    return f"{len(scope)}:{scope}|{len(key)}:{key}"


_SURROGATE = re.compile("[\ud800-\udfff]")


def _text(value: str) -> str:
    """A JSON string, refused when it is not Unicode text (a lone surrogate, from an escape such as
    ``"\\ud800"``: JSON's grammar allows it, UTF-8 and so canonical JSON cannot hold it)."""
    if not value.isascii() and _SURROGATE.search(value):
        raise InvalidJsonBody("the JSON body holds a string that is not Unicode text (a lone surrogate escape "
                              "such as \\ud800); send it as valid UTF-8")
    return value


def _typed(value: Any) -> Any:
    """JSON with its number types made explicit, so 1, 1.0 and "1" stay three requests while key
    order and whitespace stop mattering."""
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return {"$int": str(value)}
    if isinstance(value, float):
        return {"$float": repr(value)}
    if isinstance(value, list):
        return [_typed(item) for item in value]
    return {"$object": {_text(k): _typed(v) for k, v in value.items()}}


#: The tokens that matter for nesting: an escape (two characters, so an escaped quote never ends
#: a string), a quote, or a bracket.
_NESTING_TOKENS = re.compile(rb'\\.|["\[\]{}]', re.S)


def json_depth_exceeds(body: bytes, limit: int) -> bool:
    """Whether the JSON text nests arrays and objects deeper than ``limit``, found by counting
    brackets outside strings (no recursion and no parsing, so any depth is safe to ask about)."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False  # too few brackets to nest that deep: the usual case, at C speed
    depth, in_string = 0, False
    for token in _NESTING_TOKENS.finditer(body):
        char = token.group()
        if char == b'"':
            in_string = not in_string
        elif in_string or len(char) == 2:
            continue
        elif char in b"[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def fingerprint(method: str, route: str, query: str, media_type: str, body: bytes, *,
                max_json_depth: int = MAX_JSON_DEPTH) -> str:
    """``sha256:<hex>`` over method, route, sorted query, media type and body (JSON bodies in
    RFC 8785 canonical form with number types kept; other bodies, and JSON bodies that do not
    parse, as raw bytes). Raises InvalidJsonBody for JSON nested deeper than ``max_json_depth``
    or holding a lone surrogate."""
    # The same bytes always canonicalize the same, and retries send the very same body: remember
    # fingerprints by the raw bytes' digest so only a new body pays for canonical JSON.
    cache_key = (method, route, query, media_type, max_json_depth, hashlib.sha256(body).digest())
    found = _FINGERPRINTS.get(cache_key)
    if found is None:
        found = _fingerprint(method, route, query, media_type, body, max_json_depth)
        if len(_FINGERPRINTS) >= _FINGERPRINTS_MAX:
            _FINGERPRINTS.pop(next(iter(_FINGERPRINTS)))  # the oldest entry
        _FINGERPRINTS[cache_key] = found
    return found


_FINGERPRINTS: dict[tuple[str, str, str, str, int, bytes], str] = {}
_FINGERPRINTS_MAX = 4096


class _NotJson(Exception):
    """The body does not parse as JSON."""


def _parse(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError as exc:  # UnicodeDecodeError too
        raise _NotJson from exc


def _fingerprint(method: str, route: str, query: str, media_type: str, body: bytes, max_json_depth: int) -> str:
    content: dict[str, Any]
    if media_type == "application/json" or media_type.endswith("+json"):
        if json_depth_exceeds(body, max_json_depth):
            raise InvalidJsonBody(f"the JSON body nests arrays or objects deeper than {max_json_depth} levels")
        try:
            content = {"json": _typed(_parse(body))} if body else {"empty": True}
        except RecursionError:  # only with a max_json_depth near Python's own recursion limit
            raise InvalidJsonBody("the JSON body nests arrays or objects too deeply") from None
        except _NotJson:  # the raw bytes identify it
            content = {"raw": hashlib.sha256(body).hexdigest()}
    else:
        content = {"raw": hashlib.sha256(body).hexdigest()}
    canonical = rfc8785.dumps({
        "method": method.upper(),
        "route": route,
        "query": sorted(parse_qsl(query, keep_blank_values=True)),
        "media_type": media_type,
        "body": content,
    })
    return "sha256:" + hashlib.sha256(canonical).hexdigest()
