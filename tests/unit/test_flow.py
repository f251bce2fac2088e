"""The flow-control arithmetic both stores' claims apply (``outbox.flow``), and the pause a
receiver's answer asks for (``sender.decision.pause_until``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from outbox import Outcome, Submission
from outbox.flow import (
    MAX_COUNT,
    MAX_PER_SECOND,
    MIN_PER_SECOND,
    Allowance,
    RateLimit,
    allowance,
    next_token_at,
    refilled,
    usable_cap,
    usable_rate,
)
from outbox.store.postgres.changes import held_back
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


@pytest.mark.parametrize("per_second", [1e-12, 1e-300, 5e-324, 0.000009])
def test_a_rate_slower_than_the_slowest_is_refused_naming_the_bound(per_second):
    with pytest.raises(ValidationError, match="greater than or equal to 0.00001"):
        RateLimit(per_second=per_second)
    assert RateLimit(per_second=MIN_PER_SECOND).per_second == MIN_PER_SECOND


@pytest.mark.parametrize(("per_second", "burst", "expected"), [
    (2, 3, RateLimit(per_second=2, burst=3)),  # one the API takes: as stored
    (1e-12, 1, RateLimit(per_second=MIN_PER_SECOND, burst=1)), (5e-324, 1, RateLimit(per_second=MIN_PER_SECOND)),
    (0.0, 1, RateLimit(per_second=MIN_PER_SECOND)), (-3.0, 1, RateLimit(per_second=MIN_PER_SECOND)),
    (float("nan"), 1, RateLimit(per_second=MIN_PER_SECOND)), (float("inf"), 1, RateLimit(per_second=MAX_PER_SECOND)),
    ("fast", 1, RateLimit(per_second=MIN_PER_SECOND)),  # text in a SQLite column
    (5, None, RateLimit(per_second=5, burst=1)), (5, 0, RateLimit(per_second=5, burst=1)),
    (5, 10**9, RateLimit(per_second=5, burst=MAX_COUNT)), (5, 2.5, RateLimit(per_second=5, burst=2)),
])
def test_a_stored_rate_is_computed_with_as_the_nearest_the_api_takes(per_second, burst, expected):
    assert usable_rate(per_second, burst) == expected


def test_a_stored_max_in_flight_is_computed_with_as_the_nearest_the_api_takes():
    assert [usable_cap(v) for v in (None, 4, 0, -2**31, 10**12, "x")] == [None, 4, 1, 1, MAX_COUNT, 1]


def test_a_buckets_stored_count_is_kept_between_empty_and_full():
    rate = RateLimit(per_second=2, burst=3)
    assert refilled(float("-inf"), T0, T0 + timedelta(seconds=1), rate) == 2.0  # (floor(-inf) raised)
    assert refilled(float("nan"), T0, T0, rate) == 0.0 and refilled(float("inf"), T0, T0, rate) == 3.0
    assert refilled(-7.0, T0, T0, rate) == 0.0


def test_the_next_token_is_at_most_a_slowest_rates_wait_away_and_never_past_the_last_time():
    slowest = RateLimit(per_second=MIN_PER_SECOND)
    assert next_token_at(0.0, T0, slowest) == T0 + timedelta(seconds=100_000)
    assert next_token_at(0.5, T0, RateLimit(per_second=2)) == T0 + timedelta(seconds=0.25)
    assert next_token_at(0.0, LAST - timedelta(seconds=1), slowest) == LAST
    stored = RateLimit.model_construct(per_second=1e-12, burst=1)  # (no longer taken, but computed with: no error)
    assert next_token_at(0.0, T0, stored) == LAST


@pytest.mark.parametrize(("answer", "expected"), [
    ('[["edge", 0, 0, 1, 1e12]]', LAST),  # what 0013 answered for a rate of 1e-12: "year 33715 is out of range"
    ('[["edge", 1, 0, 0, "Infinity"]]', LAST),  # a pause until 'infinity', as PostgreSQL writes it in JSON
    ('[["edge", 0, 0, 1, 1893456000.5]]', datetime(2030, 1, 1, 0, 0, 0, 500_000, tzinfo=UTC)),
    ('[["edge", 0, 0, 1, "NaN"]]', None), ('[["edge", 0, 0, 1, null]]', None),
])
def test_the_postgresql_claims_held_answer_is_read_whatever_time_it_says(answer, expected):
    [held] = held_back(answer)
    assert held.destination == "edge" and held.retry_at == expected


def test_a_retry_after_that_is_not_a_number_pauses_nothing_and_an_endless_one_pauses_up_to_the_cap():
    policy = Policy(backoff=Backoff(cap_seconds=60))

    def answered(retry_after: float) -> datetime | None:
        result = SendResult(Submission.SUBMITTED, Outcome.RETRYABLE, status_code=429, retry_after=retry_after)
        return pause_until(result, T0, policy)

    assert answered(float("nan")) is None and answered(float("inf")) == T0 + timedelta(seconds=60)
    assert answered(-5) == T0 and pause_until(SendResult(Submission.SUBMITTED, Outcome.RETRYABLE, status_code=503,
                                                         retry_after=1e300), LAST, policy) == LAST
