"""Rows as the outbox's records, the same for every dialect.

Every dialect's driver gives rows that map column names to values, and keeps JSON columns as JSON
text; dialects differ only in how a time is stored, so each passes ``time``, which turns a stored
time into a timezone-aware datetime (None staying None). One mapping, so a column added to a
record is read back the same way by every store; a destination's secrets are opened here, with
the store's keyring, for every dialect alike.

A stored time no datetime can hold (before year 1 or after 9999, UTC: written by hand, or
before the API checked times) must not fail the read of every row beside it, a claim or a
listing: ``time`` raises OverflowError for it, and it is read as the nearest time a datetime can
hold, which keeps what is due, expired or older so. An intent says which of its times were
read so (``Intent.unreadable``), and the sender sets it aside unsent.

The other way, what a store writes of a record (a new intent, an attempt, a destination, a token,
a grant) is one tuple of values here, in the order every dialect's statement takes them; a
dialect only stores each value its way (SQLite: times as integer microseconds).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from ..clock import iso
from ..destinations import (
    DEFAULT_RETENTION_SECONDS,
    DEFAULT_TIMEOUT_SECONDS,
    MAX_AGE_SECONDS,
    MAX_RETENTION_SECONDS,
    MAX_TIMEOUT_SECONDS,
    MIN_RETENTION_SECONDS,
    Destination,
    Stored,
)
from ..events import NewEvent, StoredEvent
from ..grants import Grant, GrantSpec
from ..keyring import Keyring, required
from ..model import Attempt, Event, Intent, NewIntent, OnDead, OnUnknown, Ordering, Outcome, Role, Status, Submission
from ..timestamps import FIRST, LAST
from ..tokens import TokenInfo

#: A stored time as a datetime, None staying None (``Any``: each dialect's driver has its own
#: type); raises OverflowError for one no datetime can hold, which the driver then gives as
#: integer microseconds from an epoch inside the range (negative: before it).
Time = Callable[[Any], Any]


def nearest(time: Time, stored: Any) -> Any:
    """``time(stored)``, or for a stored time no datetime can hold, the nearest one it can."""
    return _read(time, stored)[0]


def _read(time: Time, stored: Any) -> tuple[Any, bool]:
    """``nearest(time, stored)``, and whether it is not the time stored."""
    try:
        return time(stored), False
    except OverflowError:
        return (FIRST if stored < 0 else LAST), True


class _Times:
    """Reads a row's times as ``nearest`` does, noting each one that is not the time stored."""

    def __init__(self, row: Row, time: Time) -> None:
        self.row = row
        self.time = time
        self.beyond: list[str] = []

    def __call__(self, column: str) -> Any:
        read, beyond = _read(self.time, self.row[column])
        if beyond:
            self.beyond.append(f"{column} {'before' if read is FIRST else 'after'} {iso(read)}")
        return read

    def unreadable(self) -> str | None:
        """What ``Intent.unreadable`` says, or None when every time was read as stored."""
        if not self.beyond:
            return None
        return (f"stored times beyond what can be read (years 1 to 9999, UTC): {', '.join(self.beyond)}; "
                "each is shown as the nearest time that can be read")


class Row(Protocol):
    """A row read by column name (sqlite3.Row, asyncpg.Record, a dict)."""

    def __getitem__(self, column: str, /) -> Any: ...


def _as_is(row: Row, *columns: str) -> dict[str, Any]:
    """The ``columns`` of ``row`` read as stored, each under its own name."""
    return {column: row[column] for column in columns}


def _flags(row: Row, *columns: str) -> dict[str, Any]:
    """The ``columns`` of ``row`` as booleans (stored as integers or booleans)."""
    return {column: bool(row[column]) for column in columns}


#: The most attempts an intent's row may say were made for the sender to go on counting: one more
#: attempt, and a replay's fresh budget (``default_max_attempts``, at most 1000) on top of it, still
#: fit PostgreSQL's integer column. A count beyond it (written by hand) would fail the write of the
#: next attempt, and with it the cycle that holds it, for every destination.
MAX_COUNTED = 2**31 - 1 - 1 - 1000


def _uncountable(row: Row) -> str | None:
    """What ``Intent.unreadable`` says of a stored attempt count the sender cannot go on from."""
    attempts = row["attempts"]
    if isinstance(attempts, int) and attempts <= MAX_COUNTED:
        return None
    return f"a stored attempt count beyond what the sender counts: attempts {attempts} (at most {MAX_COUNTED})"


#: An intent's stored times, in the order ``intent`` reads them.
INTENT_TIMES = ("next_attempt_at", "not_before", "expires_at", "lease_expires_at", "created_at", "updated_at",
                "approval_expires_at")


