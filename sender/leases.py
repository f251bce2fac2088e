"""The leases a worker holds: what it knows of each, and where each one is (``Leases``).

A lease is held from its claim until its last change is applied: it waits for its checks (whose
reads may be fetching meanwhile), its attempt's start goes into an apply, then its attempt is
sent. ``Leases`` keeps that bookkeeping for the pipeline, the worker and the heartbeat (which
keeps them confirmed, ``sender.heartbeat``), and says how much room it leaves: send slots for
the next starts, lease slots for the next claim.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from outbox import Attempt, Destination, Intent

from .authority import Decision

#: Leases a worker holds per send slot: a lease lives through three applies (its claim, its
#: attempt's start, its outcome) around a send that is often shorter than one of them, so while
#: some sends run, the next intents are being claimed and started and finished ones' outcomes
#: committed, and recording never leaves a slot idle.
LEASES_PER_SLOT = 4


class Unread:
    """A destination not read yet (the cache had none fresh enough)."""


UNREAD = Unread()


@dataclass(eq=False, slots=True)
class Lease:
    """An intent this worker holds, from its claim until its last change is applied."""

    intent: Intent
    confirmed: datetime  # until when the store last confirmed the lease (claim or renewal)
    picked: bool = False  # taken to be sent, its lease found confirmed then
    destination: Destination | Unread | None = UNREAD  # read for its checks by a fetch
    decision: Decision | None = None  # the authority's answer a fetch got, used once
    not_before: float = 0.0  # (monotonic) its checks wait until then: the store failed a read
    final: bool = False  # its last change is buffered, or it was let go


def log_fields(intent: Intent, attempt: Attempt | None, worker: str) -> dict[str, object]:
    """The identities a log record about ``intent`` carries (see outbox.logs)."""
    return {"action_id": intent.action_id, "attempt_id": attempt.attempt_id if attempt else None,
            "fence": intent.fence, "worker": worker, "destination": intent.destination}


class Leases:
    """Every lease a worker holds, in claim order, and where each one is: waiting for its checks,
    fetching what they read, starting (in an apply under way), sending; and the room they leave.
    ``freed`` is called whenever a lease or a slot comes free, so the pipeline looks again."""

    def __init__(self, concurrency: int, freed: Callable[[], None]) -> None:
        self.slots = concurrency  # send slots
        self.most = LEASES_PER_SLOT * concurrency  # lease slots
        self._freed = freed
        self._held: dict[str, Lease] = {}  # by key, in claim order
        self._waiting: deque[Lease] = deque()  # leased, not yet started
        self._fetching: set[asyncio.Task[None]] = set()  # the reads of leases' checks
        self._sending: dict[asyncio.Task[None], int] = {}  # the send tasks, each with the attempts it sends
        self._sends = 0  # the attempts being sent (a batch's each)
        self._starting = 0  # attempt starts in the applies under way (their send slots are taken)
        self._claiming = 0  # intents the claims under way may lease
        self._flushing: set[str] = set()  # keys whose changes are in an apply under way

    def __len__(self) -> int:
        """How many leases are held."""
        return len(self._held)

    @property
    def sends(self) -> int:
        """The attempts being sent."""
        return self._sends

    def idle(self) -> bool:
        """Whether nothing is held, sent or fetched."""
        return not (self._held or self._sending or self._fetching)

    def room(self) -> int:
        """Send slots free: what neither a send, a fetch nor a start under way takes."""
        return self.slots - self._sends - len(self._fetching) - self._starting

    def free(self) -> int:
        """Lease slots free: what neither a lease held nor a claim under way takes."""
        return self.most - len(self._held) - self._claiming

    def next_due(self) -> float | None:
        """When (monotonic) the next waiting lease's checks may run, or None when none waits."""
        return min((lease.not_before for lease in self._waiting), default=None)

    def hold(self, intent: Intent, until: datetime) -> Lease:
        """Hold the lease a claim gave on ``intent`` (confirmed ``until``); it waits to be started."""
        lease = self._held[intent.key] = Lease(intent, until)
        self._waiting.append(lease)
        return lease

    def pick(self, now: float, take: Callable[[Lease], bool]) -> None:
        """Hand ``take`` the waiting leases whose checks may run at ``now`` (monotonic), oldest
        first, while send slots are free; ``take`` says whether the lease took one. The leases
        whose checks must wait keep their places."""
        room = self.room()
        later: list[Lease] = []
        try:
            while self._waiting and room > 0:
                lease = self._waiting.popleft()
                if lease.final:
                    continue
                if lease.not_before > now:
                    later.append(lease)
                    continue
                if take(lease):
                    room -= 1
        finally:  # (a ``take`` that raised leaves none set aside out of line)
            self._waiting.extendleft(reversed(later))

    def wait_again(self, lease: Lease) -> None:
        """Put a lease whose checks' reads were fetched back first in line (unless it is final)."""
        if not lease.final:
            self._waiting.appendleft(lease)

    def forget(self, lease: Lease) -> None:
        """Stop holding ``lease`` (its last change applied or refused, or nothing to write)."""
        lease.final = True
        if self._held.get(lease.intent.key) is lease:
            del self._held[lease.intent.key]
        self._freed()

    def let_waiting_go(self) -> list[Lease]:
        """Cut the checks' reads and take every lease not started off the queue (stopping): the
        ones returned are to be given back (a cut read's lease comes back, to be given back then)."""
        for task in self._fetching:
            task.cancel()
        waiting = [lease for lease in self._waiting if not lease.final]
        self._waiting.clear()
        return waiting

    @contextmanager
    def applying(self, keys: set[str], *, claims: int, starts: int) -> Iterator[None]:
        """While an apply is under way: the changes of ``keys`` in it (not renewed meanwhile), the
        lease slots its claim of ``claims`` may take, the send slots its ``starts`` take."""
        self._flushing |= keys
        self._claiming += claims
        self._starting += starts
        try:
            yield
        finally:
            self._flushing -= keys
            self._claiming -= claims
            self._starting -= starts

    def fetching(self, task: asyncio.Task[None]) -> None:
        """Count ``task``, the reads of a lease's checks, as taking a send slot until it is done."""
        self._fetching.add(task)
        task.add_done_callback(self._fetched)

    def sending(self, task: asyncio.Task[None], attempts: int) -> None:
        """Count ``task`` as sending ``attempts`` (each takes a send slot) until it is done."""
        self._sending[task] = attempts
        self._sends += attempts
        task.add_done_callback(self._sent)

    def fetches(self) -> list[asyncio.Task[None]]:
        """The checks' reads under way."""
        return list(self._fetching)

    def cut_sends(self) -> list[asyncio.Task[None]]:
        """Cancel the sends under way, and return their tasks (to await)."""
        for task in self._sending:
            task.cancel()
        return list(self._sending)

    def renewable(self) -> list[tuple[str, int]]:
        """The keys and fences of the leases to renew: those held whose changes are in no apply."""
        return [(key, lease.intent.fence) for key, lease in self._held.items() if key not in self._flushing]

    def renewed(self, renewals: list[tuple[str, int]], until: datetime) -> None:
        """The store confirmed these leases (key, fence) ``until``: those still held with that fence."""
        for key, fence in renewals:
            if (lease := self._held.get(key)) is not None and lease.intent.fence == fence:
                lease.confirmed = until

    def holds(self, key: str, fence: int) -> bool:
        """Whether the lease on ``key`` with ``fence`` is held, its changes in no apply under way."""
        lease = self._held.get(key)
        return lease is not None and lease.intent.fence == fence and key not in self._flushing

    def _fetched(self, task: asyncio.Task[None]) -> None:
        self._fetching.discard(task)
        self._freed()

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._sends -= self._sending.pop(task, 0)
        self._freed()
