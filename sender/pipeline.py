"""The cycle pipeline over ``Store.apply``, the heart of the delivery worker.

The worker runs in cycles, each one ``Store.apply`` (one transaction): the outcomes, releases
and holds buffered since the last cycle, the attempt starts of the leases whose checks just
passed, and a claim for the lease slots free. A start commits before its send, as ever, but
together with the others of its cycle, so a delivery costs a share of a transaction, not three.

A change is buffered (``_keep``) and taken by the next cycle, which runs once enough changes
wait (half the send slots, at most FLUSH_BATCH) or the oldest has waited FLUSH_SECONDS, or when
lease slots or send slots are free; up to CYCLES_IN_FLIGHT run at once. A cycle whose apply fails
puts its changes back, and the cycles pause, doubling from poll_seconds (``claim_pause``), until
the store answers.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from outbox import Attempt, Destination, Outbox, StoreUnavailable
from outbox.crash import crash_point
from outbox.flow import Held, Limit
from outbox.model import Change, Settle, Start
from outbox.store.protocol import Claim
from outbox.timestamps import later

from .leases import Lease, Leases, log_fields
from .outcomes import Entry, Outcomes, follow_up

log = logging.getLogger("outbox.sender")

#: Longest pause between claims while the database keeps failing (the pause doubles from
#: poll_seconds up to this).
MAX_CLAIM_BACKOFF_SECONDS = 30.0
#: Applies a worker has under way at once: while one waits on the database, the next gathers
#: the outcomes and starts that arrive meanwhile, as a second worker process would.
CYCLES_IN_FLIGHT = 2
#: Changes buffered that make a cycle run at once (otherwise within FLUSH_SECONDS).
FLUSH_BATCH = 100
#: Longest a finished send's outcome waits in the buffer for others to share its transaction.
FLUSH_SECONDS = 0.05


class Trouble(NamedTuple):
    """Why a worker's cycles have been failing, and since when (``/healthz`` says it)."""

    what: str  # the error, named: "StoreUnavailable: ..."
    since: datetime
    unreachable: bool  # the database did not answer (StoreUnavailable); else an error of another kind


@dataclass(slots=True)
class Ready:
    """A lease whose checks passed in this cycle, with the start that goes in its apply."""

    lease: Lease
    start: Start
    destination: Destination