def intent(row: Row, time: Time) -> Intent:
    """An intent from its row (a claim reads one per delivery: its times are read at once, and
    noted one by one only when one of them is beyond what a datetime holds)."""
    try:
        times = [time(row[column]) for column in INTENT_TIMES]
        beyond = None
    except OverflowError:
        at = _Times(row, time)
        times = [at(column) for column in INTENT_TIMES]
        beyond = at.unreadable()
    next_attempt_at, not_before, expires_at, lease_expires_at, created_at, updated_at, approval_expires_at = times
    uncountable = _uncountable(row)
    return Intent(
        seq=row["seq"], action_id=row["action_id"], scope=row["scope"], destination=row["destination"],
        channel=row["channel"],
        # an intent of an event sends the payload stored once in the event's row (``event_payload``
        # beside its columns) and keeps none of its own; any other intent sends its own
        payload_json=row["payload"] if row["event_payload"] is None else row["event_payload"],
        payload_digest=row["payload_digest"], status=Status(row["status"]), attempts=row["attempts"],
        max_attempts=row["max_attempts"], next_attempt_at=next_attempt_at, not_before=not_before,
        expires_at=expires_at, lease_owner=row["lease_owner"], lease_expires_at=lease_expires_at,
        fence=row["fence"], created_at=created_at, updated_at=updated_at, last_error=row["last_error"],
        approved_digest=row["approved_digest"], approval_expires_at=approval_expires_at,
        approved_by=row["approved_by"], ordering_key=row["ordering_key"], replayed_after=row["replayed_after"],
        unreadable=(beyond if uncountable is None else uncountable if beyond is None else f"{beyond}; {uncountable}"),
        event_id=row["event_id"], trace_context=row["trace_context"],
    )


def attempt(row: Row, time: Time) -> Attempt:
    """An attempt from its row."""
    at = _Times(row, time)
    return Attempt(
        **_as_is(row, "attempt_id", "number", "fence", "worker", "status_code", "reply", "external_id", "error",
                 "duration_ms", "stage"),
        started_at=at("started_at"),
        finished_at=at("finished_at"),
        submission=Submission(row["submission"]) if row["submission"] else None,
        outcome=Outcome(row["outcome"]) if row["outcome"] else None,
    )


def event(row: Row, time: Time) -> Event:
    """An event from its row."""
    at = _Times(row, time)
    return Event(**_as_is(row, "kind", "actor", "reason"), at=at("at"), data=json.loads(row["data"]))


def destination(row: Row, time: Time, keyring: Keyring | None) -> Destination:
    """A destination from its row, its secrets opened with ``keyring``. Raises SecretsKeyError
    when they do not open. A stored setting the API would refuse (a row written by hand) is read
    as the nearest one it takes, and the destination says which (``Destination.unusable``), so
    one such row fails no read of the others, nor a computation of the sender's."""
    at = _Times(row, time)
    kept = Stored()
    paused_until = at("paused_until")  # (the one time the sender computes with, read first: noted alone)
    kept.notes += [f"{beyond} (read as the nearest time that can be read)" for beyond in at.beyond]
    return Destination(
        **_as_is(row, "id", "channel"),
        **_flags(row, "idempotent", "requires_approval", "allow_private_network", "disabled", "reconcile"),
        retention_seconds=kept.whole("retention_seconds", row["retention_seconds"], MIN_RETENTION_SECONDS,
                                     MAX_RETENTION_SECONDS, DEFAULT_RETENTION_SECONDS),
        timeout_seconds=kept.seconds("timeout_seconds", row["timeout_seconds"], MAX_TIMEOUT_SECONDS,
                                     DEFAULT_TIMEOUT_SECONDS),
        settings=kept.settings(row["settings"]),
        secrets=required(keyring).open(row["secrets"], destination_id=row["id"]),
        on_unknown=kept.choice("on_unknown", row["on_unknown"], OnUnknown, OnUnknown.DECLARED),
        created_at=at("created_at"),
        updated_at=at("updated_at"),
        ordering=kept.choice("ordering", row["ordering"], Ordering, Ordering.NONE),
        ordering_on_dead=kept.choice("ordering_on_dead", row["ordering_on_dead"], OnDead, OnDead.BLOCK),
        retry_schedule=kept.schedule(row["retry_schedule"]),
        max_age_seconds=kept.whole("max_age_seconds", row["max_age_seconds"], 1, MAX_AGE_SECONDS, None),
        subscriptions=kept.subscriptions(row["subscriptions"]),
        rate_limit=kept.rate(row["rate_per_second"], row["rate_burst"]),
        max_in_flight=kept.cap(row["max_in_flight"]),
        paused_until=paused_until,
        unusable=kept.unusable(),
        owner=row["owner"],
        previous_secrets_until=at("previous_secrets_until"),
    )


def stored_event(row: Row, time: Time) -> StoredEvent:
    """An event from its row (without its fan-out: ``StoredEvent.with_fanout``)."""
    return StoredEvent(**_as_is(row, "seq", "event_id", "scope", "topic", "payload_digest", "ordering_key", "actor"),
                       payload_json=row["payload"], created_at=nearest(time, row["created_at"]))


def skipped_of(row: Row) -> list[tuple[str, str]]:
    """The ``(destination, reason)`` pairs an event's row says it made no intent for."""
    return [(d, reason) for d, reason in json.loads(row["skipped"])]


def token(row: Row, time: Time) -> TokenInfo:
    """A token's stored facts from its row."""
    at = _Times(row, time)
    return TokenInfo(**_as_is(row, "id", "label"), role=Role(row["role"]), scopes=tuple(json.loads(row["scopes"])),
                     created_at=at("created_at"), revoked_at=at("revoked_at"))


