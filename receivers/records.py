"""Idempotency records and the one decision table every record store applies.

A store's job is only to read a record and write the decided one back atomically; what a claim
or a probe *means* is decided here, once, for every backend.

Fences (``Outbox-Fence``, 0 to 10**18-1) follow one rule, so that a fence far above anything the
sender issued cannot lock a key out for ever:

a. A fence only stops a handler from *running*. A completed request is replayed to a request
   with the same fingerprint whatever its fence (another fingerprint is still a mismatch), and a
   request still running under a valid lease is answered busy whatever its fence.
b. Only a claim (a request let through to run the handler) or a reconcile probe raises the key's
   minimum fence; a replay, a busy answer, a mismatch or a stale-fence refusal writes nothing.
c. The minimum fence is a field of the key's record, so it lives exactly as long as the record
   (``expires_at``, the receiver's retention): a probe or a release never extends a record's
   retention, and once it has expired the key reads as absent, fence and all.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple, Protocol, TypeVar

X = TypeVar("X")


class StoreUnavailable(Exception):
    """The record store cannot be reached or used right now (locked, full, down); retry later."""


class State(str, enum.Enum):
    """Where a key's request is."""

    ABSENT = "absent"  # nothing runs or ran (the record only keeps the highest fence seen)
    IN_PROGRESS = "in_progress"  # a handler holds it under a lease
    COMPLETED = "completed"  # finished; its response is replayed


class StoredResponse(NamedTuple):
    """What a completed request answered; ``body`` None when it was streamed or too large (a named
    tuple, as ``Record``: the Kafka consumer stores one per record)."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes | None


class Record(NamedTuple):
    """A key's record (a named tuple: a batch builds several per Kafka record, and a tuple is the
    cheapest immutable value Python builds)."""

    identity: str
    fingerprint: str | None
    state: State
    epoch: int
    min_fence: int
    lease_expires_at: datetime | None
    expires_at: datetime
    response: StoredResponse | None = None


# -- what a claim can find -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Claimed:
    """Run the handler; fence its effects with ``epoch``."""

    epoch: int


@dataclass(frozen=True, slots=True)
class Mismatch:
    """The key was used for another request (422)."""


@dataclass(frozen=True, slots=True)
class Busy:
    """Another request with this key is running (409, retry after ``retry_after`` seconds)."""

    retry_after: float


@dataclass(frozen=True, slots=True)
class Replay:
    """The request completed; answer what it answered."""

    response: StoredResponse


@dataclass(frozen=True, slots=True)
class StaleFence:
    """The sender's fence is lower than one already seen for this key (409, handler not run)."""

    min_fence: int


ClaimResult = Claimed | Mismatch | Busy | Replay | StaleFence

#: A fresh key's claim, by far the most common answer: made once, since it is immutable.
_FIRST_CLAIM = Claimed(1)


def claimed(epoch: int) -> Claimed:
    """The claim of ``epoch`` (the first one shared, not made per record of a batch)."""
    return _FIRST_CLAIM if epoch == 1 else Claimed(epoch)


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """A reconcile probe's answer: the state and, if completed, the stored response."""

    state: State
    fence: int
    response: StoredResponse | None = None


def live(record: Record | None, now: datetime) -> Record | None:
    """The record, or None when there is none or its retention ran out (expired reads as absent)."""
    return record if record is not None and now < record.expires_at else None


def decide_claim(
    found: Record | None, identity: str, fingerprint: str, *, fence: int | None, now: datetime,
    lease_until: datetime, expires_at: datetime,
) -> tuple[ClaimResult, Record | None]:
    """What a claim finds, and the record to write (None: leave it as it is).

    The fence is consulted only when the handler would run (rule a in the module docstring): a
    completed request replays and a running one is busy whatever the fence, and neither raises it.
    """
    record = None if found is None else live(found, now)  # a fresh key, the usual claim, has nothing to read
    if record is not None and record.state is not State.ABSENT:
        if record.fingerprint != fingerprint:
            return Mismatch(), None
        if record.state is State.COMPLETED:
            assert record.response is not None
            return Replay(record.response), None
        assert record.lease_expires_at is not None
        if now < record.lease_expires_at:
            return Busy(max(1.0, (record.lease_expires_at - now).total_seconds())), None
    min_fence = record.min_fence if record else 0
    if fence is not None and fence < min_fence:
        return StaleFence(min_fence), None
    epoch = (found.epoch if found else 0) + 1  # a takeover or a fresh claim: always a new epoch
    return claimed(epoch), Record(identity, fingerprint, State.IN_PROGRESS, epoch, max(min_fence, fence or 0),
                                  lease_until, expires_at)


def decide_complete(
    found: Record | None, epoch: int, response: StoredResponse, expires_at: datetime
) -> Record | None:
    """The completed record, or None if ``epoch`` no longer holds it (a stale owner)."""
    if found is None or found.state is not State.IN_PROGRESS or found.epoch != epoch:
        return None
    return Record(found.identity, found.fingerprint, State.COMPLETED, epoch, found.min_fence, None, expires_at,
                  response)


def decide_release(found: Record | None, epoch: int) -> Record | None:
    """The released record (the next request runs again), or None for a stale owner."""
    if found is None or found.state is not State.IN_PROGRESS or found.epoch != epoch:
        return None
    return Record(found.identity, None, State.ABSENT, epoch, found.min_fence, None, found.expires_at)


