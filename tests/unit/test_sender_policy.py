"""The delivery policy, backoff and webhook helpers, without I/O."""

from __future__ import annotations

import base64
import hashlib
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from outbox import Destination, Intent, OnUnknown, Outcome, Status, Submission
from outbox.destinations import deadline
from outbox.timestamps import LAST
from receivers.wire import content_digest, sign
from sender import Backoff, Policy, SendResult, decide
from sender.webhook import classify_status, retry_after_seconds

NOW = datetime(2030, 1, 1, tzinfo=UTC)
DEST = Destination("hook", "webhook", {"url": "https://h.example/"}, ("whsec_" + "A" * 44,), True, 3600,
                   OnUnknown.DECLARED, 5.0, False, False, False, NOW, NOW)
INTENT = Intent(1, "a1", "acme", "hook", "webhook", "{}", "sha256:x", Status.LEASED, 1, 5,
                NOW, None, None, "w", NOW, 1, NOW, NOW, None)
POLICY = Policy(Backoff(1.0, 3600.0), retention_margin_seconds=300)


def fate(result: SendResult, *, dest: Destination = DEST, attempts: int = 1,
         first: datetime | None = NOW, intent: Intent = INTENT):
    return decide(intent, dest, result, attempts_made=attempts, first_submission_at=first, now=NOW,
                  policy=POLICY)


@pytest.mark.parametrize("failed", range(1, 30))
def test_backoff_stays_between_half_and_all_of_the_exponential_delay_capped_at_an_hour(failed):
    expected = min(2.0 ** (failed - 1), 3600.0)
    for _ in range(20):
        assert expected / 2 <= Backoff().delay(failed) <= expected


def test_retry_after_is_honoured_up_to_the_cap():
    assert Backoff().delay(1, retry_after=120) == 120
    assert Backoff().delay(1, retry_after=99_999) == 3600
    assert Backoff().delay(20, retry_after=1) >= 1800  # never shorter than our own backoff


def test_delivered_rejected_conflict_and_denied():
    assert fate(SendResult(Submission.SUBMITTED, Outcome.DELIVERED, 200)).status is Status.DELIVERED
    assert fate(SendResult(Submission.SUBMITTED, Outcome.REJECTED, 400, error="x")).status is Status.DEAD
    assert fate(SendResult(Submission.SUBMITTED, Outcome.CONFLICT, 422, error="x")).status is Status.DEAD
    assert fate(SendResult(Submission.NOT_SUBMITTED, Outcome.DENIED)).status is Status.REVOKED


def test_retryable_is_scheduled_until_attempts_run_out():
    result = SendResult(Submission.SUBMITTED, Outcome.RETRYABLE, 503, error="receiver answered 503")
    scheduled = fate(result, attempts=4)
    assert scheduled.status is Status.PENDING and scheduled.event == "scheduled_retry"
    assert NOW < scheduled.next_attempt_at <= NOW + timedelta(seconds=16)
    exhausted = fate(result, attempts=5)
    assert exhausted.status is Status.DEAD and "attempts exhausted (5 of 5)" in exhausted.reason


def test_an_intent_that_would_expire_before_its_retry_is_dead():
    result = SendResult(Submission.SUBMITTED, Outcome.RETRYABLE, 503, error="503")
    expiring = replace(INTENT, expires_at=NOW + timedelta(milliseconds=100))
    assert fate(result, intent=expiring, attempts=3).status is Status.DEAD


UNKNOWN = SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, error="ReadTimeout")


def test_unknown_is_retried_inside_the_declared_retention():
    assert fate(UNKNOWN).status is Status.PENDING


def test_unknown_is_not_retried_once_the_first_submission_nears_the_retention_end():
    old = NOW - timedelta(seconds=3600 - 299)
    verdict = fate(UNKNOWN, first=old)
    assert verdict.status is Status.UNKNOWN and "retention" in verdict.reason


def test_unknown_is_not_retried_when_the_next_attempt_would_fall_outside_the_retention():
    nearly = NOW - timedelta(seconds=3600 - 300 - 2)
    assert fate(UNKNOWN, first=nearly, attempts=4).status is Status.UNKNOWN


