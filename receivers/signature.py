"""Verifying Standard Webhooks signatures (``webhook-id``, ``webhook-timestamp``,
``webhook-signature``), with secret rotation and a timestamp tolerance against replays."""

from __future__ import annotations

import hmac
import time
from collections.abc import Mapping, Sequence

from outbox.signing import signature


class InvalidSignature(ValueError):
    """The webhook's signature, or its timestamp, does not check out."""


def verify_signature(
    secrets: str | Sequence[str],
    headers: Mapping[str, str],
    body: bytes,
    *,
    tolerance_seconds: float = 300,
    now: float | None = None,
) -> None:
    """Raise InvalidSignature unless one ``v1`` signature in the headers matches one of
    ``secrets`` (``whsec_…``; several while rotating) and the timestamp is within tolerance."""
    lower = {k.lower(): v for k, v in headers.items()}
    try:
        msg_id, stamp, signatures = lower["webhook-id"], lower["webhook-timestamp"], lower["webhook-signature"]
    except KeyError as exc:
        raise InvalidSignature(f"missing header {exc.args[0]}") from None
    try:
        timestamp = int(stamp)
    except ValueError:
        raise InvalidSignature("webhook-timestamp is not an integer") from None
    current = time.time() if now is None else now
    if abs(timestamp) > 2**53 or abs(current - timestamp) > tolerance_seconds:  # 2**53: comparable as a float
        raise InvalidSignature(f"webhook-timestamp is more than {tolerance_seconds:.0f}s from now")
    offered = [s.split(",", 1)[1] for s in signatures.split() if s.startswith("v1,") and s.isascii()]
    for secret in [secrets] if isinstance(secrets, str) else secrets:
        expected = signature(secret, msg_id, timestamp, body)
        if any(hmac.compare_digest(expected, candidate) for candidate in offered):
            return
    raise InvalidSignature("no webhook-signature matches the secret(s)")
