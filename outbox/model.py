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
    """Where an intent is in its lifecycle: what each status means is ``MEANING``, the moves
    between them ``MOVES`` (the README's "Intent lifecycle" is generated from both)."""

    PENDING = "pending"
    LEASED = "leased"
    HELD = "held"
    DELIVERED = "delivered"
    UNKNOWN = "unknown"
    REVOKED = "revoked"
    DEAD = "dead"
    CANCELLED = "cancelled"


#: What each status means.
MEANING: Mapping[Status, str] = {
    Status.PENDING: "waiting for `next_attempt_at`, when a worker leases it",
    Status.LEASED: "a worker holds it (`lease_owner`, `lease_expires_at`, `fence`)",
    Status.HELD: "waits for an operator's approval of this exact payload digest",
    Status.DELIVERED: "the receiver acknowledged the effect",
    Status.UNKNOWN: "an attempt may have taken effect; nobody may retry it blindly",
    Status.REVOKED: "authority was denied at send time; nothing was sent",
    Status.DEAD: "dead-lettered: rejected, conflicting, out of attempts or expired",
    Status.CANCELLED: "withdrawn by an operator before delivery",
}

#: The statuses an intent may be created in (``held`` when its destination requires approval).
INITIAL: frozenset[Status] = frozenset({Status.PENDING, Status.HELD})

_UNUSED = "allowed, though nothing makes this move today"

#: Every legal status change, and who makes it. Nothing else may move an intent.
MOVES: Mapping[tuple[Status, Status], str] = {
    (Status.PENDING, Status.LEASED): "a worker's claim",
    (Status.PENDING, Status.CANCELLED): "an operator's cancel",
    (Status.PENDING, Status.DEAD): _UNUSED,
    (Status.LEASED, Status.DELIVERED): "the worker, on the receiver's acknowledgement; the worker or the sweeper, "
                                       "when a reconcile probe finds it completed",
    (Status.LEASED, Status.PENDING): "the worker, retrying after backoff or giving the lease back unsent; the "
                                     "sweeper, after the lease expired",
    (Status.LEASED, Status.UNKNOWN): "the worker or the sweeper, when an attempt may have taken effect and no "
                                     "blind retry is allowed",
    (Status.LEASED, Status.REVOKED): "the worker, when authority is denied right before the send",
    (Status.LEASED, Status.DEAD): "the worker: rejected, conflicting, out of attempts or expired",
    (Status.LEASED, Status.HELD): "the worker, when the destination requires approval and no live approval "
                                  "covers this payload",
    (Status.HELD, Status.PENDING): "an operator's approval",
    (Status.HELD, Status.DEAD): _UNUSED,
    (Status.HELD, Status.CANCELLED): "an operator's reject or cancel",
    (Status.UNKNOWN, Status.DELIVERED): "an operator's resolve as delivered",
    (Status.UNKNOWN, Status.PENDING): "an operator's resolve as retry, or a replay",
    (Status.UNKNOWN, Status.DEAD): "an operator's resolve as dead",
    (Status.REVOKED, Status.PENDING): "an operator's replay (after a fresh authority check)",
    (Status.REVOKED, Status.CANCELLED): "an operator's cancel",
    (Status.DEAD, Status.PENDING): "an operator's replay",
    (Status.DEAD, Status.CANCELLED): "an operator's cancel (giving it up; under ordering this lets its key go on)",
}

