"""Kafka records as the idempotent consumer reads them: a fetched record and what became of it,
read by the broker-neutral ``receivers.messages.MessageReader`` from its headers and value."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeAlias

from aiokafka import ConsumerRecord, TopicPartition

from .messages import MessageReader, Refusal, Refused, digest_of, payload_matches
from .records import ClaimRequest, ClaimResult

__all__ = ["FetchedRecord", "Record", "RecordReader", "Refusal", "Refused", "digest_of", "payload_matches"]

Record: TypeAlias = "ConsumerRecord[Any, Any]"


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
    """Reads fetched records for the consumer of ``group`` (``MessageReader`` over each record's
    headers and value)."""

    def __init__(self, group: str, *, secrets: str | Sequence[str] | None, signature_tolerance_seconds: float,
                 verify_digest: bool, clock: Callable[[], datetime]) -> None:
        self.messages = MessageReader(group, secrets=secrets, signature_tolerance_seconds=signature_tolerance_seconds,
                                      verify_digest=verify_digest, clock=clock)

    def read(self, partition: TopicPartition, record: Record) -> FetchedRecord:
        """The record with its key, fingerprint and fence read, or with why it is refused."""
        return self.messages.read(FetchedRecord(record, partition), record.headers, record.value)