class Pipeline(abc.ABC):
    """The cycles of one worker: each is one transaction holding the changes of the work that
    finished since the last one, the attempt starts of the leases ready to send now, and a
    claim for the lease slots free; the starts applied are then sent, each as a task. What is
    ready and how it is sent is the worker's (``_ready``, ``_send``, ``_launch``)."""

    def __init__(self, outbox: Outbox, worker: str, concurrency: int, lease: timedelta, outcomes: Outcomes) -> None:
        self.outbox = outbox
        self.store = outbox.store
        self.clock = outbox.clock
        self.id = worker
        self.concurrency = concurrency
        self.lease = lease
        self.outcomes = outcomes
        self._wake = asyncio.Event()
        self.leases = Leases(self.concurrency, self._wake.set)
        self._claim_batch = max(1, self.concurrency // 4)  # claim once a quarter of the leases are free
        self._flush_batch = min(FLUSH_BATCH, max(1, self.concurrency // 2))
        self._buffer: list[Entry] = []  # at most one per lease held, so bounded by the leases
        self._buffered_at = 0.0  # (monotonic) when the oldest change in the buffer came
        self._cycles: set[asyncio.Task[int]] = set()  # applies under way (at most CYCLES_IN_FLIGHT)
        self._claimable = True  # False once a claim came back short, until an enqueue or _claim_at
        self._claim_at = 0.0
        self._ticket = outbox.enqueued.ticket()
        self._failures = 0  # cycles in a row whose apply failed
        self._held_counts: dict[tuple[str, Limit], Any] = {}  # the held sends counter's children
        self._full: set[str] = set()  # destinations the last claim held back at max_in_flight
        self._retry_at = 0.0
        #: Why and since when this worker's cycles have been failing, or None while they succeed.
        self.trouble: Trouble | None = None
        self._stopping = asyncio.Event()
        self.stale_writes = 0  # fenced writes this worker had rejected (also logged)

    @abc.abstractmethod
    def _ready(self, now: datetime) -> list[Ready]:
        """The attempts to start in this cycle, at most one per free send slot."""

    @abc.abstractmethod
    async def _send(self, lease: Lease, destination: Destination, attempt: Attempt) -> None:
        """Send a started attempt and buffer its outcome (``_keep``) for the next cycle."""

    def stop(self) -> None:
        """Stop claiming; in-flight sends get ``drain_seconds`` to finish."""
        self._stopping.set()
        self._wake.set()

    async def run_once(self, limit: int | None = None) -> int:
        """Claim what is due now, deliver it, record the outcomes, and return how many were
        claimed (for tests and one-shot runs; the clock decides what is due)."""
        claimed = await self._cycle(limit or self.concurrency, start=False)
        await self._loop(claiming=False)
        return claimed

    async def _deliver(self) -> None:
        """Run the cycles until ``stop()``; then let the sends under way finish for up to
        drain_seconds, and cut and record what is left (graceful shutdown)."""
        cycles = asyncio.create_task(self._loop(claiming=True))
        try:
            stopped = asyncio.create_task(self._stopping.wait())
            await asyncio.wait({cycles, stopped}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if not cycles.done():
                drain = self.outbox.settings.drain_seconds
                if self.leases.sends:
                    log.info("draining %d in-flight sends for up to %.0fs", self.leases.sends, drain)
                await asyncio.wait({cycles}, timeout=drain)
        finally:
            self._stopping.set()
            await self._cut(cycles)
        if not cycles.cancelled() and (failure := cycles.exception()) is not None:
            raise failure

    async def _loop(self, *, claiming: bool) -> None:
        """Run cycles as they fall due, up to CYCLES_IN_FLIGHT at once (the next one's changes
        gather while an apply waits on the database): until stopped and nothing is held, or (not
        ``claiming``) until what is held now is done. Cut, it cuts the applies under way."""
        try:
            while True:
                self._wake.clear()  # before looking, so a wake-up from now on is not missed
                stopping = self._stopping.is_set()
                if stopping:
                    self._let_waiting_go("worker stopped before sending")
                if (stopping or not claiming) and self.leases.idle() and not (self._buffer or self._cycles):
                    return
                full = len(self._cycles) >= CYCLES_IN_FLIGHT or (self._failures and self._cycles)
                delay = None if full else self._due(claiming=claiming and not stopping)
                if delay != 0:
                    await self._sleep(delay)
                    continue
                cycle = asyncio.create_task(
                    self._cycle(None if claiming and not stopping else 0, start=not stopping and not self._failures))
                self._cycles.add(cycle)
                cycle.add_done_callback(self._cycled)
                await asyncio.sleep(0)  # let it take its changes before the next look
        finally:
            for cycle in self._cycles:
                cycle.cancel()
            await asyncio.gather(*self._cycles, return_exceptions=True)

    def _cycled(self, cycle: asyncio.Task[int]) -> None:
        self._cycles.discard(cycle)
        self._wake.set()
        if cycle.cancelled():
            return
        if (exc := cycle.exception()) is None:
            self._answered()
        elif isinstance(exc, Exception):  # a store hiccup must not end the worker: back off, keep the buffer
            self._failed(exc)

    def _due(self, *, claiming: bool) -> float | None:
        """Seconds until the next cycle is due (0: now), or None when only a wake-up brings one."""
        now = time.monotonic()
        if self._failures:
            return max(0.0, self._retry_at - now)
        if self._stopping.is_set():
            return 0.0 if self._buffer else None
        if len(self._buffer) >= self._flush_batch or (claiming and self._claim_size() > 0):
            return 0.0
        waits: list[float] = []
        if self.leases.room() > 0 and (soonest := self.leases.next_due()) is not None:
            if soonest <= now:
                return 0.0
            waits.append(soonest - now)
        if self._buffer:
            waits.append(self._buffered_at + FLUSH_SECONDS - now)
        if claiming and not self._claimable:
            waits.append(self._claim_at - now)
        return max(0.0, min(waits)) if waits else None

    def _claim_size(self) -> int:
        """How many intents the next cycle claims: the lease slots free once its changes are
        applied, when at least a batch of them is (or none is held) and work may be due."""
        if not self._claimable:
            if not self._ticket.is_set() and time.monotonic() < self._claim_at:
                return 0
            self._claimable = True
        free = self.leases.free() + len(self._buffer)
        return free if free >= self._claim_batch or (free > 0 and len(self.leases) == len(self._buffer)) else 0

    async def _sleep(self, timeout: float | None) -> None:
        """Until woken (a send or check finished, a change buffered, ``stop()``), an enqueue
        while the last claim found nothing more, or ``timeout``."""
        woken = [asyncio.ensure_future(self._wake.wait())]
        if not self._claimable:
            woken.append(asyncio.ensure_future(self._ticket.wait()))
        await asyncio.wait(woken, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        for task in woken:
            task.cancel()

    async def _cycle(self, claim: int | None, *, start: bool) -> int:
        """One ``Store.apply``: the buffered changes, the starts of the leases ready now
        (``start``), and a claim of ``claim`` intents (None: as many as ``_claim_size``); then
        the sends of the starts applied. Returns how many intents were claimed. When the apply
        fails, the changes go back to the buffer, and the starts, never sent, are recorded as
        not submitted."""
        now = self.clock.now()
        ready = self._ready(now) if start else []
        flush, self._buffer = self._buffer, []
        changes: list[Change] = [entry.change for entry in flush]
        changes += [item.start for item in ready]
        limit = self._claim_size() if claim is None else claim
        lease_until = later(now, self.lease.total_seconds())
        asked = Claim(self.id, now, lease_until, limit) if limit > 0 else None
        if not changes and asked is None:
            return 0
        if any(isinstance(entry.change, Settle) and entry.attempt is not None for entry in flush):
            crash_point("before_outcome")
        ticket = self.outbox.enqueued.ticket()  # an enqueue during the claim is not missed
        try:
            with self.leases.applying({change.key for change in changes}, claims=limit, starts=len(ready)):
                applied = await self.store.apply(changes, claim=asked)
        except BaseException as exc:
            self._buffer[:0] = flush
            why = "the worker stopped" if isinstance(exc, asyncio.CancelledError) else f"{type(exc).__name__}: {exc}"
            for item in ready:
                self._keep(item.lease, self.outcomes.not_started(item.lease.intent, item.destination,
                                                                 item.start.attempt, why))
            raise
        results = applied.results
        for entry, result in zip(flush, results, strict=False):
            self._flushed(entry, result)
        started = [item for item, result in zip(ready, results[len(flush):], strict=True)
                   if self._started(item, result)]
        if started:
            self._launch(started)
        for intent in applied.claimed:
            crash_point("after_claim")
            self.leases.hold(intent, lease_until)
        if asked is not None:
            self._count_held(applied.held)
        if asked is not None and len(applied.claimed) < asked.limit:
            await self._look_again(ticket, now, applied.held)
        return len(applied.claimed)

    def _count_held(self, held: list[Held]) -> None:
        """Count what the claim held back, and note the destinations held at max_in_flight: an
        outcome of one of theirs frees a place, so the next claim need not wait for the poll."""
        for h in held:
            child = self._held_counts.get((h.destination, h.limit))
            if child is None:  # a child looked up once per destination and limit
                child = self._held_counts[(h.destination, h.limit)] = self.outbox.metrics.sends_held.labels(
                    h.destination, h.limit.value)
            child.inc(h.count)
        self._full = {h.destination for h in held if h.limit is Limit.IN_FLIGHT}

    async def _look_again(self, ticket: asyncio.Event, now: datetime, held: list[Held]) -> None:
        """A claim found all that was due, or held back the rest: claim next on an enqueue (since
        ``ticket``), when the next intent falls due or a limit lets a held one go, or after
        poll_seconds."""
        self._claimable, self._ticket = False, ticket
        wait = self.outbox.settings.poll_seconds
        try:
            due = await self.store.next_due_at(now if held else None)
        except Exception as exc:  # the poll bounds the wait all the same
            log.warning("could not read when the next intent falls due (%s)", exc)
            due = None
        for at in [due, *(h.retry_at for h in held)]:
            if at is not None:
                wait = min(wait, max(0.0, (at - self.clock.now()).total_seconds()))
        self._claim_at = time.monotonic() + wait

    def _answered(self) -> None:
        """A cycle went through: say so if they had been failing."""
        if self.trouble is not None:
            log.warning("%s after %d failed cycle(s) since %s",
                        "the database answers again" if self.trouble.unreachable else "the cycles go through again",
                        self._failures, self.trouble.since.isoformat())
            self.trouble = None
        self._failures = 0

    def _failed(self, exc: Exception) -> None:
        """A cycle failed: back off, and say what failed. Only StoreUnavailable is the database
        not answering; any other error is named as what it is (the log has its traceback), so an
        operator is not sent to look at a database that answers."""
        self._failures += 1
        pause = claim_pause(self.outbox.settings.poll_seconds, self._failures)
        self._retry_at = time.monotonic() + pause
        unreachable = isinstance(exc, StoreUnavailable)
        what = f"{type(exc).__name__}: {exc}"
        if self.trouble is None or self.trouble.unreachable != unreachable:
            self.trouble = Trouble(what, self.clock.now(), unreachable)
        if unreachable:
            log.error("a store cycle failed %d time(s) in a row (%s); trying again in %.1fs (%d changes kept to "
                      "record)", self._failures, exc, pause, len(self._buffer))
        else:
            log.error("a cycle failed %d time(s) in a row on an error of the sender's, not the database's answer "
                      "(%s); trying again in %.1fs (%d changes kept to record)", self._failures, what, pause,
                      len(self._buffer), exc_info=exc)  # (a done callback: no exception is being handled)

    def _keep(self, lease: Lease, entry: Entry) -> None:
        """Buffer the last change of ``lease`` for the next cycle."""
        lease.final = True
        entry.lease = lease
        if not self._buffer:
            self._buffered_at = time.monotonic()
        self._buffer.append(entry)
        self._wake.set()

    def _let_waiting_go(self, reason: str) -> None:
        """Give back every lease not started (stopping): its checks are cut, it is due again now."""
        now = self.clock.now()
        for lease in self.leases.let_waiting_go():
            self._keep(lease, self.outcomes.release(lease.intent, reason, now))

    def _flushed(self, entry: Entry, result: object) -> None:
        if entry.lease is not None:
            self.leases.forget(entry.lease)
        if entry.intent.destination in self._full:  # a place came free there
            self._claimable = True
        if result is None:
            follow_up(entry, self.outbox)
            return
        self.stale_writes += 1
        log.warning("fenced write rejected: %s", result, extra=log_fields(entry.intent, entry.attempt, self.id))

    def _started(self, item: Ready, result: object) -> bool:
        """Whether the attempt's start was applied, so it is to be sent."""
        if result is not None:  # the lease was lost meanwhile: nothing is sent, the slot is free
            self.stale_writes += 1
            log.warning("fenced write rejected: %s", result,
                        extra=log_fields(item.lease.intent, item.start.attempt, self.id))
            self.leases.forget(item.lease)
            return False
        crash_point("after_attempt_start")
        return True

    def _launch(self, started: list[Ready]) -> None:
        """Send the attempts a cycle started (their starts applied), each as a task of its own."""
        for item in started:
            self.leases.sending(asyncio.create_task(self._send(item.lease, item.destination, item.start.attempt)), 1)

    async def _cut(self, cycles: asyncio.Task[None]) -> None:
        """Past the drain: cut the sends still running and the cycle under way, then record in
        one last apply what they and the leases not started leave (bounded by the lease: past
        it the sweeper gives them back anyway)."""
        await asyncio.gather(*self.leases.cut_sends(), return_exceptions=True)
        cycles.cancel()
        await asyncio.gather(cycles, return_exceptions=True)
        fetching = self.leases.fetches()
        self._let_waiting_go("worker stopped before sending")
        await asyncio.gather(*fetching, return_exceptions=True)
        self._let_waiting_go("worker stopped before sending")
        if not self._buffer:
            return
        try:
            await asyncio.wait_for(self._cycle(0, start=False), self.lease.total_seconds())
        except Exception as exc:
            log.error("could not record %d outcomes and releases before stopping (%s); the sweeper will recover "
                      "their leases", len(self._buffer), exc,
                      exc_info=not isinstance(exc, StoreUnavailable | TimeoutError))


def claim_pause(poll_seconds: float, failures: int) -> float:
    """How long to wait after ``failures`` failed cycles in a row: poll_seconds, doubling, at most
    MAX_CLAIM_BACKOFF_SECONDS (the exponent is capped, so an outage of any length is no overflow)."""
    return min(MAX_CLAIM_BACKOFF_SECONDS, poll_seconds * 2 ** min(failures - 1, 32))


