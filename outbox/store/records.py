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
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from ..clock import iso
from ..destinations import Destination
from ..grants import Grant
from ..keyring import Keyring, required
from ..model import Attempt, Event, Intent, OnDead, OnUnknown, Ordering, Outcome, Role, Status, Submission
from ..tokens import TokenInfo

#: A stored time as a datetime, None staying None (``Any``: each dialect's driver has its own
#: type); raises OverflowError for one no datetime can hold, which the driver then gives as
#: integer microseconds from an epoch inside the range (negative: before it).
Time = Callable[[Any], Any]
#: The first and the last time a datetime can hold: what a stored time beyond them is read as.
FIRST = datetime.min.replace(tzinfo=UTC)
LAST = datetime.max.replace(tzinfo=UTC)


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


def intent(row: Row, time: Time) -> Intent:
    """An intent from its row."""
    at = _Times(row, time)
    return Intent(
        seq=row["seq"],
        action_id=row["action_id"],
        scope=row["scope"],
        destination=row["destination"],
        channel=row["channel"],
        payload_json=row["payload"],
        payload_digest=row["payload_digest"],
        status=Status(row["status"]),
        attempts=row["attempts"],
        max_attempts=row["max_attempts"],
        next_attempt_at=at("next_attempt_at"),
        not_before=at("not_before"),
        expires_at=at("expires_at"),
        lease_owner=row["lease_owner"],
        lease_expires_at=at("lease_expires_at"),
        fence=row["fence"],
        created_at=at("created_at"),
        updated_at=at("updated_at"),
        last_error=row["last_error"],
        approved_digest=row["approved_digest"],
        approval_expires_at=at("approval_expires_at"),
        approved_by=row["approved_by"],
        ordering_key=row["ordering_key"],
        unreadable=at.unreadable(),  # (last: once every time above is read)
    )


def attempt(row: Row, time: Time) -> Attempt:
    """An attempt from its row."""
    at = _Times(row, time)
    return Attempt(
        attempt_id=row["attempt_id"],
        number=row["number"],
        fence=row["fence"],
        worker=row["worker"],
        started_at=at("started_at"),
        finished_at=at("finished_at"),
        submission=Submission(row["submission"]) if row["submission"] else None,
        outcome=Outcome(row["outcome"]) if row["outcome"] else None,
        status_code=row["status_code"],
        reply=row["reply"],
        external_id=row["external_id"],
        error=row["error"],
        duration_ms=row["duration_ms"],
        stage=row["stage"],
    )


def event(row: Row, time: Time) -> Event:
    """An event from its row."""
    at = _Times(row, time)
    return Event(
        kind=row["kind"],
        at=at("at"),
        actor=row["actor"],
        reason=row["reason"],
        data=json.loads(row["data"]),
    )


def destination(row: Row, time: Time, keyring: Keyring | None) -> Destination:
    """A destination from its row (flags may be stored as integers or booleans), its secrets
    opened with ``keyring``. Raises SecretsKeyError when they do not open."""
    at = _Times(row, time)
    return Destination(
        id=row["id"],
        channel=row["channel"],
        settings=json.loads(row["settings"]),
        secrets=required(keyring).open(row["secrets"], destination_id=row["id"]),
        idempotent=bool(row["idempotent"]),
        retention_seconds=row["retention_seconds"],
        on_unknown=OnUnknown(row["on_unknown"]),
        timeout_seconds=row["timeout_seconds"],
        requires_approval=bool(row["requires_approval"]),
        allow_private_network=bool(row["allow_private_network"]),
        disabled=bool(row["disabled"]),
        created_at=at("created_at"),
        updated_at=at("updated_at"),
        reconcile=bool(row["reconcile"]),
        ordering=Ordering(row["ordering"]),
        ordering_on_dead=OnDead(row["ordering_on_dead"]),
    )


def token(row: Row, time: Time) -> TokenInfo:
    """A token's stored facts from its row."""
    at = _Times(row, time)
    return TokenInfo(
        id=row["id"],
        role=Role(row["role"]),
        scopes=tuple(json.loads(row["scopes"])),
        label=row["label"],
        created_at=at("created_at"),
        revoked_at=at("revoked_at"),
    )


def grant(row: Row, time: Time) -> Grant:
    """A grant from its row."""
    at = _Times(row, time)
    return Grant(
        id=row["id"],
        scope=row["scope"],
        destination=row["destination"],
        revision=row["revision"],
        expires_at=at("expires_at"),
        note=row["note"],
        created_at=at("created_at"),
        updated_at=at("updated_at"),
    )
