"""The outbox's records: intents, their attempts and events, and the one table of legal moves.

An intent's ``status`` is only the scheduling state; what each attempt did (was it submitted,
what came back) lives on the attempt, so a status never hides a fact.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .errors import IllegalTransition
from .ids import intent_key


class Status(str, enum.Enum):
    """Where an intent is in its lifecycle (DESIGN.md section 3)."""

    PENDING = "pending"  # waiting for next_attempt_at; a worker leases it
    LEASED = "leased"  # a worker holds it under lease_owner / lease_expires_at / fence
    HELD = "held"  # waits for an operator to approve this exact payload digest
    DELIVERED = "delivered"  # the receiver acknowledged the effect (terminal)
    UNKNOWN = "unknown"  # an attempt may have taken effect; nobody may retry blindly
    REVOKED = "revoked"  # authority was denied at send time; nothing was sent
    DEAD = "dead"  # dead-lettered: exhausted, rejected, conflicting or expired
    CANCELLED = "cancelled"  # withdrawn by an operator before delivery (terminal)


#: The statuses an intent may be created in.
INITIAL: frozenset[Status] = frozenset({Status.PENDING, Status.HELD})

#: Every legal status change, and who makes it. Nothing else may move an intent.
TRANSITIONS: Mapping[Status, frozenset[Status]] = {
    # a worker leases it; an operator cancels it; the sweeper dead-letters it once expired
    Status.PENDING: frozenset({Status.LEASED, Status.CANCELLED, Status.DEAD}),
    # the worker records the outcome, or the sweeper recovers an expired lease
    Status.LEASED: frozenset(
        {
            Status.DELIVERED,
            Status.PENDING,
            Status.UNKNOWN,
            Status.REVOKED,
            Status.DEAD,
            Status.HELD,
        }
    ),
    # an operator approves, rejects or cancels
    Status.HELD: frozenset({Status.PENDING, Status.DEAD, Status.CANCELLED}),
    # reconcile or an operator's resolve: delivered, retry or dead
    Status.UNKNOWN: frozenset({Status.DELIVERED, Status.PENDING, Status.DEAD}),
    # an operator replays after a re-grant
    Status.REVOKED: frozenset({Status.PENDING, Status.CANCELLED}),
    # an operator replays
    Status.DEAD: frozenset({Status.PENDING}),
    Status.DELIVERED: frozenset(),
    Status.CANCELLED: frozenset(),
}

TERMINAL: frozenset[Status] = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)
#: Statuses a harness waits for: the outcome is known, or known to be unknown.
SETTLED: frozenset[Status] = frozenset(
    {Status.DELIVERED, Status.DEAD, Status.REVOKED, Status.UNKNOWN, Status.CANCELLED}
)
#: Statuses in which an intent still waits for something to happen to it.
OPEN: frozenset[Status] = frozenset({Status.PENDING, Status.LEASED, Status.HELD, Status.UNKNOWN})


def check_transition(current: Status, new: Status) -> None:
    """Raise IllegalTransition unless ``current -> new`` is in TRANSITIONS."""
    if new not in TRANSITIONS[current]:
        raise IllegalTransition(f"an intent cannot go from {current.value!r} to {new.value!r}")


class Submission(str, enum.Enum):
    """Whether an attempt's request reached the receiver, as far as the control path can prove."""

    NOT_SUBMITTED = "not_submitted"  # provably never written (refused, DNS, TLS, local refusal)
    SUBMITTED = "submitted"  # written and answered
    MAYBE_SUBMITTED = "maybe_submitted"  # possibly written: timeout, reset, lost worker


class Outcome(str, enum.Enum):
    """What an attempt's answer means for the intent."""

    DELIVERED = "delivered"  # the receiver acknowledged the effect
    RETRYABLE = "retryable"  # try again after backoff
    REJECTED = "rejected"  # permanent refusal: dead letter
    CONFLICT = "conflict"  # the receiver saw this key with another payload: dead letter
    UNKNOWN = "unknown"  # it may have taken effect; the recovery policy decides
    DENIED = "denied"  # authority was refused before sending


class OnUnknown(str, enum.Enum):
    """A destination's policy for an attempt whose outcome is unknown."""

    DECLARED = "declared"  # retry only inside the receiver's declared idempotency retention
    NEVER = "never"  # never retry automatically; reconcile or report unknown
    ALWAYS = "always"  # retry regardless; the operator accepted possible duplicates


class Channel(str, enum.Enum):
    """How an intent is delivered."""

    WEBHOOK = "webhook"


class Role(str, enum.Enum):
    """What an API token may do."""

    PRODUCER = "producer"  # enqueue and read intents in its own scopes
    OPERATOR = "operator"  # read everything, act on intents (replay, resolve, cancel, approve)
    ADMIN = "admin"  # everything, including destinations, grants and tokens


@dataclass(frozen=True, slots=True)
class Intent:
    """One business operation to be made effective at a destination."""

    seq: int
    action_id: str
    scope: str
    destination: str
    channel: Channel
    payload_json: str  # RFC 8785 canonical JSON: the exact bytes a receiver gets
    payload_digest: str
    status: Status
    attempts: int
    max_attempts: int
    next_attempt_at: datetime
    not_before: datetime | None
    expires_at: datetime | None
    lease_owner: str | None
    lease_expires_at: datetime | None
    fence: int
    created_at: datetime
    updated_at: datetime
    last_error: str | None
    approved_digest: str | None = None  # the payload digest an operator approved
    approval_expires_at: datetime | None = None
    approved_by: str | None = None

    @property
    def payload(self) -> Any:
        """The payload as Python values."""
        return json.loads(self.payload_json)

    @property
    def key(self) -> str:
        """``scope/action_id``: unique across scopes, and the key receivers deduplicate on."""
        return intent_key(self.scope, self.action_id)


@dataclass(frozen=True, slots=True)
class NewIntent:
    """An intent as the store is asked to create it (already validated and digested)."""

    action_id: str
    scope: str
    destination: str
    payload_json: str
    payload_digest: str
    max_attempts: int
    next_attempt_at: datetime
    not_before: datetime | None
    expires_at: datetime | None
    created_at: datetime

    @property
    def key(self) -> str:
        """``scope/action_id`` (see ``Intent.key``)."""
        return intent_key(self.scope, self.action_id)


@dataclass(frozen=True, slots=True)
class Attempt:
    """One try at submitting an intent, with the facts the control path could establish."""

    attempt_id: str
    number: int
    fence: int
    worker: str
    started_at: datetime
    finished_at: datetime | None
    submission: Submission | None
    outcome: Outcome | None
    status_code: int | None
    reply: str | None
    external_id: str | None
    error: str | None
    duration_ms: float | None


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of an intent's append-only history."""

    kind: str
    at: datetime
    actor: str
    reason: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Enqueued:
    """The result of an enqueue: the stored intent, and whether this call created it."""

    intent: Intent
    created: bool