#: The statuses each status may move to: ``MOVES`` without the who.
TRANSITIONS: Mapping[Status, frozenset[Status]] = {
    status: frozenset(new for old, new in MOVES if old is status) for status in Status
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


def lifecycle_table() -> str:
    """The README's "Intent lifecycle" section (below its heading), rendered from ``MEANING``,
    ``INITIAL``, ``TERMINAL`` and ``MOVES``: paste it there when they change."""

    def code(status: Status) -> str:
        return f"`{status.value}`"

    lines = ["<!-- generated by outbox.model.lifecycle_table(): edit MEANING and MOVES there, not here -->", "",
             "| status | meaning |", "|---|---|"]
    lines += [f"| {code(s)} | {MEANING[s]}{' (terminal)' if s in TERMINAL else ''} |" for s in Status]
    lines += ["", f"An intent starts {' or '.join(code(s) for s in Status if s in INITIAL)}. "
              "The moves it may make, and who makes each:", "",
              "| from | to | who |", "|---|---|---|"]
    lines += [f"| {code(old)} | {code(new)} | {MOVES[old, new]} |"
              for old in Status for new in Status if new in TRANSITIONS[old]]
    lines += ["", "They are one table, `outbox.model.TRANSITIONS`; any other status change is an",
              "`IllegalTransition` error and writes nothing."]
    return "\n".join(lines) + "\n"


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


class Ordering(str, enum.Enum):
    """Whether a destination delivers the intents of one ``ordering_key`` in enqueue order."""

    NONE = "none"  # keys are carried (a Kafka record's key) but intents are claimed in any order
    KEY = "key"  # an intent waits while an earlier one of its key is still open


class OnDead(str, enum.Enum):
    """What a dead (or revoked) intent means to the later intents of its key, under ordering."""

    BLOCK = "block"  # they wait until an operator replays or cancels it
    SKIP = "skip"  # they go on without it


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
    channel: str  # its destination's channel, as the channel registry names it
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
    #: Intents of one destination with the same key are delivered in enqueue order when the
    #: destination asks for it (``Ordering.KEY``); a Kafka record's key.
    ordering_key: str | None = None
    #: Which stored times no datetime can hold (each read as the nearest one that can), or None:
    #: the row was written by hand or before times were checked, and the sender sets it aside.
    unreadable: str | None = None

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
    ordering_key: str | None = None

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
    #: How far the attempt got, in its channel's words (an SMTP attempt's "rcpt", "message"),
    #: for channels that go through stages; None for the others and while in flight.
    stage: str | None = None


class EventKind(str, enum.Enum):
    """What an entry of an intent's history records; stores keep the plain value."""

    ENQUEUED = "enqueued"  # the library's enqueue, when it creates the intent
    LEASED = "leased"  # the store's claim (its SQL writes the value), when a worker leases the intent
    HELD = "held"  # the worker, when the destination requires approval and no live approval covers it
    AUTHORITY_CHECKED = "authority_checked"  # the worker, when authority denies the send or cannot answer
    ATTEMPT_STARTED = "attempt_started"  # the worker, durably before it sends
    ATTEMPT_FINISHED = "attempt_finished"  # the worker, with what its attempt came back with, or was cut short by
    RECONCILED = "reconciled"  # the worker or the sweeper, with the receiver's answer to the reconcile probe
    DELIVERED = "delivered"  # the worker or the sweeper, when the receiver has the effect (its Fate)
    SCHEDULED_RETRY = "scheduled_retry"  # the worker or the sweeper, when another attempt is due later (its Fate)
    DEAD_LETTERED = "dead_lettered"  # the worker, when the intent is rejected, conflicting, exhausted or expired
    UNKNOWN = "unknown"  # the worker or the sweeper, when an attempt may have taken effect and no retry is allowed
    REVOKED = "revoked"  # the worker, when authority denies the send (after authority_checked)
    RELEASED = "released"  # the worker, when it gives a lease back before any attempt started
    LEASE_EXPIRED = "lease_expired"  # the sweeper, when it recovers an intent whose lease expired
    REPLAYED = "replayed"  # an operator's replay of a dead, revoked or unknown intent
    RESOLVED = "resolved"  # an operator's resolve of an unknown intent
    CANCELLED = "cancelled"  # an operator's cancel
    APPROVED = "approved"  # an operator's approval of a held intent's payload digest
    REJECTED = "rejected"  # an operator's rejection of a held intent


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of an intent's append-only history. A store reads ``kind`` back as its plain
    string value; it becomes the EventKind here (an unknown value raises ValueError)."""

    kind: EventKind
    at: datetime
    actor: str
    reason: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if type(self.kind) is not EventKind:
            object.__setattr__(self, "kind", EventKind(self.kind))


@dataclass(frozen=True, slots=True)
class Enqueued:
    """The result of an enqueue: the stored intent, and whether this call created it."""

    intent: Intent
    created: bool
