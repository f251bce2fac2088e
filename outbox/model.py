"""The outbox's records: intents, their attempts and events, and the changes a store makes to
them (each one of the lifecycle's moves, ``outbox.lifecycle``, whose names are re-exported here).

An intent's ``status`` is only the scheduling state; what each attempt did (was it submitted,
what came back) lives on the attempt, so a status never hides a fact.

The records a delivery makes several of (its intent as claimed, two attempts, its events and
changes) are slotted dataclasses that are not frozen: a frozen one's ``__init__`` sets each field
through ``object.__setattr__``, several times slower, and nothing changes a record once made.
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
from .lifecycle import INITIAL as INITIAL
from .lifecycle import MEANING as MEANING
from .lifecycle import MOVES, Status
from .lifecycle import OPEN as OPEN
from .lifecycle import REPLAYABLE as REPLAYABLE
from .lifecycle import SETTLED as SETTLED
from .lifecycle import TERMINAL as TERMINAL
from .lifecycle import TRANSITIONS as TRANSITIONS
from .lifecycle import Move as Move
from .lifecycle import lifecycle_table as lifecycle_table


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


#: The longest an approval lasts (see ``timestamps.HEADROOM``).
MAX_APPROVAL_SECONDS = 30 * 86_400


class Resolution(str, enum.Enum):
    """How an operator settles an ``unknown`` intent."""

    DELIVERED = "delivered"  # evidence says it took effect
    RETRY = "retry"  # evidence says it did not: send again
    DEAD = "dead"  # give up on it


class Role(str, enum.Enum):
    """What an API token may do."""

    PRODUCER = "producer"  # enqueue and read intents in its own scopes
    OPERATOR = "operator"  # read everything, act on intents (replay, resolve, cancel, approve)
    ADMIN = "admin"  # everything, including destinations, grants and tokens
    TENANT = "tenant"  # one scope's own destinations, and its intents and events (the /v1/tenant routes)


@dataclass(slots=True)
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
    #: The attempts made before its last replay (or resolve to retry): a destination's retry
    #: schedule starts over after it, as ``max_attempts`` gives a fresh budget.
    replayed_after: int = 0
    #: Which stored times no datetime can hold (each read as the nearest one that can), or None:
    #: the row was written by hand or before times were checked, and the sender sets it aside.
    unreadable: str | None = None
    #: The published event this intent delivers (``outbox.events``; its scope is the intent's), or None.
    event_id: str | None = None
    #: The W3C trace context of its create span, as JSON (``outbox.tracing``), or None.
    trace_context: str | None = None

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
    event_id: str | None = None  # the event it delivers, if any
    trace_context: str | None = None  # its create span's W3C context, as JSON (``outbox.tracing``)
    #: The recorded event (its seq) whose stored payload this intent sends, rather than a copy of
    #: its own: set by a store as it makes an event's intents (``NewEvent.intent_for``).
    payload_event: int | None = None

    @property
    def key(self) -> str:
        """``scope/action_id`` (see ``Intent.key``)."""
        return intent_key(self.scope, self.action_id)


@dataclass(slots=True)
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


@dataclass(slots=True)
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
            self.kind = EventKind(self.kind)


@dataclass(frozen=True, slots=True)
class Enqueued:
    """The result of an enqueue: the stored intent, and whether this call created it."""

    intent: Intent
    created: bool


# -- changes: one typed value per move, as ``Store.apply`` takes them ------------------------------
#
# Each is its own dataclass, its fields in the order its callers pass them: they share only
# ``key`` and ``events``, which a common base would move ahead of every other field.


@dataclass(slots=True)
class Start:
    """Move ``start``: record ``attempt`` (unfinished) and its ``attempt_started`` event, durably
    before the send, if the intent is still leased at ``fence`` and its lease has not expired."""

    key: str
    fence: int
    attempt: Attempt
    event: Event
    move = "start"


@dataclass(slots=True)
class Settle:
    """Move ``settle``: a leased intent at ``fence`` takes its fate ``status``; the lease is
    cleared, ``attempt`` (finished) recorded when there is one, and ``events`` appended.
    ``attempts`` is the settled attempt's number; ``new_fence`` a fence raised past every earlier
    request (a reconcile probe's, the sweeper's)."""

    key: str
    fence: int
    status: Status
    events: tuple[Event, ...]
    last_error: str | None = None
    next_attempt_at: datetime | None = None
    attempts: int | None = None
    attempt: Attempt | None = None
    new_fence: int | None = None
    move = "settle"


@dataclass(slots=True)
class Release:
    """Move ``release``: give a lease at ``fence`` back unsent, due again at ``next_attempt_at``."""

    key: str
    fence: int
    next_attempt_at: datetime
    events: tuple[Event, ...]
    move = "release"


@dataclass(slots=True)
class Hold:
    """Move ``hold``: a leased intent at ``fence`` waits for an operator's approval."""

    key: str
    fence: int
    last_error: str
    events: tuple[Event, ...]
    move = "hold"