def test_unknown_without_declared_idempotency_or_with_never_is_reported_unknown():
    assert fate(UNKNOWN, dest=replace(DEST, idempotent=False)).status is Status.UNKNOWN
    never = fate(UNKNOWN, dest=replace(DEST, on_unknown=OnUnknown.NEVER))
    assert never.status is Status.UNKNOWN and "never" in never.reason


def test_always_retries_an_unknown_even_without_idempotency():
    always = replace(DEST, idempotent=False, on_unknown=OnUnknown.ALWAYS)
    assert fate(UNKNOWN, dest=always, first=NOW - timedelta(days=9)).status is Status.PENDING


@pytest.mark.parametrize("status,outcome", [
    (200, Outcome.DELIVERED), (204, Outcome.DELIVERED), (301, Outcome.REJECTED),
    (400, Outcome.REJECTED), (401, Outcome.REJECTED), (408, Outcome.RETRYABLE),
    (409, Outcome.RETRYABLE), (410, Outcome.REJECTED), (422, Outcome.CONFLICT),
    (429, Outcome.RETRYABLE), (500, Outcome.RETRYABLE), (503, Outcome.RETRYABLE),
])
def test_status_codes_are_classified_per_the_contract(status, outcome):
    assert classify_status(status) is outcome


def test_retry_after_accepts_seconds_and_http_dates():
    now = datetime(2030, 1, 1, tzinfo=UTC).timestamp()
    assert retry_after_seconds("120", now) == 120
    assert retry_after_seconds("Tue, 01 Jan 2030 00:02:00 GMT", now) == 120
    assert retry_after_seconds("soon", now) is None


@pytest.mark.parametrize("value", ["\u00b2", "\u0663", "1\u00b9", "\uff11\uff12"])
def test_a_retry_after_of_digits_other_than_ascii_is_no_retry_after(value):
    """RFC 9110's delay-seconds is ASCII digits. str.isdigit took "²" (a byte 0xB2 a receiver can
    send), then float() raised on it, and the answered 503 was recorded as a send that may or may
    not have happened (maybe_submitted)."""
    assert retry_after_seconds(value, datetime(2030, 1, 1, tzinfo=UTC).timestamp()) is None


def test_signature_is_standard_webhooks_hmac_over_id_timestamp_body():
    import hmac

    secret = "whsec_" + base64.b64encode(b"k" * 32).decode()
    expected = base64.b64encode(hmac.new(b"k" * 32, b"a1.1700000000.{}", hashlib.sha256).digest()).decode()
    assert sign((secret,), "a1", 1700000000, b"{}") == "v1," + expected
    assert len(sign((secret, secret), "a1", 1, b"{}").split(" ")) == 2


def test_content_digest_is_rfc9530_sha256():
    assert content_digest(b"{}") == "sha-256=:RBNvo1WzZ4oRRq0W9+hknpT7T8If536DEMBg9hyq/4o=:"


def test_the_claim_backoff_doubles_to_its_cap_however_long_the_database_stays_away():
    from sender.worker import MAX_CLAIM_BACKOFF_SECONDS, claim_pause

    assert [claim_pause(0.5, n) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert claim_pause(0.5, 7) == MAX_CLAIM_BACKOFF_SECONDS
    assert claim_pause(0.5, 100_000) == MAX_CLAIM_BACKOFF_SECONDS  # days of failures: no OverflowError


def test_a_retry_or_a_deadline_past_the_last_time_a_datetime_holds_is_that_time_never_an_overflow():
    """A receiver's retention or a destination's max age added to a stored time read as the last
    one (a row written by hand), a backoff added to a clock at it: each is the last time, and the
    decision is made."""
    late = replace(INTENT, created_at=LAST)
    dest = replace(DEST, max_age_seconds=86_400, on_unknown=OnUnknown.DECLARED)
    assert deadline(late, dest).at == LAST
    unknown = SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, error="timeout")
    made = decide(late, dest, unknown, attempts_made=1, first_submission_at=LAST,
                  now=LAST - timedelta(milliseconds=100), policy=POLICY)
    assert made.status is Status.UNKNOWN  # the retry would fall at the last time, its deadline

