"""The Standard Webhooks signature, shared by the sender that signs and the receivers that verify."""

from __future__ import annotations

import base64
import hashlib
import hmac


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """base64 HMAC-SHA256 over ``id.timestamp.body`` with a ``whsec_`` secret (without ``v1,``)."""
    encoded = secret.removeprefix("whsec_")
    key = base64.b64decode(encoded + "=" * (-len(encoded) % 4))  # unpadded secrets are common
    return base64.b64encode(hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()).decode()