@dataclass(frozen=True, slots=True)
class Replay:
    """Move ``replay``: an intent the caller saw ``expected`` (dead, revoked, unknown) is due at
    ``next_attempt_at`` with ``max_attempts``."""

    key: str
    expected: Status
    next_attempt_at: datetime
    max_attempts: int
    events: tuple[Event, ...]
    move = "replay"


@dataclass(frozen=True, slots=True)
class Resolve:
    """Move ``resolve``: an unknown intent becomes ``status`` (delivered, pending, dead); a retry
    gets ``next_attempt_at`` and ``max_attempts``."""

    key: str
    status: Status
    events: tuple[Event, ...]
    next_attempt_at: datetime | None = None
    max_attempts: int | None = None
    move = "resolve"


@dataclass(frozen=True, slots=True)
class Cancel:
    """Move ``cancel``: an intent the caller saw ``expected`` is withdrawn."""

    key: str
    expected: Status
    events: tuple[Event, ...]
    move = "cancel"


@dataclass(frozen=True, slots=True)
class Approve:
    """Move ``approve``: a held intent's ``approved_digest`` is approved until
    ``approval_expires_at`` by ``approved_by``; it is due at ``next_attempt_at``."""

    key: str
    approved_digest: str
    approval_expires_at: datetime
    approved_by: str
    next_attempt_at: datetime
    events: tuple[Event, ...]
    move = "approve"


@dataclass(frozen=True, slots=True)
class Reject:
    """Move ``reject``: a held intent is cancelled, never sent."""

    key: str
    events: tuple[Event, ...]
    move = "reject"


#: A change the worker makes under its lease (answered None when applied).
WorkerChange = Start | Settle | Release | Hold
#: A change an operator makes (answered with the intent as it became).
OperatorChange = Replay | Resolve | Cancel | Approve | Reject
Change = WorkerChange | OperatorChange


def expected_status(change: Change) -> Status:
    """The one status ``change`` applies in: the caller's ``expected`` where it names one (its
    move starts in several), else its move's one source."""
    expected = getattr(change, "expected", None)
    if expected is not None:
        return expected
    (source,) = MOVES[change.move].sources
    return source


def target_status(change: Change) -> Status:
    """The status ``change`` moves its intent to."""
    status = getattr(change, "status", None)
    if status is not None:
        return status
    (target,) = MOVES[change.move].targets
    return target


def check_change(change: Change) -> None:
    """Refuse a change its move does not allow, before anything is written: raises
    IllegalTransition (a target or an expected status outside the move), ValueError (no event)."""
    move = MOVES[change.move]
    if target_status(change) not in move.targets:
        raise IllegalTransition(f"move {move.name!r} cannot end in {target_status(change).value!r}")
    if (status := expected_status(change)) not in move.sources:
        raise IllegalTransition(f"an intent cannot go from {status.value!r} to {target_status(change).value!r}")
    if not getattr(change, "events", None) and not isinstance(change, Start):
        raise ValueError("every change to an intent appends at least one event")
