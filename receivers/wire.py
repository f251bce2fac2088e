"""The wire contract between the sender and the receivers: header names, the Standard Webhooks
signature (``webhook-id``, ``webhook-timestamp``, ``webhook-signature``) and its verification,
with secret rotation and a timestamp tolerance against replays, the form of its ``whsec_``
secrets, RFC 9530 ``Content-Digest``, and the problem types the middleware answers with.

A Kafka record is signed the same way, with the idempotency key as the message id: its
``webhook-signature`` is over ``key.timestamp.value``.

Header names are spelled as the sender sends them; HTTP compares names case-insensitively, and
the middleware reads and writes them lower-cased.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import os
import time
from collections.abc import Mapping, Sequence

# -- headers ---------------------------------------------------------------------------------

#: The key a request's effect happens at most once for (IETF ``Idempotency-Key`` draft).
IDEMPOTENCY_KEY = "Idempotency-Key"
#: Standard Webhooks: the message id (the same key), when it was signed, and its signatures.
WEBHOOK_ID = "webhook-id"
WEBHOOK_TIMESTAMP = "webhook-timestamp"
WEBHOOK_SIGNATURE = "webhook-signature"
#: RFC 9530 digest of the body.
CONTENT_DIGEST = "Content-Digest"
#: The ``sha256:<hex>`` digest of the canonical payload, on channels whose body is not the payload
#: itself (an email's headers, a Kafka record's ``payload-digest``).
PAYLOAD_DIGEST = "Payload-Digest"
#: The sender's id of this attempt, and its fence (an integer from 0 to 10**18-1).
ATTEMPT_ID = "Outbox-Attempt-Id"
FENCE = "Outbox-Fence"
#: Marks a reconcile probe; the sender sends it with the value ``PROBE``.
RECONCILE = "Outbox-Reconcile"
PROBE = "probe"
#: On a replayed response, and on one replayed without its (too large) body.
REPLAYED = "Idempotent-Replayed"
BODY_OMITTED = "Idempotent-Body-Omitted"
#: The receiver's id for the effect, which the sender records.
EXTERNAL_ID = "External-Id"
#: A Kafka record's headers (Kafka header names are conventionally lower case; values are UTF-8):
#: the idempotency key (the action id), the payload digest, the attempt id and the fence.
KAFKA_HEADERS = (IDEMPOTENCY_KEY.lower(), PAYLOAD_DIGEST.lower(), ATTEMPT_ID.lower(), FENCE.lower())
KAFKA_IDEMPOTENCY_KEY, KAFKA_PAYLOAD_DIGEST, KAFKA_ATTEMPT_ID, KAFKA_FENCE = KAFKA_HEADERS
#: A signed Kafka record's Standard Webhooks headers: when it was signed, and its signatures over
#: ``key.timestamp.value`` (the ``idempotency-key`` standing for ``webhook-id``).
KAFKA_TIMESTAMP, KAFKA_SIGNATURE = WEBHOOK_TIMESTAMP, WEBHOOK_SIGNATURE

# -- problems (RFC 9457) -----------------------------------------------------------------------

PROBLEM_TYPE_PREFIX = "urn:outbox:problem:"


class Problem:
    """The kinds of problem the middleware answers with; a problem's ``type`` is ``problem_type(kind)``."""

    MALFORMED_KEY = "malformed-idempotency-key"
    MISSING_KEY = "missing-idempotency-key"
    MALFORMED_FENCE = "malformed-fence"
    MISSING_FENCE = "missing-fence"
    MALFORMED_CONTENT_LENGTH = "malformed-content-length"
    PAYLOAD_TOO_LARGE = "payload-too-large"
    INVALID_JSON_BODY = "invalid-json-body"
    INVALID_SIGNATURE = "invalid-signature"
    KEY_REUSED = "idempotency-key-reused"
    IN_PROGRESS = "request-in-progress"
    STALE_FENCE = "stale-fence"
    METHOD_NOT_ALLOWED = "method-not-allowed"
    PROBE_DISABLED = "probe-disabled"
    INVALID_PROBE = "invalid-probe"
    STORE_UNAVAILABLE = "store-unavailable"


def problem_type(kind: str) -> str:
    """The ``type`` URI of a problem kind."""
    return PROBLEM_TYPE_PREFIX + kind


# -- Content-Digest ----------------------------------------------------------------------------


def content_digest(body: bytes) -> str:
    """RFC 9530 ``Content-Digest`` for a body."""
    return "sha-256=:" + base64.b64encode(hashlib.sha256(body).digest()).decode() + ":"


# -- Standard Webhooks signatures --------------------------------------------------------------

#: A signing secret is this prefix and the base64 of ``SECRET_BYTES`` bytes.
SECRET_PREFIX = "whsec_"
SECRET_BYTES = range(24, 65)


def new_secret() -> str:
    """A fresh signing secret (``whsec_`` + 32 random bytes, base64)."""
    return SECRET_PREFIX + base64.b64encode(os.urandom(32)).decode()


def check_secret(secret: str) -> str:
    """``secret`` if it is in the signing secrets' form, else ValueError saying what is wrong."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError(f"secret must start with {SECRET_PREFIX!r}")
    try:
        raw = base64.b64decode(secret[len(SECRET_PREFIX):], validate=True)
    except binascii.Error:
        raise ValueError(f"secret must be {SECRET_PREFIX} followed by base64") from None
    if len(raw) not in SECRET_BYTES:
        raise ValueError(f"secret must hold {SECRET_BYTES.start} to {SECRET_BYTES.stop - 1} bytes")
    return secret


@functools.lru_cache(maxsize=256)
def secret_key(secret: str) -> bytes:
    """The HMAC key a ``whsec_`` secret stands for (decoded once, not per request)."""
    encoded = secret.removeprefix("whsec_")
    return base64.b64decode(encoded + "=" * (-len(encoded) % 4))  # unpadded secrets are common


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """base64 HMAC-SHA256 over ``id.timestamp.body`` with a ``whsec_`` secret (without ``v1,``)."""
    message = f"{msg_id}.{timestamp}.".encode() + body
    return base64.b64encode(hmac.digest(secret_key(secret), message, "sha256")).decode()


def sign(secrets: Sequence[str], msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: one ``v1,<signature>`` per secret (several during a
    rotation), space-separated."""
    return " ".join("v1," + signature(secret, msg_id, timestamp, body) for secret in secrets)


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
        msg_id, stamp, signatures = lower[WEBHOOK_ID], lower[WEBHOOK_TIMESTAMP], lower[WEBHOOK_SIGNATURE]
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
