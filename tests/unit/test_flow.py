"""The flow-control arithmetic both stores' claims apply (``outbox.flow``), and the pause a
receiver's answer asks for (``sender.decision.pause_until``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from outbox import Outcome, Submission
from outbox.flow import Allowance, RateLimit, allowance, refilled
from outbox.timestamps import LAST
from sender.backoff import Backoff
from sender.channel import SendResult
from sender.decision import Policy, pause_until

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def test_a_rate_limit_is_validated_whole():
    assert RateLimit(per_second=0.5) == RateLimit(per_second=0.5, burst=1)
    for bad in ({"per_second": 0}, {"per_second": 5, "burst": 0}, {"per_second": "5"}, {"per_second": 5, "x": 1},
                {"per_second": 5, "burst": 1.5}):
        with pytest.raises(ValidationError):
            RateLimit.model_validate(bad)


def test_the_bucket_refills_at_its_rate_up_to_the_burst_and_never_backwards():
    rate = RateLimit(per_second=2, burst=3)
    assert refilled(0.0, T0, T0 + timedelta(seconds=1), rate) == 2.0
    assert refilled(0.5, T0, T0 + timedelta(seconds=10), rate) == 3.0
    assert refilled(1.0, T0, T0 - timedelta(seconds=5), rate) == 1.0  # a clock that went back refills nothing


def test_the_allowance_is_held_by_in_flight_first_then_by_whole_tokens():
    assert allowance(10, in_flight=0, max_in_flight=None, tokens=None) == Allowance(10, 0, 0)
    assert allowance(10, in_flight=3, max_in_flight=5, tokens=None) == Allowance(2, 8, 0)
    assert allowance(10, in_flight=0, max_in_flight=None, tokens=2.9) == Allowance(2, 0, 8)
    assert allowance(10, in_flight=4, max_in_flight=5, tokens=0.5) == Allowance(0, 9, 1)
    assert allowance(3, in_flight=9, max_in_flight=5, tokens=10) == Allowance(0, 3, 0)  # over (the limit was lowered)


def test_a_429_or_503_with_retry_after_pauses_the_destination_capped_at_the_backoff_cap():
    policy = Policy(backoff=Backoff(cap_seconds=60))

    def answered(status: int, retry_after: float | None) -> datetime | None:
        result = SendResult(Submission.SUBMITTED, Outcome.RETRYABLE, status_code=status, retry_after=retry_after)
        return pause_until(result, T0, policy)

    assert answered(429, 5) == T0 + timedelta(seconds=5)
    assert answered(503, 7200) == T0 + timedelta(seconds=60)
    assert answered(429, None) is None and answered(500, 5) is None and answered(503, None) is None


def test_a_retry_after_that_is_not_a_number_pauses_nothing_and_an_endless_one_pauses_up_to_the_cap():
    policy = Policy(backoff=Backoff(cap_seconds=60))

    def answered(retry_after: float) -> datetime | None:
        result = SendResult(Submission.SUBMITTED, Outcome.RETRYABLE, status_code=429, retry_after=retry_after)
        return pause_until(result, T0, policy)

    assert answered(float("nan")) is None and answered(float("inf")) == T0 + timedelta(seconds=60)
    assert answered(-5) == T0 and pause_until(SendResult(Submission.SUBMITTED, Outcome.RETRYABLE, status_code=503,
                                                         retry_after=1e300), LAST, policy) == LAST
