"""Rows as the outbox's records, the same for every dialect.

Every dialect's driver gives rows that map column names to values, and keeps JSON columns as JSON
text; dialects differ only in how a time is stored, so each passes ``time``, which turns a stored
time into a timezone-aware datetime (None staying None). One mapping, so a column added to a
record is read back the same way by every store; a destination's secrets are opened here, with
the store's keyring, for every dialect alike.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol

from ..destinations import Destination
from ..grants import Grant
from ..keyring import Keyring, required
from ..model import Attempt, Event, Intent, OnDead, OnUnknown, Ordering, Outcome, Role, Status, Submission
from ..tokens import TokenInfo

#: A stored time as a datetime, None staying None (``Any``: each dialect's driver has its own type).
Time = Callable[[Any], Any]


class Row(Protocol):
    """A row read by column name (sqlite3.Row, asyncpg.Record, a dict)."""

    def __getitem__(self, column: str, /) -> Any: ...


def intent(row: Row, time: Time) -> Intent:
    """An intent from its row."""
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
        next_attempt_at=time(row["next_attempt_at"]),
        not_before=time(row["not_before"]),
        expires_at=time(row["expires_at"]),
        lease_owner=row["lease_owner"],
        lease_expires_at=time(row["lease_expires_at"]),
        fence=row["fence"],
        created_at=time(row["created_at"]),
        updated_at=time(row["updated_at"]),
        last_error=row["last_error"],
        approved_digest=row["approved_digest"],
        approval_expires_at=time(row["approval_expires_at"]),
        approved_by=row["approved_by"],
        ordering_key=row["ordering_key"],
    )


def attempt(row: Row, time: Time) -> Attempt:
    """An attempt from its row."""
    return Attempt(
        attempt_id=row["attempt_id"],
        number=row["number"],
        fence=row["fence"],
        worker=row["worker"],
        started_at=time(row["started_at"]),
        finished_at=time(row["finished_at"]),
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
    return Event(
        kind=row["kind"],
        at=time(row["at"]),
        actor=row["actor"],
        reason=row["reason"],
        data=json.loads(row["data"]),
    )


def destination(row: Row, time: Time, keyring: Keyring | None) -> Destination:
    """A destination from its row (flags may be stored as integers or booleans), its secrets
    opened with ``keyring``. Raises SecretsKeyError when they do not open."""
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
        created_at=time(row["created_at"]),
        updated_at=time(row["updated_at"]),
        reconcile=bool(row["reconcile"]),
        ordering=Ordering(row["ordering"]),
        ordering_on_dead=OnDead(row["ordering_on_dead"]),
    )


def token(row: Row, time: Time) -> TokenInfo:
    """A token's stored facts from its row."""
    return TokenInfo(
        id=row["id"],
        role=Role(row["role"]),
        scopes=tuple(json.loads(row["scopes"])),
        label=row["label"],
        created_at=time(row["created_at"]),
        revoked_at=time(row["revoked_at"]),
    )


def grant(row: Row, time: Time) -> Grant:
    """A grant from its row."""
    return Grant(
        id=row["id"],
        scope=row["scope"],
        destination=row["destination"],
        revision=row["revision"],
        expires_at=time(row["expires_at"]),
        note=row["note"],
        created_at=time(row["created_at"]),
        updated_at=time(row["updated_at"]),
    )
