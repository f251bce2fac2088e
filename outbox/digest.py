"""The payload digest: what "the same operation" means (DESIGN.md section 2)."""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785

from .errors import InvalidInput


def canonical_json(value: Any) -> bytes:
    """Serialize ``value`` as RFC 8785 (JCS) canonical JSON, or raise InvalidInput."""
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


def digest_of(canonical: bytes) -> str:
    """``sha256:<hex>`` of canonical bytes."""
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def payload_digest(value: Any) -> str:
    """``sha256:<hex>`` over the RFC 8785 canonical JSON of ``value``."""
    return digest_of(canonical_json(value))
