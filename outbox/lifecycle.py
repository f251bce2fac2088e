"""The lifecycle of an intent: its statuses, what each means, and the one table of legal moves
between them (``MOVES``), from which the README's "Intent lifecycle" section is generated.

``outbox.model`` re-exports every name here: the records and their changes are written in
terms of this table, and callers reach both there.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass


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

@dataclass(frozen=True, slots=True)
class Move:
    """One named move of the lifecycle: where it starts and ends, who makes it, and which
    intent columns it writes. Each store runs it as one named SQL block over a batch (its
    ``name`` names the block), so a move is spelled once here and once per dialect, never
    assembled from a column dictionary at run time."""

    name: str
    sources: frozenset[Status]
    targets: frozenset[Status]
    who: str
    #: Intent columns it sets from the change, besides ``status`` and ``updated_at``.
    sets: tuple[str, ...] = ()
    #: Intent columns it sets to null.
    clears: tuple[str, ...] = ()
    #: Whether the move is fenced: made for the lease holder at its fence (a stale fence's change is
    #: refused, never applied); ``start`` also needs the lease unexpired.
    fenced: bool = False


def _move(name: str, sources: str, targets: str, who: str, *, sets: tuple[str, ...] = (),
          clears: tuple[str, ...] = (), fenced: bool = False) -> Move:
    return Move(name, frozenset(Status(s) for s in sources.split()), frozenset(Status(s) for s in targets.split()),
                who, sets, clears, fenced)


_LEASE = ("lease_owner", "lease_expires_at")

#: Every move an intent may make, by name. Nothing else changes an intent's status.
MOVES: Mapping[str, Move] = {move.name: move for move in (
    _move("claim", "pending", "leased", "a worker's claim, bumping the fence",
          sets=(*_LEASE, "fence")),
    _move("start", "leased", "leased", "the worker, durably recording an attempt before its send (the intent "
          "row is not written: its attempt count is the attempts settled)", fenced=True),
    _move("settle", "leased", "delivered pending unknown revoked dead",
          "the worker, with an attempt's fate (delivered, a retry after backoff, unknown, revoked, dead)",
          sets=("last_error", "next_attempt_at", "attempts", "fence"), clears=_LEASE, fenced=True),
    _move("release", "leased", "pending", "the worker, giving a lease back before any attempt started",
          sets=("next_attempt_at",), clears=_LEASE, fenced=True),
    _move("hold", "leased", "held", "the worker, when the destination requires approval and no live approval "
          "covers this payload", sets=("last_error",), clears=_LEASE, fenced=True),
    _move("recover", "leased", "pending", "the sweeper, giving back an expired lease whose holder started no "
          "attempt (an attempt in flight is settled instead, at a raised fence)", sets=("next_attempt_at", "fence"),
          clears=_LEASE),
    _move("replay", "dead revoked unknown", "pending", "an operator's replay, with a fresh budget of attempts",
          sets=("next_attempt_at", "max_attempts", "replayed_after"), clears=("last_error",)),
    _move("resolve", "unknown", "delivered pending dead", "an operator's resolve as delivered, retry or dead",
          sets=("next_attempt_at", "max_attempts", "replayed_after")),
    _move("cancel", "pending held revoked dead", "cancelled",
          "an operator's cancel (of a dead letter too: under ordering this lets its key go on)"),
    _move("approve", "held", "pending", "an operator's approval of the payload digest",
          sets=("approved_digest", "approval_expires_at", "approved_by", "next_attempt_at")),
    _move("reject", "held", "cancelled", "an operator's reject"),
)}

#: The statuses each status may move to, from ``MOVES`` (a move that stays put is not a change
#: of status).
TRANSITIONS: Mapping[Status, frozenset[Status]] = {
    status: frozenset(new for move in MOVES.values() if status in move.sources
                      for new in move.targets if new is not status)
    for status in Status
}

TERMINAL: frozenset[Status] = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)
#: Statuses a harness waits for: the outcome is known, or known to be unknown.
SETTLED: frozenset[Status] = frozenset(
    {Status.DELIVERED, Status.DEAD, Status.REVOKED, Status.UNKNOWN, Status.CANCELLED}
)
#: Statuses in which an intent still waits for something to happen to it.
OPEN: frozenset[Status] = frozenset({Status.PENDING, Status.LEASED, Status.HELD, Status.UNKNOWN})
#: Statuses in which an intent stopped undelivered and stays until an operator acts: under ordering, the later
#: intents of its key wait for it while its destination blocks on them (``ordering_on_dead``).
STOPPED: frozenset[Status] = frozenset({Status.DEAD, Status.REVOKED})
#: Statuses an operator may replay from: nothing was delivered, or nothing is known to have been.
REPLAYABLE: frozenset[Status] = frozenset({Status.DEAD, Status.REVOKED, Status.UNKNOWN})


def lifecycle_table() -> str:
    """The README's "Intent lifecycle" section (below its heading), rendered from ``MEANING``,
    ``INITIAL``, ``TERMINAL`` and ``MOVES``: paste it there when they change."""

    def code(status: Status) -> str:
        return f"`{status.value}`"

    lines = ["<!-- generated by outbox.model.lifecycle_table(): edit MEANING and MOVES there, not here -->", "",
             "| status | meaning |", "|---|---|"]
    lines += [f"| {code(s)} | {MEANING[s]}{' (terminal)' if s in TERMINAL else ''} |" for s in Status]
    lines += ["", f"An intent starts {' or '.join(code(s) for s in Status if s in INITIAL)}. "
              "The moves it may make, each one named block of SQL per store (on PostgreSQL a worker's "
              "settle, start and claim are the parts of one, `cycle`):", "",
              "| move | from | to | who |", "|---|---|---|---|"]
    lines += [f"| `{m.name}` | {', '.join(code(s) for s in Status if s in m.sources)} | "
              f"{', '.join(code(s) for s in Status if s in m.targets)} | {m.who} |" for m in MOVES.values()]
    lines += ["", "They are one table, `outbox.model.MOVES`; any other status change is an",
              "`IllegalTransition` error and writes nothing."]
    return "\n".join(lines) + "\n"
