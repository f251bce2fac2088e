"""The payload digest: what "the same operation" means. An action id sent again in its scope,
to the same destination with the same digest, is the same intent; with another digest it is a
conflict (the README's "Producers")."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import rfc8785

from receivers.keys import MAX_JSON_DEPTH

from .errors import InvalidInput

#: How deep a payload's arrays and objects may nest. Canonicalising and validating JSON recurse,
#: so a deeper value (a megabyte of "[" fits under the size limit) is refused up front.
MAX_NESTING = MAX_JSON_DEPTH  # what receivers accept: a payload the outbox takes must never get a 400 there


def nesting(value: Any, limit: int = MAX_NESTING) -> int:
    """How deep ``value``'s arrays and objects nest (a scalar is 0), counted without recursion,
    a level at a time, and only up to ``limit + 1``: enough to tell a value over the limit."""
    containers = dict | list | tuple
    level = [value] if isinstance(value, containers) else []
    depth = 0
    while level and depth <= limit:
        depth += 1
        level = [child for item in level for child in (item.values() if isinstance(item, dict) else item)
                 if isinstance(child, containers)]
    return depth


#: The I-JSON integers (RFC 8785 refuses the others).
_SAFE_INTEGER = 2**53 - 1
#: The standard library's encoder writes exactly RFC 8785 for the values ``_plain`` lets through:
#: sorted keys, no whitespace, UTF-8 text, and JCS's escapes (the two-character ones and \u00xx).
_PLAIN = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True, allow_nan=False)


def _plain(value: Any, limit: int = MAX_NESTING) -> bool:
    """Whether ``value`` is JSON the standard library's C encoder serializes exactly as RFC 8785
    does, nested at most ``limit`` deep: dicts with ASCII string keys (whose code-point order is
    JCS's UTF-16 order), lists, strings, booleans, None and I-JSON integers, of those exact types.
    A float (whose shortest form differs from ECMAScript's), a subclass, a wider key or anything
    else is for ``rfc8785``, as is a value too deep (which ``nesting`` then refuses). Walked a
    level at a time, without recursion."""
    level = [value]
    for _ in range(limit):
        deeper = []
        for item in level:
            kind = type(item)
            if kind is dict:
                for key in item:
                    if type(key) is not str or not key.isascii():
                        return False
                children = item.values()
            elif kind is list:
                children = item
            elif kind is str or kind is bool or item is None:
                continue
            elif kind is int:
                if -_SAFE_INTEGER <= item <= _SAFE_INTEGER:
                    continue
                return False
            else:
                return False
            for child in children:
                kind = type(child)
                if kind is dict or kind is list:
                    deeper.append(child)
                elif kind is str or kind is bool or child is None:
                    continue
                elif kind is not int or not -_SAFE_INTEGER <= child <= _SAFE_INTEGER:
                    return False
        if not deeper:
            return True
        level = deeper
    return False


def canonical_json(value: Any) -> bytes:
    """Serialize ``value`` as RFC 8785 (JCS) canonical JSON, or raise InvalidInput. The usual
    payload (no floats, ASCII keys) takes the standard library's C encoder, which writes the same
    bytes at a fraction of ``rfc8785``'s cost; the rest, and every error, take ``rfc8785``."""
    if _plain(value):
        try:
            return _PLAIN.encode(value).encode()
        except UnicodeEncodeError:
            pass  # a lone surrogate: rfc8785 says so below
    if nesting(value) > MAX_NESTING:
        raise InvalidInput(f"payload nests arrays and objects deeper than {MAX_NESTING} levels")
    try:
        return rfc8785.dumps(value)
    except rfc8785.IntegerDomainError as exc:
        raise InvalidInput(
            f"payload holds an integer outside the I-JSON range (|n| < 2**53): {exc}; "
            "send it as a string"
        ) from exc
    except rfc8785.FloatDomainError as exc:
        raise InvalidInput(f"payload holds a number JSON cannot carry (NaN or infinity): {exc}") from exc
    except rfc8785.CanonicalizationError as exc:
        raise InvalidInput(f"payload is not canonicalizable JSON: {exc}") from exc
    except UnicodeEncodeError as exc:  # a lone surrogate: no UTF-8 (nor UTF-16, which JCS sorts by) holds it
        raise InvalidInput(f"payload holds a lone surrogate ({exc.object[exc.start:exc.end]!r}), "
                           "which is not Unicode text") from exc


def digest_of(canonical: bytes) -> str:
    """``sha256:<hex>`` of canonical bytes."""
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def payload_digest(value: Any) -> str:
    """``sha256:<hex>`` over the RFC 8785 canonical JSON of ``value``."""
    return digest_of(canonical_json(value))
