"""How the SQS channel reads a failed request (``sender.sqs.answers``), over the exceptions
botocore and aiohttp really raise: the stage it stopped at, whether the request may have been
written, and SQS's error codes sorted into retryable and rejected."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import ClientConnectorError, ClientOSError
from aiohttp.client_reqrep import ConnectionKey
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
    SSLError,
)

from outbox import Outcome, Submission
from sender.guard import PrivateAddressRefused
from sender.sqs.answers import entry_failed, refused
from sender.sqs.channel import group
from sender.sqs.spec import SqsSpec, check_payload

URL = "https://sqs.eu-west-1.amazonaws.com/"
KEY = ConnectionKey("sqs.eu-west-1.amazonaws.com", 443, True, True, None, None, None)


def answered(status: int, code: str, query_code: str | None = None) -> ClientError:
    error: dict[str, Any] = {"Code": code, "Message": "m"}
    if query_code:
        error["QueryErrorCode"] = query_code
    return ClientError({"Error": error, "ResponseMetadata": {"HTTPStatusCode": status}}, "SendMessageBatch")


@pytest.mark.parametrize(("exc", "outcome"), [
    (answered(400, "AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"), Outcome.REJECTED),
    (answered(403, "AccessDenied"), Outcome.REJECTED),
    (answered(400, "InvalidMessageContents"), Outcome.REJECTED),
    (answered(400, "ThrottlingException"), Outcome.RETRYABLE),
    (answered(400, "RequestThrottled"), Outcome.RETRYABLE),
    (answered(503, "AnythingElse"), Outcome.RETRYABLE),
    (answered(500, "InternalError"), Outcome.RETRYABLE),
])
def test_an_error_answer_is_submitted_retryable_or_rejected_by_its_code(exc: ClientError, outcome: Outcome):
    result = refused(exc)
    assert (result.submission, result.outcome, result.answered) == (Submission.SUBMITTED, outcome, True)
    assert result.status_code == exc.response["ResponseMetadata"]["HTTPStatusCode"]


@pytest.mark.parametrize(("exc", "facts"), [
    (NoCredentialsError(), ("connect", Submission.NOT_SUBMITTED, Outcome.REJECTED)),
    (EndpointConnectionError(endpoint_url=URL, error=ClientConnectorError(KEY, ConnectionRefusedError(111, "no"))),
     ("connect", Submission.NOT_SUBMITTED, Outcome.RETRYABLE)),
    (EndpointConnectionError(endpoint_url=URL, error=ClientConnectorError(KEY, PrivateAddressRefused("x is private"))),
     ("connect", Submission.NOT_SUBMITTED, Outcome.REJECTED)),
    (ConnectTimeoutError(endpoint_url=URL), ("connect", Submission.NOT_SUBMITTED, Outcome.RETRYABLE)),
    (SSLError(endpoint_url=URL, error="certificate verify failed"),
     ("connect", Submission.NOT_SUBMITTED, Outcome.RETRYABLE)),
    # aiobotocore reports a connection lost while the request was written as EndpointConnectionError too
    (EndpointConnectionError(endpoint_url=URL, error=ClientOSError(104, "reset")),
     ("send", Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN)),
    (ReadTimeoutError(endpoint_url=URL), ("send", Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN)),
    (ConnectionClosedError(endpoint_url=URL), ("send", Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN)),
    (TimeoutError(), ("send", Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN)),
])
def test_a_request_without_an_answer_is_not_submitted_only_when_it_was_never_written(exc: Exception, facts: tuple):
    result = refused(exc)
    assert (result.stage, result.submission, result.outcome) == facts
    assert not result.answered


def test_a_failed_batch_entry_is_rejected_when_sqs_blames_the_sender():
    assert entry_failed({"Id": "0", "SenderFault": True, "Code": "InvalidMessageContents"}).outcome is Outcome.REJECTED
    assert entry_failed({"Id": "0", "SenderFault": False, "Code": "InternalError"}).outcome is Outcome.RETRYABLE


def test_a_fifo_group_is_the_name_as_sqs_takes_it_else_its_digest():
    assert group("customer-7") == "customer-7"
    long = group("k" * 200)
    assert len(long) == 64 and long == group("k" * 200)
    assert group("kunde ä") not in ("kunde ä", long)


def test_the_queue_url_is_given_or_made_from_its_name_account_and_endpoint():
    common = {"channel": "sqs", "region": "eu-west-1", "access_key_id": "AKIAIOSFODNN7EXAMPLE"}
    named = SqsSpec.model_validate({**common, "queue_name": "orders.fifo", "account_id": "123456789012"})
    assert (named.url, named.fifo) == ("https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo", True)
    local = SqsSpec.model_validate({**common, "queue_name": "o", "account_id": "123456789012",
                                    "endpoint_url": "https://sqs.internal.example.com:9324/"})
    assert (local.url, local.fifo) == ("https://sqs.internal.example.com:9324/123456789012/o", False)


def test_the_payload_check_counts_canonical_bytes():
    check_payload({"blob": "x" * 200_000})
    with pytest.raises(ValueError, match="at most"):
        check_payload({"blob": "x" * 258_100})
