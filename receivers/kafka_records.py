"""Kafka records as the idempotent consumer reads them: each record's idempotency key, payload
digest, fence and (with secrets) signature, read from the headers the Kafka channel puts on it,
become the claim it makes, or the reason it is refused without claiming anything."""

from __future__ import annotations

import enum
import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeAlias

import rfc8785
from aiokafka import ConsumerRecord, TopicPartition

from .keys import MalformedFence, MalformedKey, identity, parse_fence, parse_key
from .records import ClaimRequest, ClaimResult
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

log = logging.getLogger("receivers.kafka")
_OURS = frozenset({KAFKA_IDEMPOTENCY_KEY, KAFKA_PAYLOAD_DIGEST, KAFKA_FENCE, KAFKA_TIMESTAMP, KAFKA_SIGNATURE})

Record: TypeAlias = "ConsumerRecord[Any, Any]"


class Refusal(str, enum.Enum):
    """Why a record was refused: its handler does not run and its offset is committed, since the
    same record can never succeed."""

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
    """What ``on_error`` is told about a refused record (``key`` None when it has none)."""

    reason: Refusal
    detail: str
    key: str | None


def _value_bytes(value: Any) -> bytes:
    """A record value as the sender sent it: its bytes as they are (the sender's value is the
    canonical JSON itself), or the canonical JSON of a value a deserializer already decoded."""
    return value if isinstance(value, bytes) else rfc8785.dumps(value)


def digest_of(value: Any) -> str:
    """``sha256:<hex>`` of a record value (``_value_bytes``)."""
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


@dataclass(slots=True)
class FetchedRecord:
    """One fetched record and what became of it in this batch."""

    record: Record
    partition: TopicPartition
    key: str | None = None
    request: ClaimRequest | None = None  # None: refused before claiming
    refused: Refused | None = None
    answer: ClaimResult | None = None


class RecordReader:
    """Reads fetched records for the consumer of ``group``: the checks ``IdempotentConsumer`` was
    given (``secrets``, ``signature_tolerance_seconds``, ``verify_digest``), set once."""

    def __init__(self, group: str, *, secrets: str | Sequence[str] | None, signature_tolerance_seconds: float,
                 verify_digest: bool, clock: Callable[[], datetime]) -> None:
        self.group = group
        #: With the destination's signing secrets (several while rotating), a record runs only if
        #: one of them signed it, no longer ago than the tolerance.
        self.secrets = None if secrets is None else [check_secret(s) for s in
                                                     ([secrets] if isinstance(secrets, str) else secrets)]
        if self.secrets == []:
            raise ValueError("secrets= holds no secret; pass None to turn signature checks off")
        self.signature_tolerance_seconds = signature_tolerance_seconds
        #: Refuse a record whose value is not the payload its ``payload-digest`` names.
        self.verify_digest = verify_digest
        self.clock = clock
        if secrets is None:
            log.warning("idempotent consumer of group %r set up without secrets=: record signatures are not "
                        "checked, so anyone who can write to the topic can run the handler under a real key "
                        "(and have the genuine record refused); pass the destination's whsec_ secret(s) as "
                        "secrets= to check them", group)

    def read(self, partition: TopicPartition, record: Record) -> FetchedRecord:
        """The record with its key, fingerprint and fence read, or with why it is refused."""
        item = FetchedRecord(record, partition)
        ours: dict[str, list[str]] = {}
        for name, value in record.headers:
            if name in _OURS:  # a null or non-UTF-8 value reads as text no key, digest or fence can be
                text = value.decode("utf-8", "replace") if value is not None else ""
                if name in ours:
                    ours[name].append(text)
                else:
                    ours[name] = [text]
        header = ours.get
        digests = header(KAFKA_PAYLOAD_DIGEST, ())
        try:
            item.key = parse_key(header(KAFKA_IDEMPOTENCY_KEY, ()))
        except MalformedKey as exc:
            item.refused = Refused(Refusal.MALFORMED_KEY, str(exc), None)
            return item
        if item.key is None:
            item.refused = Refused(Refusal.MISSING_KEY, f"no {KAFKA_IDEMPOTENCY_KEY} header", None)
            return item
        if self.secrets is not None:
            item.refused = self._unsigned(record, item.key, header(KAFKA_TIMESTAMP, ()), header(KAFKA_SIGNATURE, ()))
            if item.refused is not None:
                return item
        try:
            fence = parse_fence(header(KAFKA_FENCE, ()))
        except MalformedFence as exc:
            item.refused = Refused(Refusal.MALFORMED_FENCE, str(exc), item.key)
            return item
        if len(digests) != 1:
            item.refused = Refused(Refusal.MISSING_DIGEST, f"send exactly one {KAFKA_PAYLOAD_DIGEST} header",
                                   item.key)
        elif self.verify_digest and not payload_matches(record.value, digests[0]):
            item.refused = Refused(Refusal.DIGEST_MISMATCH, f"the value is not the payload its "
                                   f"{KAFKA_PAYLOAD_DIGEST} names", item.key)
        else:
            item.request = ClaimRequest(identity(self.group, item.key), digests[0], fence)
        return item

    def _unsigned(self, record: Record, key: str, stamps: Sequence[str], signatures: Sequence[str]) -> Refused | None:
        """Why the record is not signed with one of ``secrets``, or None when it is."""
        assert self.secrets is not None
        if not stamps and not signatures:
            return Refused(Refusal.MISSING_SIGNATURE, f"no {KAFKA_SIGNATURE} header: not signed by the outbox, or "
                           "by a destination that holds no signing secret", key)
        if len(stamps) != 1 or len(signatures) != 1:
            return Refused(Refusal.INVALID_SIGNATURE, f"send exactly one {KAFKA_TIMESTAMP} and one "
                           f"{KAFKA_SIGNATURE} header", key)
        signed = {WEBHOOK_ID: key, KAFKA_TIMESTAMP: stamps[0], KAFKA_SIGNATURE: signatures[0]}
        try:
            verify_signature(self.secrets, signed, _value_bytes(record.value),
                             tolerance_seconds=self.signature_tolerance_seconds, now=self.clock().timestamp())
        except InvalidSignature as exc:
            return Refused(Refusal.INVALID_SIGNATURE, str(exc), key)
        except (TypeError, ValueError, RecursionError):  # a decoded value that has no canonical JSON
            return Refused(Refusal.INVALID_SIGNATURE, "the value has no canonical JSON to check the signature "
                           "over", key)
        return None
