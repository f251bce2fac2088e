"""The delivery worker: lease due intents, re-check authority, send, record, decide.

The worker runs in cycles, each one ``Store.apply`` (one transaction): the outcomes, releases
and holds buffered since the last cycle, the attempt starts of the leases whose checks just
passed, and a claim for the lease slots free. A start commits before its send, as ever, but
together with the others of its cycle, so a delivery costs a share of a transaction, not three.

Every write a worker makes after its claim is conditional on the fence it was given; if the
lease expired and the sweeper (or another worker) moved the intent on, the write is rejected
and logged, never applied. A lease expiring is not proof that its worker stopped, so the
sweeper treats an attempt in flight as possibly submitted.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from outbox import (
    Attempt,
    Destination,
    Event,
    EventKind,
    Intent,
    Outbox,
    Outcome,
    SecretsKeyError,
    Status,
    StoreUnavailable,
    Submission,
    channels,
    operations,
)
from outbox.crash import arm, crash_point
from outbox.ids import KEY_SEPARATOR, uuid7
from outbox.model import SETTLED, Change, Hold, Release, Settle, Start
from outbox.store.protocol import Claim

from .authority import (
    Authority,
    AuthorityRequest,
    CachedAuthority,
    Decision,
    Verdict,
    authority_from_setting,
)
from .backoff import Backoff
from .channel import Channel, ChannelModule, SendResult
from .circuit import Circuits
from .decision import Fate, Policy, decide

log = logging.getLogger("outbox.sender")

#: How long a destination record is reused before it is read again.
DESTINATION_CACHE_SECONDS = 2.0
#: How often a worker prunes finished intents past their retention.
PRUNE_SECONDS = 3600.0
#: Expired leases read per round of a sweep.
SWEEP_BATCH = 100
#: A disabled or missing destination's intents are looked at again after this long.
PARKED_SECONDS = 60.0
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
#: Leases a worker holds per send slot: a lease lives through three applies (its claim, its
#: attempt's start, its outcome) around a send that is often shorter than one of them, so while
#: some sends run, the next intents are being claimed and started and finished ones' outcomes
#: committed, and recording never leaves a slot idle.
LEASES_PER_SLOT = 4


class _Unread:
    """A destination not read yet (the cache had none fresh enough)."""


UNREAD = _Unread()
#: What ``Worker._judge`` answers when a check must await the store or the authority provider.
FETCH = object()


@dataclass(eq=False, slots=True)
class _Lease:
    """An intent this worker holds, from its claim until its last change is applied."""

    intent: Intent
    confirmed: datetime  # until when the store last confirmed the lease (claim or renewal)
    picked: bool = False  # taken to be sent, its lease found confirmed then
    destination: Destination | _Unread | None = UNREAD  # read for its checks by a fetch
    decision: Decision | None = None  # the authority's answer a fetch got, used once
    not_before: float = 0.0  # (monotonic) its checks wait until then: the store failed a read
    final: bool = False  # its last change is buffered, or it was let go


@dataclass(slots=True)
class _Entry:
    """A worker change waiting for a cycle, and what to do once the store applied it."""

    change: Settle | Release | Hold
    intent: Intent
    attempt: Attempt | None = None
    applied: Callable[[], None] | None = None
    lease: _Lease | None = None


@dataclass(slots=True)
class _Ready:
    """A lease whose checks passed in this cycle, with the start that goes in its apply."""

    lease: _Lease
    start: Start
    destination: Destination


class Worker:
    """Delivers due intents from one outbox until stopped.

    A pipeline over ``Store.apply``: each cycle is one transaction holding the changes of the
    work that finished since the last one, the attempt starts of the leases ready to send now,
    and a claim for the lease slots free; the starts applied are then sent, each as a task.
    """

    def __init__(
        self,
        outbox: Outbox,
        *,
        authority: Authority | None = None,
        channels: Mapping[str, Channel] | None = None,
        worker_id: str | None = None,
        concurrency: int | None = None,
        policy: Policy | None = None,
    ) -> None:
        settings = outbox.settings
        self.outbox = outbox
        self.store = outbox.store
        self.clock = outbox.clock
        self.id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid7()[-8:]}"
        self.concurrency = concurrency or settings.worker_concurrency
        self.lease = timedelta(seconds=settings.lease_seconds)
        self.policy = policy or Policy(
            Backoff(settings.backoff_initial_seconds, settings.backoff_cap_seconds),
            settings.retention_margin_seconds,
        )
        self.authority = CachedAuthority(
            authority or authority_from_setting(settings.authority, outbox), settings.authority_seconds,
            wall=self.clock.now,
        )
        self.channels: dict[str, Channel] = dict(channels or {})  # the rest are opened when first needed
        self.leases = LEASES_PER_SLOT * self.concurrency
        self._claim_batch = max(1, self.concurrency // 4)  # claim once a quarter of the leases are free
        self._flush_batch = min(FLUSH_BATCH, max(1, self.concurrency // 2))
        self._held: dict[str, _Lease] = {}  # every lease held, by key, in claim order
        self._waiting: deque[_Lease] = deque()  # leased, not yet started
        self._fetching: set[asyncio.Task[None]] = set()
        self._sending: set[asyncio.Task[None]] = set()
        self._buffer: list[_Entry] = []  # at most one per lease held, so bounded by the leases
        self._buffered_at = 0.0  # (monotonic) when the oldest change in the buffer came
        self._flushing: set[str] = set()  # keys whose changes are in an apply under way
        self._cycles: set[asyncio.Task[int]] = set()  # applies under way (at most CYCLES_IN_FLIGHT)
        self._claiming = 0  # intents the claims under way may lease
        self._starting = 0  # attempt starts in the applies under way (their send slots are taken)
        self._wake = asyncio.Event()
        self._claimable = True  # False once a claim came back short, until an enqueue or _claim_at
        self._claim_at = 0.0
        self._ticket = outbox.enqueued.ticket()
        self._failures = 0  # cycles in a row whose apply failed
        self._retry_at = 0.0
        #: Why and since when the store has been failing this worker, or None while it answers.
        self.trouble: tuple[str, datetime] | None = None
        self._stopping = asyncio.Event()
        self._destinations: dict[str, tuple[float, Destination | None]] = {}
        self.circuits = Circuits(settings.circuit_failures, settings.circuit_pause_seconds)
        outbox.metrics.paused_destinations.set_function(lambda: self.circuits.paused)
        self.stale_writes = 0  # fenced writes this worker had rejected (also logged)
        self._attempt_counts: dict[tuple[str, Outcome], Any] = {}  # the attempts counter's children
        #: Intents this worker set aside because the store cannot read their times: how many,
        #: and the last one's key and when (``/healthz`` and the console say so).
        self.set_aside = 0
        self.last_set_aside: tuple[str, datetime] | None = None
        arm(settings.crash_at)  # tests only: where this process kills itself (unset: nowhere)

    # -- running ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Claim and deliver until ``stop()``; then drain and release (graceful shutdown)."""
        log.info("worker %s started (concurrency %d)", self.id, self.concurrency)
        helpers = [asyncio.create_task(self._heartbeat()), asyncio.create_task(self._sweep_forever())]
        cycles = asyncio.create_task(self._loop(claiming=True))
        try:
            stopped = asyncio.create_task(self._stopping.wait())
            await asyncio.wait({cycles, stopped}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if not cycles.done():
                drain = self.outbox.settings.drain_seconds
                if self._sending:
                    log.info("draining %d in-flight sends for up to %.0fs", len(self._sending), drain)
                await asyncio.wait({cycles}, timeout=drain)
        finally:
            self._stopping.set()
            await self._cut(cycles)
            for helper in helpers:
                helper.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            await self.aclose()
            log.info("worker %s stopped", self.id)
        if not cycles.cancelled() and (failure := cycles.exception()) is not None:
            raise failure

    def _channel(self, name: str) -> Channel:
        """The channel called ``name``, opened from the registry the first time it is needed."""
        channel = self.channels.get(name)
        if channel is None:
            kind = channels.get(name)
            if not isinstance(kind, ChannelModule):
                raise TypeError(f"channel {name!r} is installed without a sender (a ChannelModule)")
            channel = self.channels[name] = kind.open(self.concurrency)
        return channel

    async def aclose(self) -> None:
        """Release the channels' connections and the authority provider's (``run`` does this
        when it ends; call it after ``run_once``)."""
        for channel in self.channels.values():
            await channel.aclose()
        await self.authority.aclose()

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

    async def sweep(self) -> int:
        """Recover every intent whose lease has expired, ``SWEEP_BATCH`` at a time (each one
        recovered leaves the expired set); returns how many."""
        recovered = 0
        while True:
            now = self.clock.now()
            expired = await self.store.expired_leases(now, SWEEP_BATCH)
            idle = [intent for intent, attempt in expired if attempt is None]
            if idle:  # none in flight: given back in one transaction
                given_back = await self.store.recover(now, SWEEP_BATCH, self.id)
                self._given_back(idle, given_back)
                recovered += given_back
            for intent, attempt in expired:
                if attempt is not None:
                    recovered += await self._recover(intent, attempt)
            if len(expired) < SWEEP_BATCH:
                return recovered

    # -- cycles ----------------------------------------------------------------------------

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
                if (stopping or not claiming) and not (self._held or self._buffer or self._sending or self._fetching
                                                       or self._cycles):
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
        if self.concurrency > len(self._sending) + len(self._fetching) + self._starting and self._waiting:
            soonest = min(lease.not_before for lease in self._waiting)
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
        free = self.leases - len(self._held) - self._claiming + len(self._buffer)
        return free if free >= self._claim_batch or (free > 0 and len(self._held) == len(self._buffer)) else 0

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
        asked = Claim(self.id, now, now + self.lease, limit) if limit > 0 else None
        if not changes and asked is None:
            return 0
        if any(isinstance(entry.change, Settle) and entry.attempt is not None for entry in flush):
            crash_point("before_outcome")
        ticket = self.outbox.enqueued.ticket()  # an enqueue during the claim is not missed
        keys = {change.key for change in changes}
        self._flushing |= keys
        self._claiming += limit
        self._starting += len(ready)
        try:
            applied = await self.store.apply(changes, claim=asked)
        except BaseException as exc:
            self._buffer[:0] = flush
            why = "the worker stopped" if isinstance(exc, asyncio.CancelledError) else f"{type(exc).__name__}: {exc}"
            for item in ready:
                self._not_started(item, why)
            raise
        finally:
            self._flushing -= keys
            self._claiming -= limit
            self._starting -= len(ready)
        results = applied.results
        for entry, result in zip(flush, results, strict=False):
            self._flushed(entry, result)
        for item, result in zip(ready, results[len(flush):], strict=True):
            self._started(item, result)
        for intent in applied.claimed:
            crash_point("after_claim")
            lease = self._held[intent.key] = _Lease(intent, now + self.lease)
            self._waiting.append(lease)
        if asked is not None and len(applied.claimed) < asked.limit:
            await self._look_again(ticket)
        return len(applied.claimed)

    async def _look_again(self, ticket: asyncio.Event) -> None:
        """A claim found all that was due: claim next on an enqueue (since ``ticket``), when the
        next intent falls due, or after poll_seconds."""
        self._claimable, self._ticket = False, ticket
        wait = self.outbox.settings.poll_seconds
        try:
            due = await self.store.next_due_at()
        except Exception as exc:  # the poll bounds the wait all the same
            log.warning("could not read when the next intent falls due (%s)", exc)
            due = None
        if due is not None:
            wait = min(wait, max(0.0, (due - self.clock.now()).total_seconds()))
        self._claim_at = time.monotonic() + wait

    def _answered(self) -> None:
        """The store answered a cycle: say so if it had been failing."""
        if self.trouble is not None:
            log.warning("the database answers again after %d failed cycle(s) since %s", self._failures,
                        self.trouble[1].isoformat())
            self.trouble = None
        self._failures = 0

    def _failed(self, exc: Exception) -> None:
        self._failures += 1
        pause = claim_pause(self.outbox.settings.poll_seconds, self._failures)
        self._retry_at = time.monotonic() + pause
        if self.trouble is None:
            self.trouble = (f"{type(exc).__name__}: {exc}", self.clock.now())
        log.error("a store cycle failed %d time(s) in a row (%s); trying again in %.1fs (%d changes kept to record)",
                  self._failures, exc, pause, len(self._buffer), exc_info=not isinstance(exc, StoreUnavailable))

    def _keep(self, lease: _Lease, entry: _Entry) -> None:
        """Buffer the last change of ``lease`` for the next cycle."""
        lease.final = True
        entry.lease = lease
        if not self._buffer:
            self._buffered_at = time.monotonic()
        self._buffer.append(entry)
        self._wake.set()

    def _let_go(self, lease: _Lease) -> None:
        """Stop holding ``lease`` (its last change applied or refused, or nothing to write)."""
        lease.final = True
        if self._held.get(lease.intent.key) is lease:
            del self._held[lease.intent.key]
        self._wake.set()

    def _let_waiting_go(self, reason: str) -> None:
        """Give back every lease not started (stopping): its checks are cut, it is due again now."""
        for task in self._fetching:
            task.cancel()  # its lease comes back to the waiting ones, and is given back then
        now = self.clock.now()
        while self._waiting:
            lease = self._waiting.popleft()
            if not lease.final:
                self._keep(lease, self._release(lease.intent, reason, now))

    def _flushed(self, entry: _Entry, result: object) -> None:
        if entry.lease is not None:
            self._let_go(entry.lease)
        if result is None:
            if entry.applied is not None:
                entry.applied()
            if entry.intent.ordering_key is not None:  # the next of its key may be claimable now
                self.outbox.enqueued.notify()
            return
        self.stale_writes += 1
        log.warning("fenced write rejected: %s", result, extra=self._fields(entry.intent, entry.attempt))

    def _started(self, item: _Ready, result: object) -> None:
        if result is not None:  # the lease was lost meanwhile: nothing is sent, the slot is free
            self.stale_writes += 1
            log.warning("fenced write rejected: %s", result, extra=self._fields(item.lease.intent, item.start.attempt))
            self._let_go(item.lease)
            return
        crash_point("after_attempt_start")
        task = asyncio.create_task(self._send(item.lease, item.destination, item.start.attempt))
        self._sending.add(task)
        task.add_done_callback(self._finished_task)

    def _finished_task(self, task: asyncio.Task[None]) -> None:
        self._sending.discard(task)
        self._fetching.discard(task)
        self._wake.set()

    async def _cut(self, cycles: asyncio.Task[None]) -> None:
        """Past the drain: cut the sends still running and the cycle under way, then record in
        one last apply what they and the leases not started leave (bounded by the lease: past
        it the sweeper gives them back anyway)."""
        sending = list(self._sending)
        for task in sending:
            task.cancel()
        await asyncio.gather(*sending, return_exceptions=True)
        cycles.cancel()
        await asyncio.gather(cycles, return_exceptions=True)
        fetching = list(self._fetching)
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

    async def _heartbeat(self) -> None:
        interval = self.lease.total_seconds() / 3
        while True:
            await asyncio.sleep(interval)
            held = [(key, lease.intent.fence) for key, lease in self._held.items() if key not in self._flushing]
            if held:
                until = self.clock.now() + self.lease
                try:
                    lost = await self.store.renew_leases(held, until)
                except Exception as exc:  # the next beat tries again; sends wait for a confirmed lease
                    log.error("renewing %d leases failed (%s); trying again in %.1fs; no send starts on a lease "
                              "that is not confirmed", len(held), exc, interval,
                              exc_info=not isinstance(exc, StoreUnavailable))
                    continue
                fences = dict(held)
                for key, fence in held:
                    if (lease := self._held.get(key)) is not None and lease.intent.fence == fence:
                        lease.confirmed = until
                for key in lost:
                    lease = self._held.get(key)
                    if lease is None or lease.intent.fence != fences[key] or key in self._flushing:
                        continue  # it finished while we renewed
                    log.warning("lease lost; this worker's writes for it will be rejected",
                                extra={"action_id": key.rpartition(KEY_SEPARATOR)[2], "fence": fences[key],
                                       "worker": self.id})

    async def _sweep_forever(self) -> None:
        interval = min(5.0, self.lease.total_seconds() / 2)
        retention = timedelta(seconds=self.outbox.settings.delivered_retention_seconds)
        next_prune = 0.0
        while True:
            try:
                await self.sweep()
                if time.monotonic() >= next_prune:
                    pruned = await operations.prune(self.outbox, older_than=retention, dry_run=False)
                    if pruned:
                        log.info("pruned %d delivered/cancelled intents past their retention", len(pruned))
                    next_prune = time.monotonic() + PRUNE_SECONDS
            except Exception as exc:  # keep sweeping; the next round retries
                log.error("sweep failed: %s", exc, exc_info=not isinstance(exc, StoreUnavailable))
            await asyncio.sleep(interval)

    # -- checking --------------------------------------------------------------------------

    def _lease_confirmed(self, lease: _Lease, now: datetime) -> bool:
        """Whether the store confirmed this lease far enough ahead to start a send on it (a
        third of the lease). If not (renewals are failing), nothing is sent or written: the
        lease runs out and a sweeper gives the intent back, its attempt never started."""
        if lease.confirmed - now >= self.lease / 3:
            return True
        log.warning("not sending: the lease is not confirmed (the database is not answering renewals); "
                    "it will be recovered when it expires", extra=self._fields(lease.intent, None))
        return False

    def _cached_destination(self, destination_id: str) -> Destination | _Unread | None:
        cached = self._destinations.get(destination_id)
        if cached and time.monotonic() - cached[0] < DESTINATION_CACHE_SECONDS:
            return cached[1]
        return UNREAD

    async def _destination(self, destination_id: str) -> Destination | None:
        found = self._cached_destination(destination_id)
        if isinstance(found, _Unread):
            found = await self.store.get_destination(destination_id)
            self._destinations[destination_id] = (time.monotonic(), found)
        return found

    def _ready(self, now: datetime) -> list[_Ready]:
        """The attempts to start in this cycle: waiting leases, one per free send slot, checked
        now, authority last. A lease whose check must await the store or the provider is
        fetched meanwhile and judged again in a later cycle; one the checks refuse has its
        change buffered for this cycle."""
        room = self.concurrency - len(self._sending) - len(self._fetching) - self._starting
        ready: list[_Ready] = []
        later: list[_Lease] = []
        mono = time.monotonic()
        while self._waiting and room > 0:
            lease = self._waiting.popleft()
            if lease.final:
                continue
            if lease.not_before > mono:
                later.append(lease)
                continue
            if not lease.picked:
                if not self._lease_confirmed(lease, now):
                    self._let_go(lease)
                    continue
                lease.picked = True
            judged = self._judge(lease, now)
            if judged is None:
                continue
            room -= 1
            if judged is FETCH:
                task = asyncio.create_task(self._fetch(lease))
                self._fetching.add(task)
                task.add_done_callback(self._finished_task)
                continue
            assert isinstance(judged, tuple)
            destination, decision = judged
            intent = lease.intent
            attempt = Attempt(uuid7(), intent.attempts + 1, intent.fence, self.id, now,
                              None, None, None, None, None, None, None, None)
            ready.append(_Ready(lease, Start(intent.key, intent.fence, attempt, Event(
                EventKind.ATTEMPT_STARTED, now, self.id, None,
                {"attempt_id": attempt.attempt_id, "number": attempt.number, "fence": intent.fence,
                 "authority": decision.reason, "authority_revision": decision.revision,
                 "authority_checked_at": decision.checked_at and decision.checked_at.isoformat()})), destination))
        self._waiting.extendleft(reversed(later))
        return ready

    def _judge(self, lease: _Lease, now: datetime) -> tuple[Destination, Decision] | object | None:
        """The checks before an attempt, authority last, without awaiting: (destination,
        decision) to start it; None when they buffered the change that settles it or gives it
        back (nothing sent); FETCH when the destination or the decision must be read first."""
        intent = lease.intent
        if intent.unreadable is not None:
            self._keep(lease, self._set_aside(intent))
            return None
        destination = lease.destination
        if isinstance(destination, _Unread):
            destination = self._cached_destination(intent.destination)
            if isinstance(destination, _Unread):
                return FETCH
        if destination is None or destination.disabled:
            why = "is not registered" if destination is None else "is disabled"
            # parked, looking again less often the longer it stays so (the fence counts claims)
            wait = max(PARKED_SECONDS, self.policy.backoff.delay(intent.fence))
            self._keep(lease, self._release(intent, f"destination {intent.destination!r} {why}",
                                            now + timedelta(seconds=wait), applied=functools.partial(
                                                log.info, "not sent: destination %s; parked for %.0fs", why, wait,
                                                extra=self._fields(intent))))
            return None
        if intent.expires_at is not None and now >= intent.expires_at:
            expired = Fate(Status.DEAD, EventKind.DEAD_LETTERED, "expired before it could be sent")
            self._keep(lease, self._settle(intent, expired, []))
            return None
        if (paused := self.circuits.hold(destination, now)) is not None:
            self._keep(lease, self._release(intent, paused[1], paused[0]))  # nothing sent, no attempt made
            return None
        if destination.requires_approval and (refusal := _approval_refusal(intent, now)):
            hold = Hold(intent.key, intent.fence, refusal, (Event(EventKind.HELD, now, self.id, refusal),))
            self._keep(lease, _Entry(hold, intent, applied=functools.partial(
                log.info, "held: %s", refusal, extra=self._fields(intent))))
            return None
        decision = lease.decision or self.authority.cached(AuthorityRequest(
            intent.scope, intent.channel, intent.destination, intent.action_id))
        lease.decision = None
        if decision is None:
            lease.destination = destination
            return FETCH
        lease.destination = UNREAD  # judged again (a later attempt) with a fresh read
        if decision.verdict is Verdict.ALLOW:  # recorded on attempt_started
            return destination, decision
        checked = Event(EventKind.AUTHORITY_CHECKED, self.clock.now(), self.id, decision.reason,
                        {"verdict": decision.verdict.value, "provider": decision.provider,
                         "revision": decision.revision})
        if decision.verdict is Verdict.UNAVAILABLE:
            wait = self.policy.backoff.delay(intent.fence)  # backs off over repeated outages
            self._keep(lease, self._release(
                intent, decision.reason, self.clock.now() + timedelta(seconds=wait), extra=[checked],
                applied=functools.partial(log.warning, "not sent: authority unavailable (%s); again in %.0fs",
                                          decision.reason, wait, extra=self._fields(intent))))
        else:
            self.outbox.metrics.authority_denials.inc()
            self._keep(lease, self._settle(intent, Fate(Status.REVOKED, EventKind.REVOKED, decision.reason), [checked]))
        return None

    async def _fetch(self, lease: _Lease) -> None:
        """Read what a lease's checks need (its destination, then, where it would be sent, the
        authority's decision); the next cycle judges it with the answers. A store that cannot
        answer leaves it waiting, leased, for a later cycle."""
        intent = lease.intent
        try:
            if isinstance(lease.destination, _Unread):
                lease.destination = await self._destination(intent.destination)
            destination, now = lease.destination, self.clock.now()
            if (destination is not None and not destination.disabled
                    and (intent.expires_at is None or now < intent.expires_at)
                    and not (destination.requires_approval and _approval_refusal(intent, now))):
                lease.decision = await self.authority.check(AuthorityRequest(
                    intent.scope, intent.channel, intent.destination, intent.action_id))
        except StoreUnavailable as exc:  # its lease is confirmed again before it is taken next
            lease.destination, lease.picked = UNREAD, False
            lease.not_before = time.monotonic() + self.outbox.settings.poll_seconds
            log.warning("checks before the attempt wait: %s", exc, extra=self._fields(intent))
        except Exception as exc:
            if isinstance(exc, SecretsKeyError):  # "not this key": a line
                log.warning("delivery interrupted: %s", exc, extra=self._fields(intent))
            else:
                log.exception("delivery failed unexpectedly", extra=self._fields(intent))
            retry = self.clock.now() + timedelta(seconds=self.policy.backoff.delay(intent.fence))
            self._keep(lease, self._release(intent, f"{type(exc).__name__}: {exc} before an attempt started", retry))
        finally:
            if not lease.final:
                self._waiting.appendleft(lease)

    def _set_aside(self, intent: Intent) -> _Entry:
        """Dead-letter an intent whose stored times cannot be read (``Intent.unreadable``), before
        any attempt: nothing is sent, so nothing is claimed about its delivery, and the intents
        beside it go on. An operator shows it and cancels it (it cannot be replayed)."""
        reason = (f"set aside unsent: {intent.unreadable}; cancel it, and enqueue it again with times "
                  "the outbox takes")
        entry = self._settle(intent, Fate(Status.DEAD, EventKind.DEAD_LETTERED, reason), [])
        settled = entry.applied

        def counted() -> None:
            self.set_aside += 1
            self.last_set_aside = (intent.key, self.clock.now())
            if settled is not None:
                settled()

        entry.applied = counted
        return entry

    # -- sending ---------------------------------------------------------------------------

    async def _send(self, lease: _Lease, destination: Destination, attempt: Attempt) -> None:
        """Send a started attempt and buffer its outcome for the next cycle."""
        intent = lease.intent
        sent = False  # once the channel has the request, it may have gone out
        result: SendResult | None = None
        try:
            channel = self._channel(intent.channel)
            started = time.perf_counter()
            sent = True
            result = await channel.send(intent, destination, attempt_id=attempt.attempt_id, fence=intent.fence)
            crash_point("after_answer")
            seconds = time.perf_counter() - started
            if changed := self.circuits.record(destination, result, self.clock.now()):
                log.log(*changed, extra={"destination": destination.id, "worker": self.id})
            self._keep(lease, await self._finish(intent, destination, attempt, result, seconds))
        except asyncio.CancelledError:
            await asyncio.shield(self._abandon(lease, destination, attempt, sent, result, "the worker stopped"))
            raise
        except Exception as exc:
            if isinstance(exc, StoreUnavailable | SecretsKeyError):  # "not now" / "not this key": a line
                log.warning("delivery interrupted: %s", exc, extra=self._fields(intent, attempt))
            else:
                log.exception("delivery failed unexpectedly", extra=self._fields(intent, attempt))
            await asyncio.shield(self._abandon(lease, destination, attempt, sent, result,
                                               f"{type(exc).__name__}: {exc}"))
        finally:
            if not lease.final:  # nothing to record: the sweeper recovers it when its lease runs out
                self._let_go(lease)

    async def _finish(self, intent: Intent, destination: Destination, attempt: Attempt,
                      result: SendResult, seconds: float) -> _Entry:
        now = self.clock.now()
        finished = _finished(attempt, result, now, round(seconds * 1000, 3))
        if result.disable_destination:  # before the outcome, so whoever sees the 410 sees it disabled
            await self.store.disable_destination(destination.id, now)
            self._destinations.pop(destination.id, None)
            log.warning("destination %s disabled: it answered 410 Gone", destination.id,
                        extra=self._fields(intent, attempt))
        return await self._conclude(intent, destination, result, finished, _finished_event(finished, self.id),
                                    intent.fence)

    async def _conclude(self, intent: Intent, destination: Destination, result: SendResult, finished: Attempt,
                        event: Event, fence: int) -> _Entry:
        """Decide what a finished attempt means (reconciling an unknown outcome where the
        receiver answers the probe), recorded with ``event``; ``fence`` is the one the intent
        moves to (a probe raises it further)."""
        first = await self.store.first_submission_at(intent.key) \
            if result.outcome is Outcome.UNKNOWN else None
        fate = decide(intent, destination, result, attempts_made=finished.number,
                      first_submission_at=first, now=self.clock.now(), policy=self.policy)
        fate, reconciled, fence = await self._reconcile(intent, destination, fate, fence)
        return self._decided(intent, destination, result, finished, fate, [event, *reconciled], fence)

    def _decided(self, intent: Intent, destination: Destination, result: SendResult, finished: Attempt,
                 fate: Fate, events: list[Event], fence: int) -> _Entry:
        counted = (destination.id, result.outcome)
        child = self._attempt_counts.get(counted)
        if child is None:  # a child looked up once per destination and outcome, not per attempt
            child = self._attempt_counts[counted] = self.outbox.metrics.attempts.labels(
                destination.id, result.outcome.value)
        child.inc()
        return self._settle(intent, fate, events, attempt=finished,
                            new_fence=fence if fence != intent.fence else None)

    def _not_started(self, item: _Ready, why: str) -> None:
        """A start whose apply failed or was cut: never sent, so ``not_submitted`` (our own
        refusal before the send is proof), recorded by the next cycle."""
        intent, now = item.lease.intent, self.clock.now()
        result = SendResult(Submission.NOT_SUBMITTED, Outcome.RETRYABLE, error=f"{why} before the request was sent")
        finished = _finished(item.start.attempt, result, now, 0.0)
        fate = decide(intent, item.destination, result, attempts_made=finished.number, first_submission_at=None,
                      now=now, policy=self.policy)
        self._keep(item.lease, self._decided(intent, item.destination, result, finished, fate,
                                             [_finished_event(finished, self.id)], intent.fence))

    async def _reconcile(self, intent: Intent, destination: Destination, fate: Fate,
                         fence: int) -> tuple[Fate, list[Event], int]:
        """Before an outcome is left ``unknown``, ask a receiver that answers the probe.

        The probe carries a fence above every attempt's, so the receiver shuts out any of our
        earlier requests still on their way; then ``completed`` means delivered, ``absent`` means
        a retry is safe, ``in_progress`` means ask again later. Returns the fate, the events to
        record and the fence the intent moves to.
        """
        if fate.status is not Status.UNKNOWN or not destination.reconcile:
            return fate, [], fence
        probe_fence = fence + 1
        answer = await self._channel(intent.channel).probe(intent, destination, fence=probe_fence)
        now = self.clock.now()
        event = Event(EventKind.RECONCILED, now, self.id, answer.error,
                      {"state": answer.state, "fence": probe_fence, "status_code": answer.status_code,
                       "external_id": answer.external_id})
        if answer.state == "completed":
            fate = Fate(Status.DELIVERED, EventKind.DELIVERED,
                        f"reconciled: the receiver completed it (answered {answer.status_code})")
        elif answer.state == "absent":
            fate = Fate(Status.PENDING, EventKind.SCHEDULED_RETRY,
                        "reconciled: the receiver never ran it and now refuses the earlier attempt; "
                        "retrying is safe", now)
        elif answer.state == "in_progress":
            fate = Fate(Status.PENDING, EventKind.SCHEDULED_RETRY, "reconciled: still in progress at the receiver",
                        now + timedelta(seconds=self.policy.backoff.delay(1)))
        else:
            fate = Fate(Status.UNKNOWN, EventKind.UNKNOWN, f"{fate.reason}; {answer.error}")
        return fate, [event], probe_fence

    def _settle(self, intent: Intent, fate: Fate, events: list[Event], *,
                attempt: Attempt | None = None, new_fence: int | None = None) -> _Entry:
        """The change that gives ``intent`` its fate, and what is counted and logged once it
        is applied."""
        now = self.clock.now()
        data = {"next_attempt_at": fate.next_attempt_at.isoformat()} if fate.next_attempt_at else {}
        events = [*events, Event(fate.event, now, self.id, fate.reason, data)]
        change = Settle(intent.key, intent.fence, fate.status, tuple(events),
                        last_error=None if fate.status is Status.DELIVERED else fate.reason,
                        next_attempt_at=fate.next_attempt_at,
                        attempts=attempt.number if attempt is not None else None,  # counted even when its start
                        attempt=attempt, new_fence=new_fence)  # could not be recorded
        return _Entry(change, intent, attempt, functools.partial(self._settled, intent, fate, attempt, now, data))

    def _settled(self, intent: Intent, fate: Fate, attempt: Attempt | None, now: datetime,
                 data: dict[str, str]) -> None:
        metrics = self.outbox.metrics
        if fate.status is Status.DELIVERED:
            metrics.latency.observe(max(0.0, (now - intent.created_at).total_seconds()))
            if log.isEnabledFor(logging.DEBUG):
                log.debug("delivered", extra=self._fields(intent, attempt))
        elif fate.status is Status.PENDING:
            log.info("%s; next attempt at %s", fate.reason, data.get("next_attempt_at"),
                     extra=self._fields(intent, attempt))
        else:  # dead, unknown, revoked: what someone will be asked about
            if fate.status is Status.DEAD:
                metrics.dead_lettered.inc()
            elif fate.status is Status.UNKNOWN:
                metrics.unknown.inc()
            log.warning("%s: %s", fate.status.value, fate.reason, extra=self._fields(intent, attempt))
        if fate.status in SETTLED:
            self.outbox.settled.notify()

    def _release(self, intent: Intent, reason: str, due: datetime, *, extra: list[Event] | None = None,
                 applied: Callable[[], None] | None = None) -> _Entry:
        """The change that gives a lease back without an attempt having started: nothing was sent."""
        return _Entry(Release(intent.key, intent.fence, due, (
            *(extra or []), Event(EventKind.RELEASED, self.clock.now(), self.id, reason,
                                  {"next_attempt_at": due.isoformat()}))), intent, applied=applied)

    async def _abandon(self, lease: _Lease, destination: Destination, attempt: Attempt, sent: bool,
                       result: SendResult | None, why: str) -> None:
        """Buffer what is known when a send is cut short (shutdown, a failure of our own code or
        of the store). Never handed to the channel, the attempt is ``not_submitted``: our own
        refusal before the send is proof. Handed over, it keeps the result that came back, or
        else is ``maybe_submitted``."""
        intent = lease.intent
        if not sent:
            result = SendResult(Submission.NOT_SUBMITTED, Outcome.RETRYABLE, error=f"{why} before the request was sent")
        elif result is None:
            result = SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN,
                                error=f"{why} while the request was in flight")
        try:
            self._keep(lease, await self._finish(intent, destination, attempt, result, 0.0))
        except Exception as exc:
            log.error("could not record the abandoned send (%s); the sweeper will", exc,
                      exc_info=not isinstance(exc, StoreUnavailable), extra=self._fields(intent, attempt))

    async def _apply_now(self, entry: _Entry) -> bool:
        """Apply one change at once (the sweeper's, on another worker's lease); whether it applied."""
        if isinstance(entry.change, Settle) and entry.attempt is not None:
            crash_point("before_outcome")
        [result] = (await self.store.apply([entry.change])).results
        if result is not None:
            return False
        self._flushed(entry, None)
        return True

    async def _recover(self, intent: Intent, attempt: Attempt) -> int:
        """The sweeper's work on one expired lease with an attempt in flight: it may have been sent.
        Settled under a raised fence, so the old holder is shut out; 1 if it was, 0 if its holder
        finished or another sweeper got there first."""
        reason = f"lease of {intent.lease_owner} expired"
        destination = await self.store.get_destination(intent.destination)
        now = self.clock.now()
        result = SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN,
                            error=reason + " while its attempt was in flight; it may have been sent")
        finished = _finished(attempt, result, now)
        if destination is None:  # nowhere to judge it against: due again, parked when claimed
            entry = self._settle(intent, Fate(Status.PENDING, EventKind.LEASE_EXPIRED,
                                              reason + " and its destination is gone", now), [],
                                 attempt=finished, new_fence=intent.fence + 1)
        else:
            entry = await self._conclude(intent, destination, result, finished,
                                         Event(EventKind.LEASE_EXPIRED, now, self.id, reason, {"fence": intent.fence}),
                                         intent.fence + 1)
        if not await self._apply_now(entry):
            return 0
        self._recovered(intent, attempt)
        return 1

    def _given_back(self, idle: list[Intent], given_back: int) -> None:
        """Count and log the leases ``recover`` gave back (each by name when they are the ones read)."""
        self.outbox.metrics.lease_expiries.inc(given_back)
        if given_back == len(idle):
            for intent in idle:
                self._recovered(intent, None)
        elif given_back:
            log.warning("recovered %d expired leases before any attempt started", given_back,
                        extra={"worker": self.id})

    def _recovered(self, intent: Intent, attempt: Attempt | None) -> None:
        if attempt is not None:
            self.outbox.metrics.lease_expiries.inc()
        log.warning("recovered an expired lease of %s", intent.lease_owner, extra=self._fields(intent, attempt))

    def _fields(self, intent: Intent, attempt: Attempt | None = None) -> dict[str, object]:
        """The identities a log record about ``intent`` carries (see outbox.logs)."""
        return {"action_id": intent.action_id, "attempt_id": attempt.attempt_id if attempt else None,
                "fence": intent.fence, "worker": self.id, "destination": intent.destination}


