"""The one rule for the times clients give (``outbox.timestamps``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from outbox import InvalidInput, Settings, operations, timestamps
from outbox.destinations import DestinationSpec
from outbox.flow import MIN_PER_SECOND, RateLimit
from outbox.timestamps import EARLIEST, FIRST, HEADROOM, LAST, LATEST


@pytest.mark.parametrize("text,expected", [
    ("2030-01-01T09:00:00Z", datetime(2030, 1, 1, 9, tzinfo=UTC)),
    ("2030-01-01t10:00:00.5+01:00", datetime(2030, 1, 1, 9, 0, 0, 500_000, tzinfo=UTC)),
    ("2030-01-01 09:00:00.1234567z", datetime(2030, 1, 1, 9, 0, 0, 123_456, tzinfo=UTC)),  # to microseconds
    ("0001-01-01T00:00:00Z", EARLIEST),
    ("9999-01-01T00:59:59.999999+01:00", LATEST),
])
def test_rfc_3339_with_an_offset_inside_the_range_is_read_as_utc(text, expected):
    assert timestamps.read(text) == expected and timestamps.read(text).tzinfo is UTC


@pytest.mark.parametrize("value", [
    "0001-01-01T00:00:00+00:01", "9999-01-01T01:00:00+01:00", "9999-12-31T23:59:59Z", "10000-01-01T00:00:00Z",
    "2030-01-01T00:00:00", "2030-01-01", "2030-01-01T00:00Z", "2030-01-01T00:00:00+0100", "2030-01-01T00:00:00 Z",
    "2030-01-01T00:00:00Z\n", "1700000000", "0", "", "2030-02-30T00:00:00Z", "2030-01-01T24:00:00Z",
    "2030-01-01T00:00:60Z", "2030-01-01T00:00:00+24:00", "２０３０-01-01T00:00:00Z",
    0, 1.5, True, None, [], datetime(2030, 1, 1), datetime(9999, 12, 31, 23, tzinfo=timezone(-timedelta(hours=1))),
])
def test_anything_else_is_refused_with_the_field_named(value):
    with pytest.raises(InvalidInput, match="^not_before: "):
        timestamps.checked(value, "not_before")


def test_what_the_api_prints_is_taken_back():
    assert timestamps.read(timestamps.text(LATEST, "t")) == LATEST


def test_what_the_sender_adds_to_a_time_fits_in_the_headroom():
    """A lease, then a backoff (or a Retry-After) up to its cap, an approval, a receiver's
    retention: each bounded, and all of them together still within what a datetime holds."""
    fields = Settings.model_fields
    most = (_le(fields["lease_seconds"]) + _le(fields["backoff_cap_seconds"]) + operations.MAX_APPROVAL_SECONDS
            + _le(DestinationSpec.model_fields["retention_seconds"]))
    assert timedelta(seconds=most) < HEADROOM
    assert datetime.max.replace(tzinfo=UTC) == LATEST + HEADROOM


def _le(field) -> float:
    return next(m.le for m in field.metadata if getattr(m, "le", None) is not None)


def test_every_duration_a_setting_or_a_destination_gives_is_bounded_within_the_headroom():
    """Each setting and destination field the sender adds to a time has an upper bound, and the
    rate limit a lower one (the next token is 1 / per_second away), all within the headroom: so
    no value the API or a settings file takes makes a time that cannot be held."""
    durations = [name for name in Settings.model_fields if name.endswith("_seconds")]
    assert {"lease_seconds", "poll_seconds", "backoff_initial_seconds", "backoff_cap_seconds",
            "circuit_pause_seconds", "retention_margin_seconds", "drain_seconds"} <= set(durations)
    for name in set(durations) - {"token_cache_seconds", "authority_seconds", "delivered_retention_seconds"}:
        assert timedelta(seconds=_le(Settings.model_fields[name])) <= HEADROOM, name  # (monotonic caches aside)
    assert _le(Settings.model_fields["delivered_retention_seconds"]) <= 100 * 366 * 86_400  # (subtracted from now)
    for name in ("retention_seconds", "timeout_seconds", "max_age_seconds"):
        assert timedelta(seconds=_le(DestinationSpec.model_fields[name])) <= HEADROOM, name
    slowest = next(m.ge for m in RateLimit.model_fields["per_second"].metadata if getattr(m, "ge", None))
    assert timedelta(seconds=1 / slowest) <= HEADROOM and slowest == MIN_PER_SECOND


@pytest.mark.parametrize(("seconds", "expected"), [
    (1.5, datetime(2030, 1, 1, 0, 0, 1, 500_000, tzinfo=UTC)),
    (1e12, LAST),  # 1 / 1e-12: 31,700 years on
    (1e300, LAST), (float("inf"), LAST),  # past timedelta's own range
    (-1e12, FIRST), (float("-inf"), FIRST),
    (float("nan"), datetime(2030, 1, 1, tzinfo=UTC)),  # adds nothing
])
def test_a_computed_time_is_kept_between_the_first_and_the_last_a_datetime_holds(seconds, expected):
    assert timestamps.later(datetime(2030, 1, 1, tzinfo=UTC), seconds) == expected


def test_a_time_near_the_last_plus_anything_is_the_last_never_an_overflow():
    assert timestamps.later(LAST, 1e-6) == LAST and timestamps.later(LATEST, 86_400 * 400) == LAST
    assert timestamps.later(FIRST, -1) == FIRST
    assert timestamps.later(LATEST, 86_400) == LATEST + timedelta(days=1)  # within the headroom: exact


@pytest.mark.parametrize(("seconds", "expected"), [
    (0, datetime(1970, 1, 1, tzinfo=UTC)), (1_893_456_000.25, datetime(2030, 1, 1, 0, 0, 0, 250_000, tzinfo=UTC)),
    (1e12 + 1_893_456_000, LAST),  # the claim's answer for a rate of 1e-12 (fromtimestamp: "year 33715")
    (253_402_300_800, LAST), (float("inf"), LAST), (-1e15, FIRST),
])
def test_epoch_seconds_from_the_database_are_read_within_the_range(seconds, expected):
    assert timestamps.from_epoch(seconds) == expected