def grant(row: Row, time: Time) -> Grant:
    """A grant from its row."""
    at = _Times(row, time)
    return Grant(**_as_is(row, "id", "scope", "destination", "revision", "note"), expires_at=at("expires_at"),
                 created_at=at("created_at"), updated_at=at("updated_at"))


@dataclass(frozen=True, slots=True)
class Reader:
    """The records as one dialect reads them, with its ``time``."""

    time: Time

    def intent(self, row: Row) -> Intent:
        return intent(row, self.time)

    def attempt(self, row: Row) -> Attempt:
        return attempt(row, self.time)

    def event(self, row: Row) -> Event:
        return event(row, self.time)

    def token(self, row: Row) -> TokenInfo:
        return token(row, self.time)

    def grant(self, row: Row) -> Grant:
        return grant(row, self.time)

    def destination(self, row: Row, keyring: Keyring | None) -> Destination:
        return destination(row, self.time, keyring)

    def event_of(self, row: Row, intents: Sequence[Intent]) -> StoredEvent:
        """An event from its row, with its fan-out: ``intents``, the ones it made."""
        return stored_event(row, self.time).with_fanout(intents, skipped_of(row))

    def at(self, stored: Any) -> Any:
        """A time read outside a record (an aggregate's), as records read theirs."""
        return nearest(self.time, stored)


# -- records as the values stores write ------------------------------------------------------


def new_intent_values(new: NewIntent, channel: str, status: Status) -> tuple[Any, ...]:
    """A new intent's columns, from its key to ``created_at``, as ``insert_intent`` takes them. An
    intent that sends its event's stored payload (``payload_event``, written beside) stores none of
    its own: ``''``, which no payload is (a payload is JSON)."""
    payload = "" if new.payload_event is not None else new.payload_json
    return (new.key, new.action_id, new.scope, new.destination, channel, payload, new.payload_digest,
            status.value, new.max_attempts, new.next_attempt_at, new.not_before, new.expires_at, new.created_at)


#: The columns ``attempt_values`` gives, in its order, as the statements that write attempts name them.
ATTEMPT_COLUMNS = ("attempt_id", "number", "attempt_fence", "worker", "started_at", "finished_at", "submission",
                   "outcome", "status_code", "reply", "external_id", "error", "duration_ms", "stage")


def attempt_values(a: Attempt, time: Callable[[datetime | None], Any] | None = None) -> tuple[Any, ...]:
    """An attempt's columns, its id first, as the statements that write attempts take them; its
    times as ``time`` stores them (None: as datetimes), the rest as every dialect stores them."""
    started_at, finished_at = (a.started_at, a.finished_at) if time is None else (time(a.started_at),
                                                                                  time(a.finished_at))
    return (a.attempt_id, a.number, a.fence, a.worker, started_at, finished_at,
            a.submission.value if a.submission else None, a.outcome.value if a.outcome else None,
            a.status_code, a.reply, a.external_id, a.error, a.duration_ms, a.stage)


def plain_data(event: Event) -> dict[str, Any]:
    """An event's data as the dict JSON encodes (itself when it is one: no copy per event)."""
    return event.data if type(event.data) is dict else dict(event.data)


def event_data(event: Event) -> str:
    """An event's data as the JSON text stored."""
    return json.dumps(plain_data(event)) if event.data else "{}"


def destination_values(d: Destination, sealed: str) -> tuple[Any, ...]:
    """A destination's columns as ``put_destination`` takes them, its secrets ``sealed``."""
    return (d.id, d.channel, json.dumps(dict(d.settings)), sealed, d.idempotent, d.retention_seconds,
            d.on_unknown.value, d.timeout_seconds, d.requires_approval, d.allow_private_network, d.disabled,
            d.created_at, d.updated_at, d.reconcile, d.ordering.value, d.ordering_on_dead.value,
            None if d.retry_schedule is None else json.dumps(list(d.retry_schedule)), d.max_age_seconds,
            json.dumps([sub.json() for sub in d.subscriptions]),
            d.rate_limit and float(d.rate_limit.per_second), d.rate_limit and d.rate_limit.burst, d.max_in_flight,
            d.owner, d.previous_secrets_until)



def new_event_values(new: NewEvent) -> tuple[Any, ...]:
    """A new event's columns as ``insert_topic_event`` takes them."""
    return (new.key, new.event_id, new.scope, new.topic, new.payload_json, new.payload_digest, new.ordering_key,
            new.actor, new.created_at)


def token_values(info: TokenInfo, token_hash: str) -> tuple[Any, ...]:
    """A token's columns as ``insert_token`` takes them."""
    return (info.id, token_hash, info.role.value, json.dumps(list(info.scopes)), info.label, info.created_at)


def grant_values(grant_id: str, spec: GrantSpec, at: datetime) -> tuple[Any, ...]:
    """A grant's columns as ``put_grant`` takes them, made or replaced ``at``."""
    return (grant_id, spec.scope, spec.destination, spec.expires_at, spec.note, at, at)