def _approval_refusal(intent: Intent, now: datetime) -> str | None:
    """Why an intent to a destination requiring approval may not be sent now, or None."""
    if intent.approved_digest is None:
        return "waiting for an operator's approval"
    if intent.approved_digest != intent.payload_digest:
        return "the approval was for another payload"
    if intent.approval_expires_at is None or now >= intent.approval_expires_at:
        return "the approval expired before the send; approve it again"
    return None


#: What a store cannot keep in text, or a log should not show: controls but tab and newline.
CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def claim_pause(poll_seconds: float, failures: int) -> float:
    """How long to wait after ``failures`` failed cycles in a row: poll_seconds, doubling, at most
    MAX_CLAIM_BACKOFF_SECONDS (the exponent is capped, so an outage of any length is no overflow)."""
    return min(MAX_CLAIM_BACKOFF_SECONDS, poll_seconds * 2 ** min(failures - 1, 32))


def _storable(text: str | None) -> str | None:
    """A receiver's words (a reply, an id, an error quoting them) as every store can keep them:
    bytes that were not UTF-8 (kept by a client as lone surrogates) and control characters
    become U+FFFD. Otherwise one odd byte in a server's banner would fail the outcome's write
    and turn an answered attempt into an unknown one."""
    if text is None:
        return None
    return CONTROLS.sub("\ufffd", text.encode("utf-8", "replace").decode("utf-8"))


def _finished(attempt: Attempt, result: SendResult, at: datetime, duration_ms: float | None = None) -> Attempt:
    """``attempt`` with its result recorded (built directly: ``dataclasses.replace`` reads the
    fields anew on every call, a few microseconds per delivery)."""
    return Attempt(attempt.attempt_id, attempt.number, attempt.fence, attempt.worker, attempt.started_at, at,
                   result.submission, result.outcome, result.status_code, _storable(result.reply),
                   _storable(result.external_id), _storable(result.error), duration_ms, result.stage)


def _finished_event(attempt: Attempt, worker: str) -> Event:
    return Event(EventKind.ATTEMPT_FINISHED, attempt.finished_at or attempt.started_at, worker, attempt.error, {
        "attempt_id": attempt.attempt_id,
        "submission": attempt.submission.value if attempt.submission else None,
        "outcome": attempt.outcome.value if attempt.outcome else None,
        "status_code": attempt.status_code,
    })
