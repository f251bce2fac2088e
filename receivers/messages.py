"""Broker messages as the idempotent consumers read them: each message's idempotency key,
payload digest, fence and (with secrets) signature, read from the metadata every broker channel
of the outbox puts on it (``sender.envelope``: Kafka record headers, AMQP headers, NATS headers),
become the claim it makes, or the reason it is refused without claiming anything. One reader for
every broker: each consumer hands it the message's metadata as (name, value) pairs and its body."""

from __future__ import annotations

import enum
import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar

import rfc8785

from .keys import MalformedFence, MalformedKey, identity, parse_fence, parse_key
from .records import ClaimRequest
from .wire import (
    KAFKA_FENCE,
    KAFKA_IDEMPOTENCY_KEY,
    KAFKA_PAYLOAD_DIGEST,
    KAFKA_SIGNATURE,
    KAFKA_TIMESTAMP,
    WEBHOOK_ID,
    InvalidSignature,
    Problem,
    check_secret,
    verify_signature,
)

log = logging.getLogger("receivers.messages")
_OURS = frozenset({KAFKA_IDEMPOTENCY_KEY, KAFKA_PAYLOAD_DIGEST, KAFKA_FENCE, KAFKA_TIMESTAMP, KAFKA_SIGNATURE})


class Refusal(str, enum.Enum):
    """Why a message was refused: its handler does not run and it is settled (committed, or
    rejected to a dead-letter), since the same message can never succeed."""

    MISSING_KEY = Problem.MISSING_KEY
    MALFORMED_KEY = Problem.MALFORMED_KEY
    MISSING_SIGNATURE = "missing-signature"  # with secrets: not signed (not the outbox's, or no signing secret)
    INVALID_SIGNATURE = Problem.INVALID_SIGNATURE  # with secrets: no signature matches, or one too old
    MALFORMED_FENCE = Problem.MALFORMED_FENCE
    MISSING_DIGEST = "missing-payload-digest"
    DIGEST_MISMATCH = "payload-digest-mismatch"
    KEY_REUSED = Problem.KEY_REUSED
    STALE_FENCE = Problem.STALE_FENCE


@dataclass(frozen=True, slots=True)
class Refused:
    """What ``on_error`` is told about a refused message (``key`` None when it has none)."""

    reason: Refusal
    detail: str
    key: str | None


class Readable(Protocol):
    """A fetched message as the reader fills it in (``kafka_records.FetchedRecord``,
    ``consuming.Fetched``): its key, and the claim it makes or why it is refused."""

    key: str | None
    request: ClaimRequest | None
    refused: Refused | None


R = TypeVar("R", bound=Readable)


def _value_bytes(value: Any) -> bytes:
    """A message body as the sender sent it: its bytes as they are (the sender's body is the
    canonical JSON itself), or the canonical JSON of a value a deserializer already decoded."""
    return value if isinstance(value, bytes) else rfc8785.dumps(value)


def digest_of(value: Any) -> str:
    """``sha256:<hex>`` of a message body (``_value_bytes``)."""
    return "sha256:" + hashlib.sha256(_value_bytes(value)).hexdigest()


def payload_matches(value: object, digest: str) -> bool:
    """Whether ``value`` is the payload ``digest`` names: one hash when it is the canonical JSON
    as sent; otherwise its JSON is put in canonical form and compared."""
    if value is None:
        return False
    if isinstance(value, bytes) and digest == "sha256:" + hashlib.sha256(value).hexdigest():
        return True  # the usual case: the canonical JSON as sent, one hash
    try:
        return digest_of(json.loads(value) if isinstance(value, bytes) else value) == digest
    except (ValueError, RecursionError):  # not JSON, or not canonicalizable (rfc8785 errors are ValueErrors)
        return False


def _text(value: object) -> str:
    """A metadata value that is not bytes as text (AMQP and NATS header values are strings); a null
    one reads as text no key, digest or fence can be."""
    return value if isinstance(value, str) else "" if value is None else str(value)


