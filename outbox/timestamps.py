"""Times clients give, read by one rule at every entry point (the API's bodies and queries, the
library, the CLI, the Python client): RFC 3339 text with an offset, or an aware datetime, that
falls in ``EARLIEST`` to ``LATEST`` once its offset is applied.

That range is what every store can hold and the sender can still compute with: a datetime
ends at 9999-12-31T23:59:59.999999Z (the SQLite store's integers and PostgreSQL hold more, but
what is read back must be a datetime), and the sender adds up to ``HEADROOM`` to a time it has
reached (a lease, a backoff up to its cap, an approval's validity, a receiver's retention). An
intent's ``not_before`` at ``LATEST`` is still claimed, leased, retried and expired without
overflowing; one later would have been stored, then failed every read of it.

A time the outbox computes (a retry's, a lease's expiry, a pause's end, a deadline, when a rate
limit lets the next send go) is made by ``later``, the one place such a sum is made: past the
first or the last time a datetime can hold it is that time (``FIRST``, ``LAST``), never an
OverflowError, so a setting or a stored value that would take it further costs its own intent or
destination a wait, never the cycle that computes it for every destination.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from pydantic import AwareDatetime, BeforeValidator, Field
from pydantic_core import PydanticCustomError

from .clock import iso
from .errors import InvalidInput

#: RFC 3339's date-time (section 5.6): ``T`` or a space between date and time, an optional
#: fraction, and an offset that is ``Z`` or ``+HH:MM``/``-HH:MM``. Applied with ``fullmatch``.
FORM = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})", re.ASCII)
#: The first and the last time a datetime can hold (UTC): what a stored time beyond them is read as,
#: and what ``later`` keeps a computed time between.
FIRST = datetime.min.replace(tzinfo=UTC)
LAST = datetime.max.replace(tzinfo=UTC)
#: Where epoch seconds count from.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: The earliest time a client may give (UTC).
EARLIEST = datetime(1, 1, 1, tzinfo=UTC)
#: The latest time a client may give (UTC): a year before the last a datetime can hold.
LATEST = datetime(9998, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)
#: What the sender may add to a time it has reached; the settings and fields it adds are
#: bounded to fit (lease 1 day, backoff cap 30 days, approval 30 days, retention 90 days).
HEADROOM: timedelta = LAST - LATEST
EXAMPLE = "such as 2030-01-01T09:00:00Z or 2030-01-01T10:00:00.5+01:00"


def later(at: datetime, seconds: float) -> datetime:
    """``at`` plus ``seconds`` (negative: earlier), kept between ``FIRST`` and ``LAST``: a sum past
    either is that time, and ``seconds`` that is not a number adds nothing."""
    if seconds != seconds:  # NaN
        return at
    try:
        return at + timedelta(seconds=seconds)
    except OverflowError:  # (timedelta's own range, or the datetime's)
        return LAST if seconds > 0 else FIRST


def from_epoch(seconds: float) -> datetime:
    """Epoch seconds (a database's answer) as a UTC datetime, kept between ``FIRST`` and ``LAST``
    as ``later`` keeps it (``datetime.fromtimestamp`` raises past year 9999)."""
    return later(EPOCH, seconds)


def read(value: object) -> datetime:
    """``value`` (RFC 3339 text with an offset, or an aware datetime) as a UTC datetime in
    ``EARLIEST`` to ``LATEST``. Raises ValueError saying what is wrong with it."""
    if isinstance(value, str):
        value = _parsed(value)
    elif not isinstance(value, datetime):
        raise ValueError(f"{value!r} is not a time: send an RFC 3339 string with an offset, {EXAMPLE}")
    if value.utcoffset() is None:
        raise ValueError(f"{value.isoformat()} has no timezone: give its offset, {EXAMPLE}")
    try:
        utc = value.astimezone(UTC)
    except OverflowError:
        utc = None  # its offset takes it past the first or the last time a datetime can hold
    if utc is None or not EARLIEST <= utc <= LATEST:
        raise ValueError(f"{value.isoformat()} is outside the times the outbox takes: {iso(EARLIEST)} "
                         f"to {iso(LATEST)}, once its offset is applied")
    return utc


def checked(value: object, field: str) -> datetime:
    """``read(value)``, or InvalidInput naming ``field``."""
    try:
        return read(value)
    except ValueError as exc:
        raise InvalidInput(f"{field}: {exc}") from None


def text(value: object, field: str) -> str:
    """``value`` as the RFC 3339 text the API takes (checked as ``checked`` does)."""
    return iso(checked(value, field))


def _parsed(value: str) -> datetime:
    found = FORM.fullmatch(value)
    if found is None:
        raise ValueError(f"{value!r} is not an RFC 3339 time with an offset, {EXAMPLE}")
    whole, fraction = value.upper(), found.group(1)
    if fraction:  # a datetime holds microseconds: keep six digits of the fraction
        whole = whole.replace(fraction, "." + fraction[1:7].ljust(6, "0"), 1)
    try:
        return datetime.fromisoformat(whole)
    except ValueError as exc:  # a 30th of February, an hour 24, an offset of a day or more
        raise ValueError(f"{value!r} is not a time: {exc}") from None


def _validated(value: Any) -> datetime:
    try:
        return read(value)
    except ValueError as exc:
        raise PydanticCustomError("time", str(exc)) from None


#: A time in a request body or query, as pydantic validates it (and documents it: a date-time
#: string, and its range); every model a client sends uses it for its times.
Timestamp = Annotated[AwareDatetime, BeforeValidator(_validated), Field(
    description=f"RFC 3339 with its offset, from {iso(EARLIEST)} to {iso(LATEST)} once the offset is applied")]
