"""What a Redis destination must be, and how the server's replies (or their absence) are read."""

from __future__ import annotations

import ssl

import pytest
from pydantic import ValidationError
from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    ConnectionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
)

from outbox import OnUnknown, Outcome, Submission
from sender import guard
from sender.redis import RedisSpec, dedupe_key, keep_secrets
from sender.redis.channel import LOST, answer, not_connected, server_refused
from tests.conftest import SECRET

SPEC = {"channel": "redis", "host": "redis.example.com", "stream": "orders"}


def refused(spec: dict) -> str:
    with pytest.raises(ValidationError) as error:
        RedisSpec.model_validate(spec)
    return "; ".join(e["msg"] for e in error.value.errors())


def test_defaults_retry_an_unknown_and_remember_a_week():
    spec = RedisSpec.model_validate(SPEC)
    assert (spec.port, spec.db, spec.on_unknown, spec.dedupe_ttl_seconds, spec.max_len, spec.wait_replicas) == (
        6379, 0, OnUnknown.ALWAYS, 7 * 24 * 3600, None, None)


@pytest.mark.parametrize(("change", "words"), [
    ({"stream": ""}, "is not a stream key"),
    ({"stream": "a b"}, "is not a stream key"),
    ({"stream": "{orders}"}, "is not a stream key"),
    ({"stream": "x" * 201}, "is not a stream key"),
    ({"host": "127.0.0.1"}, "is not a public address"),
    ({"host": "[::1]"}, "is not a public address"),
    ({"host": "redis.example.com:6379"}, "IPv6"),
    ({"password": "pw"}, "set tls, or allow_insecure"),
    ({"password": SECRET, "tls": True}, "must not start with 'whsec_'"),
    ({"secret": "pw"}, "give the password as password"),
    ({"reconcile": True}, "leave reconcile off"),
    ({"wait_timeout_ms": 0}, "greater than or equal to 1"),
    ({"username": "a\nb"}, "username is 1-256 visible ASCII characters"),
])
def test_what_cannot_be_written_is_refused(change: dict, words: str):
    assert words in refused({**SPEC, **change})


def test_the_stream_and_loopback_when_allowed_are_accepted():
    spec = RedisSpec.model_validate({**SPEC, "host": "127.0.0.1", "allow_private_network": True,
                                     "stream": "events:orders.v1/eu-west"})
    assert spec.stream == "events:orders.v1/eu-west"


def test_a_password_is_kept_after_the_signing_secrets_until_replaced():
    kept = keep_secrets((SECRET, "old-pw"), RedisSpec.model_validate({**SPEC, "tls": True}))
    assert kept == (SECRET, "old-pw")
    assert keep_secrets((SECRET, "old-pw"), RedisSpec.model_validate({**SPEC, "tls": True, "password": "new-pw"})) \
        == (SECRET, "new-pw")


def test_the_dedupe_key_shares_the_streams_hash_slot():
    assert dedupe_key("orders", "acme/a{b}") == "{orders}:outbox-dedupe:acme/a{b}"


def test_an_entry_added_or_found_is_delivered_with_its_id():
    added = answer([1, b"1-0"], "orders", (SECRET,), None, None, None)
    found = answer([0, b"1-0"], "orders", (), None, None, None)
    assert (added.submission, added.outcome, added.external_id, added.stage) == (
        Submission.SUBMITTED, Outcome.DELIVERED, "1-0", "done")
    assert found.reply == "found 1-0, added to orders by an earlier attempt: not added again, unsigned: the " \
                          "destination holds no signing secret"


def test_no_reply_is_maybe_submitted_and_fewer_replicas_is_retried_with_the_entry():
    lost = answer(LOST, "orders", (), None, None, TimeoutError())
    assert (lost.submission, lost.outcome, lost.answered) == (Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, False)
    short = answer([1, b"1-0"], "orders", (), 2, 1, None)
    assert (short.submission, short.outcome, short.stage, short.external_id) == (
        Submission.SUBMITTED, Outcome.RETRYABLE, "wait", "1-0")
    assert "1 of 2 replicas" in (short.error or "")
    assert answer([1, b"1-0"], "orders", (), 2, 2, None).outcome is Outcome.DELIVERED


@pytest.mark.parametrize(("reply", "outcome"), [
    (OutOfMemoryError("command not allowed"), Outcome.RETRYABLE),
    (ReadOnlyError("You can't write against a read only replica."), Outcome.RETRYABLE),
    (BusyLoadingError("Redis is loading the dataset in memory"), Outcome.RETRYABLE),
    (ResponseError("BUSY Redis is busy running a script."), Outcome.RETRYABLE),
    (ResponseError("MISCONF Redis is configured to save RDB snapshots"), Outcome.RETRYABLE),
    (NoScriptError("No matching script."), Outcome.RETRYABLE),
    (ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"), Outcome.REJECTED),
    (ResponseError("MOVED 3999 127.0.0.1:6381"), Outcome.REJECTED),
])
def test_an_error_reply_is_submitted_and_retried_only_when_it_may_pass(reply: Exception, outcome: Outcome):
    result = server_refused(reply)
    assert (result.submission, result.outcome, result.answered, result.stage) == (
        Submission.SUBMITTED, outcome, True, "add")


def wrapped(cause: BaseException) -> ConnectionError:
    try:
        raise ConnectionError("Error connecting") from cause
    except ConnectionError as exc:
        return exc


@pytest.mark.parametrize(("error", "stage", "outcome"), [
    (wrapped(guard.PrivateAddressRefused("localhost resolves only to non-public addresses")), "connect",
     Outcome.REJECTED),
    (wrapped(ssl.SSLCertVerificationError("certificate verify failed")), "tls", Outcome.RETRYABLE),
    (AuthenticationError("invalid username-password pair"), "auth", Outcome.REJECTED),
    (ResponseError("DB index is out of range"), "select", Outcome.REJECTED),
    (wrapped(ConnectionRefusedError(111, "Connection refused")), "connect", Outcome.RETRYABLE),
])
def test_a_connection_not_made_ready_is_not_submitted(error: Exception, stage: str, outcome: Outcome):
    result = not_connected(error)
    assert (result.submission, result.stage, result.outcome) == (Submission.NOT_SUBMITTED, stage, outcome)
