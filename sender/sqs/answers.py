"""What an SQS request came to: refused before it was written (nothing submitted), SQS's answer
(an error code: retryable or rejected), or no answer (the request may have been acted on)."""

from __future__ import annotations

from typing import Any

from aiohttp import ClientConnectorError
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ParamValidationError,
    SSLError,
)

from outbox import Outcome, Submission

from ..channel import SendResult, describe
from ..guard import PrivateAddressRefused

#: Error codes of an answer that says nothing was enqueued and asks to come back: throttling,
#: SQS's or KMS's being unavailable for a while. Every other error answer is rejected: a missing
#: queue or permission, a bad signature or key, or contents SQS refuses, which an operator fixes
#: before replaying (a 5xx answer is retryable whatever its code).
RETRYABLE = frozenset({
    "RequestThrottled", "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottledException",
    "TooManyRequestsException", "ServiceUnavailable", "InternalError", "InternalFailure", "RequestTimeout",
    "RequestTimeoutException", "KmsThrottled", "KmsUnavailable", "KMS.ThrottlingException"})


def code(error: dict[str, Any]) -> str:
    """An error's code as the SQS documentation spells it (``QueueDoesNotExist``, not the JSON
    protocol's ``AWS.SimpleQueueService.NonExistentQueue``)."""
    return str(error.get("QueryErrorCode") or error.get("Code") or "unknown")


def refused(exc: BaseException) -> SendResult:
    """A request that failed: which stage, and whether it may have been written."""
    if isinstance(exc, ClientError):  # SQS answered with an error: nothing was enqueued
        answer = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        found = code(answer)
        outcome = Outcome.RETRYABLE if found in RETRYABLE or (status or 0) >= 500 else Outcome.REJECTED
        return SendResult(Submission.SUBMITTED, outcome, status_code=status, answered=True, stage="send",
                          error=f"SQS answered {status} {found}: {answer.get('Message', '')}"[:500])
    if isinstance(exc, NoCredentialsError | ParamValidationError):  # refused here, before any connection
        return SendResult(Submission.NOT_SUBMITTED, Outcome.REJECTED, stage="connect",
                          error=f"refused: {describe(exc)}")
    cause = exc.kwargs.get("error") if isinstance(exc, BotoCoreError) else None
    if isinstance(exc, EndpointConnectionError) and isinstance(cause, ClientConnectorError):
        if isinstance(cause.os_error, PrivateAddressRefused):
            return SendResult(Submission.NOT_SUBMITTED, Outcome.REJECTED, stage="connect",
                              error=cause.os_error.explain())
        return SendResult(Submission.NOT_SUBMITTED, Outcome.RETRYABLE, stage="connect", error=describe(exc))
    if isinstance(exc, ConnectTimeoutError | SSLError):  # the connection (its TLS handshake) was never made
        return SendResult(Submission.NOT_SUBMITTED, Outcome.RETRYABLE, stage="connect", error=describe(exc))
    # connected: the request may have been written and acted on (a read timeout, a lost connection)
    return SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, stage="send",
                      error=f"no answer to the request: {describe(exc)}")


def entry_failed(failure: dict[str, Any]) -> SendResult:
    """One entry of a batch SQS did not enqueue: rejected when SQS says the fault is the sender's
    (``SenderFault``: its contents, its size), else retryable."""
    outcome = Outcome.REJECTED if failure.get("SenderFault") else Outcome.RETRYABLE
    return SendResult(Submission.SUBMITTED, outcome, answered=True, stage="send",
                      error=f"SQS did not enqueue the message: {code(failure)}: {failure.get('Message', '')}"[:500])