def decide_probe(
    found: Record | None, identity: str, fence: int, *, now: datetime, expires_at: datetime
) -> tuple[ProbeResult, Record]:
    """A reconcile probe: raise the key's fence, then say what happened to it.

    A request still running under a valid lease is ``in_progress``. One whose lease ran out is
    taken over (its epoch moves on, so its late completion is refused) and reported ``absent``:
    the old request can no longer take effect through this record. The record keeps its
    ``expires_at`` (a probe never extends retention); only a key without a live record gets a
    new one, expiring at ``expires_at``.
    """
    record = live(found, now)
    raised = max(fence, record.min_fence if record else 0)
    if record is not None and record.state is State.COMPLETED:
        return ProbeResult(State.COMPLETED, raised, record.response), record._replace(min_fence=raised)
    if (record is not None and record.state is State.IN_PROGRESS and record.lease_expires_at is not None
            and now < record.lease_expires_at):
        return ProbeResult(State.IN_PROGRESS, raised), record._replace(min_fence=raised)
    epoch = (found.epoch if found else 0) + (1 if record is not None else 0)
    absent = Record(identity, None, State.ABSENT, epoch, raised, None,
                    record.expires_at if record else expires_at)
    return ProbeResult(State.ABSENT, raised), absent


class ClaimRequest(NamedTuple):
    """One claim of a batch (``RecordStore.claim_many``), one per Kafka record (a named tuple, as
    ``Record``)."""

    identity: str
    fingerprint: str
    fence: int | None


def distinct_runs(items: Sequence[X], identity: Callable[[X], str]) -> list[Sequence[X]]:
    """``items`` cut, in order, into runs that name each identity once: a batch statement decides
    each row once, so a key named again goes to the next run and sees what the first one wrote."""
    keys = list(map(identity, items))
    if len(set(keys)) == len(keys):  # the usual batch (a consumer's round names each key once): one run
        return [items] if items else []
    runs: list[Sequence[X]] = []
    seen: set[str] = set()
    start = 0
    for n, key in enumerate(keys):
        if key in seen:
            runs.append(items[start:n])
            seen.clear()
            start = n
        seen.add(key)
    if start < len(items):
        runs.append(items[start:])
    return runs


def refusal(found: Record | None, request: ClaimRequest, *, now: datetime, lease_until: datetime,
            expires_at: datetime) -> ClaimResult:
    """Why a batch claim statement left ``request`` unclaimed, from the record as it judged it:
    the statement's SQL spells ``decide_claim``'s rules, and a disagreement is a bug, not an answer."""
    result, _ = decide_claim(found, request.identity, request.fingerprint, fence=request.fence, now=now,
                             lease_until=lease_until, expires_at=expires_at)
    if isinstance(result, Claimed):
        raise RuntimeError(f"the batch claim refused {request.identity!r}, which decide_claim would claim")
    return result


class RecordStore(Protocol):
    """Where records live. Every method is atomic; ``tests/receivers`` holds the conformance suite."""

    async def open(self) -> None:
        """Connect (and create the table if needed)."""
        ...

    async def close(self) -> None:
        """Disconnect."""
        ...

    async def claim(self, identity: str, fingerprint: str, *, fence: int | None, now: datetime,
                    lease_until: datetime, expires_at: datetime) -> ClaimResult:
        """Apply ``decide_claim`` atomically. Raises StoreUnavailable."""
        ...

    async def complete(self, identity: str, epoch: int, response: StoredResponse, *,
                       expires_at: datetime) -> bool:
        """Apply ``decide_complete``; False if the epoch no longer holds the record."""
        ...

    async def release(self, identity: str, epoch: int) -> bool:
        """Apply ``decide_release``; False if the epoch no longer holds the record."""
        ...

    async def claim_many(self, requests: Sequence[ClaimRequest], *, now: datetime, lease_until: datetime,
                         expires_at: datetime) -> list[ClaimResult]:
        """``claim`` each, in order, in one atomic step: one transaction of a constant number of
        statements (one per run of distinct identities), so a batch of Kafka records costs one
        durable write, not one each. Raises StoreUnavailable."""
        ...

    async def complete_many(self, done: Sequence[tuple[str, int, StoredResponse]], *,
                            expires_at: datetime) -> list[bool]:
        """``complete`` each ``(identity, epoch, response)`` in one atomic step, as ``claim_many``."""
        ...

    async def complete_and_claim(self, done: Sequence[tuple[str, int, StoredResponse]],
                                 requests: Sequence[ClaimRequest], *, now: datetime, lease_until: datetime,
                                 expires_at: datetime) -> tuple[list[bool], list[ClaimResult]]:
        """``complete_many(done)`` then ``claim_many(requests)``, both expiring at ``expires_at``, in
        one atomic step: the Kafka consumer stores a batch's completions with the next one's claims
        (a key completed here and claimed again replays)."""
        ...

    async def release_many(self, held: Sequence[tuple[str, int]]) -> list[bool]:
        """``release`` each ``(identity, epoch)`` in one atomic step, as ``claim_many``."""
        ...

    async def probe(self, identity: str, fence: int, *, now: datetime, expires_at: datetime) -> ProbeResult:
        """Apply ``decide_probe`` atomically."""
        ...

    async def get(self, identity: str) -> Record | None:
        """The stored record as it is (expired or not), for inspection."""
        ...

    async def purge(self, now: datetime) -> int:
        """Delete records whose retention ran out; returns how many."""
        ...