class MessageReader:
    """Reads messages for the consumer of ``scope`` (a Kafka group, a queue, a durable consumer):
    the checks it was given (``secrets``, ``signature_tolerance_seconds``, ``verify_digest``), set once."""

    def __init__(self, scope: str, *, secrets: str | Sequence[str] | None, signature_tolerance_seconds: float,
                 verify_digest: bool, clock: Callable[[], datetime], source: str = "topic") -> None:
        self.scope = scope
        #: With the destination's signing secrets (several while rotating), a message runs only if
        #: one of them signed it, no longer ago than the tolerance.
        self.secrets = None if secrets is None else [check_secret(s) for s in
                                                     ([secrets] if isinstance(secrets, str) else secrets)]
        if self.secrets == []:
            raise ValueError("secrets= holds no secret; pass None to turn signature checks off")
        self.signature_tolerance_seconds = signature_tolerance_seconds
        #: Refuse a message whose body is not the payload its ``payload-digest`` names.
        self.verify_digest = verify_digest
        self.clock = clock
        if secrets is None:
            log.warning("idempotent consumer %r set up without secrets=: signatures are not checked, so anyone "
                        "who can write to the %s can run the handler under a real key (and have the genuine "
                        "message refused); pass the destination's whsec_ secret(s) as secrets= to check them",
                        scope, source)

    def read(self, item: R, metadata: Iterable[tuple[str, object]], body: Any) -> R:
        """``item`` with its key and claim, or why it is refused, read from ``metadata`` ((name,
        value) pairs) and ``body``."""
        ours: dict[str, list[str]] = {}
        for name, value in metadata:
            if name in _OURS:  # Kafka's values are bytes: decoded here, not by a call per header
                text = value.decode("utf-8", "replace") if isinstance(value, bytes) else _text(value)
                if name in ours:
                    ours[name].append(text)
                else:
                    ours[name] = [text]
        header = ours.get
        try:
            item.key = key = parse_key(header(KAFKA_IDEMPOTENCY_KEY, ()))
        except MalformedKey as exc:
            item.refused = Refused(Refusal.MALFORMED_KEY, str(exc), None)
            return item
        if key is None:
            item.refused = Refused(Refusal.MISSING_KEY, f"no {KAFKA_IDEMPOTENCY_KEY} header", None)
            return item
        if self.secrets is not None:
            item.refused = self._unsigned(body, key, header(KAFKA_TIMESTAMP, ()), header(KAFKA_SIGNATURE, ()))
            if item.refused is not None:
                return item
        try:
            fence = parse_fence(header(KAFKA_FENCE, ()))
        except MalformedFence as exc:
            item.refused = Refused(Refusal.MALFORMED_FENCE, str(exc), key)
            return item
        digests = header(KAFKA_PAYLOAD_DIGEST, ())
        if len(digests) != 1:
            item.refused = Refused(Refusal.MISSING_DIGEST, f"send exactly one {KAFKA_PAYLOAD_DIGEST} header", key)
        elif self.verify_digest and not payload_matches(body, digests[0]):
            item.refused = Refused(Refusal.DIGEST_MISMATCH, f"the value is not the payload its "
                                   f"{KAFKA_PAYLOAD_DIGEST} names", key)
        else:
            item.request = ClaimRequest(identity(self.scope, key), digests[0], fence)
        return item

    def _unsigned(self, body: Any, key: str, stamps: Sequence[str], signatures: Sequence[str]) -> Refused | None:
        """Why the message is not signed with one of ``secrets``, or None when it is."""
        assert self.secrets is not None
        if not stamps and not signatures:
            return Refused(Refusal.MISSING_SIGNATURE, f"no {KAFKA_SIGNATURE} header: not signed by the outbox, or "
                           "by a destination that holds no signing secret", key)
        if len(stamps) != 1 or len(signatures) != 1:
            return Refused(Refusal.INVALID_SIGNATURE, f"send exactly one {KAFKA_TIMESTAMP} and one "
                           f"{KAFKA_SIGNATURE} header", key)
        signed = {WEBHOOK_ID: key, KAFKA_TIMESTAMP: stamps[0], KAFKA_SIGNATURE: signatures[0]}
        try:
            verify_signature(self.secrets, signed, _value_bytes(body),
                             tolerance_seconds=self.signature_tolerance_seconds, now=self.clock().timestamp())
        except InvalidSignature as exc:
            return Refused(Refusal.INVALID_SIGNATURE, str(exc), key)
        except (TypeError, ValueError, RecursionError):  # a decoded value that has no canonical JSON
            return Refused(Refusal.INVALID_SIGNATURE, "the value has no canonical JSON to check the signature "
                           "over", key)
        return None
