"""Idempotency keys, the identity they name, and the fingerprint of "the same request".

Follows the IETF Idempotency-Key draft: the header is an sf-string (``"abc"``); a bare token is
accepted as the same key. The body is never part of the key, only of the fingerprint.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qsl

import rfc8785

MAX_KEY_LENGTH = 255


class MalformedKey(ValueError):
    """The Idempotency-Key header is malformed or repeated."""


def parse_key(values: Sequence[str]) -> str | None:
    """The key from the Idempotency-Key header values (None when absent). Raises MalformedKey."""
    if not values:
        return None
    if len(values) > 1:
        raise MalformedKey("send exactly one Idempotency-Key header")
    raw = values[0].strip()
    key = _unquote(raw[1:-1]) if len(raw) >= 2 and raw[0] == raw[-1] == '"' else raw
    if not 1 <= len(key) <= MAX_KEY_LENGTH or not all(0x21 <= ord(c) <= 0x7E for c in key):
        raise MalformedKey(f"Idempotency-Key must be 1-{MAX_KEY_LENGTH} visible ASCII characters")
    return key


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


def _typed(value: Any) -> Any:
    """JSON with its number types made explicit, so 1, 1.0 and "1" stay three requests while key
    order and whitespace stop mattering."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return {"$int": str(value)}
    if isinstance(value, float):
        return {"$float": repr(value)}
    if isinstance(value, list):
        return [_typed(item) for item in value]
    return {"$object": {k: _typed(v) for k, v in value.items()}}


def fingerprint(method: str, route: str, query: str, media_type: str, body: bytes) -> str:
    """``sha256:<hex>`` over method, route, sorted query, media type and body (JSON bodies in
    RFC 8785 canonical form with number types kept; other bodies as raw bytes)."""
    # The same bytes always canonicalize the same, and retries send the very same body: remember
    # fingerprints by the raw bytes' digest so only a new body pays for canonical JSON.
    cache_key = (method, route, query, media_type, hashlib.sha256(body).digest())
    found = _FINGERPRINTS.get(cache_key)
    if found is None:
        found = _fingerprint(method, route, query, media_type, body)
        if len(_FINGERPRINTS) >= _FINGERPRINTS_MAX:
            _FINGERPRINTS.pop(next(iter(_FINGERPRINTS)))  # the oldest entry
        _FINGERPRINTS[cache_key] = found
    return found


_FINGERPRINTS: dict[tuple[str, str, str, str, bytes], str] = {}
_FINGERPRINTS_MAX = 4096


def _fingerprint(method: str, route: str, query: str, media_type: str, body: bytes) -> str:
    content: dict[str, Any]
    if media_type == "application/json" or media_type.endswith("+json"):
        try:
            content = {"json": _typed(json.loads(body))} if body else {"empty": True}
        except (ValueError, UnicodeDecodeError):
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
