"""What an attempt's record came to, from where it stopped: refused before it was handed to the
producer (``Refused``: nothing submitted), or the broker's answer, or its absence (the request may
have gone), and whether the answer says the producer ended and must be replaced."""

from __future__ import annotations

import asyncio

from aiokafka.errors import (
    BrokerResponseError,
    InvalidProducerEpoch,
    KafkaError,
    NotEnoughReplicasAfterAppendError,
    OutOfOrderSequenceNumber,
    ProducerFenced,
    RequestTimedOutError,
    UnknownProducerId,
)
from aiokafka.structs import RecordMetadata

from outbox import Outcome, Submission

from ..channel import SendResult, describe

#: Broker errors that say the record was refused for good: it is too large, or the topic cannot be.
PERMANENT = frozenset(
    {"MessageSizeTooLargeError", "RecordListTooLargeError", "InvalidTopicError", "CorruptRecordException",
     "InvalidRecordError", "InvalidRequiredAcksError"})


#: Errors after which the broker refuses every record of this producer id: it lost the producer's
#: state or sequence (a crash, an expired id) or a newer producer fenced it (aiokafka reports an
#: ``InvalidProducerEpoch`` answer as ``ProducerFenced``). The producer is replaced.
ENDED = (OutOfOrderSequenceNumber, UnknownProducerId, InvalidProducerEpoch, ProducerFenced)


class Refused(Exception):
    """An attempt that ended before the record was handed to the producer: nothing was submitted."""

    def __init__(self, stage: str, outcome: Outcome, error: str) -> None:
        super().__init__(error)
        self.stage, self.outcome, self.error = stage, outcome, error

    def result(self) -> SendResult:
        return SendResult(Submission.NOT_SUBMITTED, self.outcome, error=self.error, stage=self.stage)


def answer(future: asyncio.Future[RecordMetadata], signing: tuple[str, ...]) -> tuple[SendResult, bool]:
    """What the broker answered for a record handed to the producer (no answer in time: the
    future is still pending, and cancelled), and whether it says the producer ended."""
    if not future.done() or future.cancelled():
        future.cancel()
        return SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, stage="produce",
                          error="no answer to the produce request: TimeoutError: the destination's timeout passed"), \
            False
    exc = future.exception()
    if isinstance(exc, ENDED):
        return producer_ended(exc), True
    if isinstance(exc, BrokerResponseError):
        return broker_refused(exc), False
    if exc is not None:  # a lost connection, or the producer stopped: the request may have gone
        return SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, stage="produce",
                          error=f"no answer to the produce request: {describe(exc)}"), False
    sent = future.result()
    where = f"{sent.topic}/{sent.partition}/{sent.offset}"
    return SendResult(Submission.SUBMITTED, Outcome.DELIVERED, stage="done", answered=True, external_id=where,
                      reply=f"appended at {where}" + ("" if signing else ", unsigned: the destination holds no "
                                                      "signing secret")), False


def broker_refused(exc: BrokerResponseError) -> SendResult:
    """The broker answered the produce request with an error."""
    if isinstance(exc, RequestTimedOutError | NotEnoughReplicasAfterAppendError):
        # appended to the leader (or may have been) without the replicas acknowledging it in time
        return SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, stage="produce", answered=True,
                          error=f"the broker may have appended the record: {describe(exc)}")
    outcome = Outcome.REJECTED if type(exc).__name__ in PERMANENT else Outcome.RETRYABLE
    return SendResult(Submission.SUBMITTED, outcome, stage="produce", answered=True,
                      error=f"the broker did not append the record: {describe(exc)}")


def producer_ended(exc: KafkaError) -> SendResult:
    """The broker refused the record because it no longer knows the producer (``ENDED``)."""
    return SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, stage="produce", answered=True,
                      error=f"the broker no longer knows this producer ({describe(exc)}): an earlier try of the "
                            "record, before the broker lost the producer's state, may have been appended; the "
                            "producer is replaced")
