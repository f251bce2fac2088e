"""The Standard Webhooks signature, shared by the sender that signs and the receivers that verify."""

from __future__ import annotations

import base64
import functools
import hmac


@functools.lru_cache(maxsize=256)
def secret_key(secret: str) -> bytes:
    """The HMAC key a ``whsec_`` secret stands for (decoded once, not per request)."""
    encoded = secret.removeprefix("whsec_")
    return base64.b64decode(encoded + "=" * (-len(encoded) % 4))  # unpadded secrets are common


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """base64 HMAC-SHA256 over ``id.timestamp.body`` with a ``whsec_`` secret (without ``v1,``)."""
    message = f"{msg_id}.{timestamp}.".encode() + body
    return base64.b64encode(hmac.digest(secret_key(secret), message, "sha256")).decode()
