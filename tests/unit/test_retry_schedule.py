"""A destination's own retry schedule and maximum age, as the delivery policy applies them."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from pydantic import ValidationError

from outbox import DestinationSpec, Outcome, Status, Submission
from outbox.destinations import deadline
from sender import Backoff, SendResult
from sender.backoff import exhausted

from .test_sender_policy import DEST, INTENT, NOW, UNKNOWN, fate

SCHEDULE = (5, 30, 300)
SCHEDULED = replace(DEST, retry_schedule=SCHEDULE)
FAILED = SendResult(Submission.SUBMITTED, Outcome.RETRYABLE, 503, error="receiver answered 503")
MANY = replace(INTENT, max_attempts=24)


def test_the_wait_before_retry_n_is_the_schedules_nth_delay_exactly():
    backoff = Backoff(1.0, 3600.0)
    assert [backoff.delay(n, schedule=SCHEDULE) for n in (1, 2, 3)] == [5, 30, 300]
    assert backoff.delay(9, schedule=SCHEDULE) == 300  # past its end: the last (exhausted says no retry)


def test_a_retry_after_lengthens_a_scheduled_wait_up_to_the_cap_and_never_shortens_it():
    backoff = Backoff(1.0, 3600.0)
    assert backoff.delay(1, retry_after=120, schedule=SCHEDULE) == 120
    assert backoff.delay(3, retry_after=1, schedule=SCHEDULE) == 300
    assert backoff.delay(1, retry_after=10 ** 6, schedule=SCHEDULE) == 3600


def test_the_senders_cap_bounds_a_scheduled_wait_too():
    assert Backoff(0.1, 60.0).delay(3, schedule=SCHEDULE) == 60


def test_n_delays_allow_n_retries():
    assert [exhausted(SCHEDULE, made) for made in (1, 2, 3, 4)] == [False, False, False, True]
    assert not exhausted(None, 10_000)


def test_each_retry_follows_the_schedule_until_it_is_exhausted_then_the_intent_is_dead():
    due = [fate(FAILED, dest=SCHEDULED, intent=MANY, attempts=n).next_attempt_at for n in (1, 2, 3)]
    assert due == [NOW + timedelta(seconds=s) for s in SCHEDULE]
    dead = fate(FAILED, dest=SCHEDULED, intent=MANY, attempts=4)
    assert dead.status is Status.DEAD and dead.next_attempt_at is None
    assert dead.reason.startswith("retry schedule exhausted (4 attempts, one more than its delays)")


def test_a_replay_starts_the_schedule_over():
    replayed = replace(MANY, replayed_after=4)
    assert fate(FAILED, dest=SCHEDULED, intent=replayed, attempts=5).next_attempt_at == NOW + timedelta(seconds=5)
    dead = fate(FAILED, dest=SCHEDULED, intent=replayed, attempts=8)
    assert dead.status is Status.DEAD and dead.reason.startswith("retry schedule exhausted (4 attempts,")


def test_max_attempts_still_bounds_a_longer_schedule():
    long = replace(DEST, retry_schedule=(1,) * 50)
    dead = fate(FAILED, dest=long, intent=replace(INTENT, max_attempts=3), attempts=3)
    assert dead.status is Status.DEAD and "attempts exhausted (3 of 3)" in dead.reason


def test_an_unknown_outcome_at_the_end_of_the_schedule_stays_unknown_not_dead():
    verdict = fate(UNKNOWN, dest=SCHEDULED, intent=MANY, attempts=4)
    assert verdict.status is Status.UNKNOWN and "retry schedule exhausted" in verdict.reason


def test_the_deadline_is_the_earlier_of_expires_at_and_the_enqueue_plus_the_max_age():
    assert deadline(INTENT, DEST) is None
    aged = replace(DEST, max_age_seconds=600)
    by_age = deadline(INTENT, aged)
    assert by_age is not None and by_age.at == INTENT.created_at + timedelta(seconds=600)
    assert "the destination's max age of 600s" in by_age.why
    sooner = replace(INTENT, expires_at=NOW + timedelta(seconds=60))
    by_expiry = deadline(sooner, aged)
    assert by_expiry is not None and by_expiry.at == NOW + timedelta(seconds=60) and "expires_at" in by_expiry.why
    later = replace(INTENT, expires_at=NOW + timedelta(days=1))
    assert deadline(later, aged) == by_age


def test_a_retry_that_would_fall_past_the_max_age_is_a_dead_letter_saying_so():
    aged = replace(SCHEDULED, max_age_seconds=60)
    assert fate(FAILED, dest=aged, intent=MANY, attempts=2).status is Status.PENDING  # due at +30
    dead = fate(FAILED, dest=aged, intent=MANY, attempts=3)  # due at +300
    assert dead.status is Status.DEAD
    assert dead.reason.startswith("expired: the destination's max age of 60s")


def test_a_changed_max_age_applies_to_an_intent_already_queued():
    old = replace(MANY, created_at=NOW - timedelta(hours=2))
    assert fate(FAILED, dest=replace(SCHEDULED, max_age_seconds=86_400), intent=old).status is Status.PENDING
    assert fate(FAILED, dest=replace(SCHEDULED, max_age_seconds=3600), intent=old).status is Status.DEAD


@pytest.mark.parametrize("schedule", [[5, 30, 300, 1800, 3600], [0.25], [1] * 100])
def test_a_schedule_of_positive_delays_up_to_an_hour_is_taken(schedule):
    assert DestinationSpec(retry_schedule=schedule).retry_schedule == schedule


@pytest.mark.parametrize("schedule,why", [
    ([], "at least 1 item"), ([1] * 101, "at most 100 items"), ([0], "greater than 0"), ([-5], "greater than 0"),
    ([3601], "less than or equal to 3600"), (["5"], "valid integer"), ([True], "valid integer"), (5, "valid list"),
])
def test_a_schedule_out_of_bounds_is_refused(schedule, why):
    with pytest.raises(ValidationError, match=why):
        DestinationSpec(retry_schedule=schedule)


@pytest.mark.parametrize("max_age", [0, -1, 90 * 86_400 + 1, 1.5, "60"])
def test_a_max_age_out_of_bounds_is_refused(max_age):
    with pytest.raises(ValidationError):
        DestinationSpec(max_age_seconds=max_age)
