"""The delivery worker: lease due intents, re-check authority, send, record, decide.

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
from collections.abc import Awaitable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta

from outbox import (
    Attempt,
    Destination,
    Event,
    EventKind,
    Intent,
    Outbox,
    Outcome,
    SecretsKeyError,
    StaleWrite,
    Status,
    StoreUnavailable,
    Submission,
    channels,
    operations,
)
from outbox.crash import arm, crash_point
from outbox.ids import KEY_SEPARATOR, uuid7
from outbox.model import SETTLED

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
#: Leases a worker holds per send slot: while some sends run, the next intents are being
#: claimed and their attempts recorded, and finished ones' outcomes committed, so recording
#: never leaves a slot idle.
LEASES_PER_SLOT = 2


class Worker:
    """Delivers due intents from one outbox until stopped."""

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
        self.authority: Authority = CachedAuthority(
            authority or authority_from_setting(settings.authority, outbox), settings.authority_seconds,
            wall=self.clock.now,
        )
        self.channels: dict[str, Channel] = dict(channels or {})  # the rest are opened when first needed
        self.leases = LEASES_PER_SLOT * self.concurrency
        self._sends = asyncio.Semaphore(self.concurrency)
        self._in_flight: dict[str, tuple[int, asyncio.Task[None]]] = {}  # every lease held
        #: For each lease held, until when the store last confirmed it (claim or renewal).
        self._confirmed: dict[str, datetime] = {}
        #: Why and since when the store has been failing this worker, or None while it answers.
        self.trouble: tuple[str, datetime] | None = None
        self._settling: set[str] = set()  # final write under way: the lease is given back, not lost
        self._slot_free = asyncio.Event()
        self._stopping = asyncio.Event()
        self._destinations: dict[str, tuple[float, Destination | None]] = {}
        self.circuits = Circuits(settings.circuit_failures, settings.circuit_pause_seconds)
        outbox.metrics.paused_destinations.set_function(lambda: self.circuits.paused)
        self.stale_writes = 0  # fenced writes this worker had rejected (also logged)
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
        try:
            # claim in batches: once a quarter of the leases are free, or when there are none
            batch = max(1, self.concurrency // 4)
            failures = 0  # claims in a row that failed
            while not self._stopping.is_set():
                free = self.leases - len(self._in_flight)
                if free < batch and self._in_flight:
                    self._slot_free.clear()
                    await self._wait(self._slot_free.wait(), None)
                    continue
                try:
                    woken = self.outbox.enqueued.ticket()  # a wake-up during the claim is not missed
                    claimed = await self._claim(free)
                    failures = self._answered(failures)
                    if not claimed:
                        await self._idle(woken)
                except Exception as exc:  # a store hiccup must not end the worker: back off
                    failures += 1
                    pause = claim_pause(self.outbox.settings.poll_seconds, failures)
                    if self.trouble is None:
                        self.trouble = (f"{type(exc).__name__}: {exc}", self.clock.now())
                    log.error("claiming failed %d time(s) in a row (%s); trying again in %.1fs", failures, exc,
                              pause, exc_info=not isinstance(exc, StoreUnavailable))
                    await self._wait(asyncio.sleep(pause), pause)
        finally:
            await self._drain()
            for helper in helpers:
                helper.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            await self.aclose()
            log.info("worker %s stopped", self.id)

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

    async def run_once(self, limit: int | None = None) -> int:
        """Claim what is due now, deliver it, and return how many were claimed (for tests
        and one-shot runs; the clock decides what is due)."""
        claimed = await self._claim(limit or self.concurrency)
        await asyncio.gather(*(task for _, task in list(self._in_flight.values())))
        return claimed

    async def sweep(self) -> int:
        """Recover every intent whose lease has expired, ``SWEEP_BATCH`` at a time (each one
        recovered leaves the expired set); returns how many."""
        recovered = 0
        while True:
            expired = await self.store.expired_leases(self.clock.now(), SWEEP_BATCH)
            for intent, attempt in expired:
                await self._recover(intent, attempt)
            recovered += len(expired)
            if len(expired) < SWEEP_BATCH:
                return recovered

    # -- claiming --------------------------------------------------------------------------

    async def _claim(self, limit: int) -> int:
        now = self.clock.now()
        intents = await self.store.claim(self.id, now=now, lease_until=now + self.lease, limit=limit)
        for intent in intents:
            crash_point("after_claim")
            self._confirmed[intent.key] = now + self.lease
            self._settling.discard(intent.key)
            task = asyncio.create_task(self._deliver(intent))
            self._in_flight[intent.key] = (intent.fence, task)
            task.add_done_callback(functools.partial(self._done, intent.key, intent.ordering_key is not None))
        return len(intents)

    def _answered(self, failures: int) -> int:
        """The store answered a claim: say so if it had been failing; returns the new count."""
        if self.trouble is not None:
            log.warning("the database answers again after %d failed claim(s) since %s", failures,
                        self.trouble[1].isoformat())
            self.trouble = None
        return 0

    def _done(self, key: str, keyed: bool, _: object = None) -> None:
        self._in_flight.pop(key, None)
        self._confirmed.pop(key, None)
        self._settling.discard(key)
        self._slot_free.set()
        if keyed:  # the next intent of its ordering key may be claimable now: claim without waiting a poll
            self.outbox.enqueued.notify()

    async def _idle(self, woken: asyncio.Event) -> None:
        """Sleep until new work is enqueued here (since ``woken`` was taken), the next intent
        falls due, or poll_seconds."""
        timeout = self.outbox.settings.poll_seconds
        due = await self.store.next_due_at()
        if due is not None:
            timeout = min(timeout, max(0.0, (due - self.clock.now()).total_seconds()))
        await self._wait(self.outbox.enqueued.wait(timeout, since=woken), timeout)

    async def _wait(self, awaitable: Awaitable[object], timeout: float | None) -> None:
        stop = asyncio.create_task(self._stopping.wait())
        other = asyncio.ensure_future(awaitable)
        await asyncio.wait({stop, other}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        for task in (stop, other):
            task.cancel()

    async def _heartbeat(self) -> None:
        interval = self.lease.total_seconds() / 3
        while True:
            await asyncio.sleep(interval)
            held = [(key, fence) for key, (fence, _) in self._in_flight.items() if key not in self._settling]
            if held:
                until = self.clock.now() + self.lease
                try:
                    lost = await self.store.renew_leases(held, until)
                except Exception as exc:  # the next beat tries again; sends wait for a confirmed lease
                    log.error("renewing %d leases failed (%s); trying again in %.1fs; no send starts on a lease "
                              "that is not confirmed", len(held), exc, interval,
                              exc_info=not isinstance(exc, StoreUnavailable))
                    continue
                for key, _ in held:
                    if key in self._confirmed:
                        self._confirmed[key] = until
                fences = dict(held)
                for key in lost:
                    if key not in self._in_flight or key in self._settling:
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

    async def _drain(self) -> None:
        tasks = [task for _, task in self._in_flight.values()]
        if not tasks:
            return
        drain = self.outbox.settings.drain_seconds
        log.info("draining %d in-flight sends for up to %.0fs", len(tasks), drain)
        _, pending = await asyncio.wait(tasks, timeout=drain)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    # -- delivering ------------------------------------------------------------------------

    def _lease_confirmed(self, intent: Intent) -> bool:
        """Whether the store confirmed this lease far enough ahead to start a send on it (a
        third of the lease). If not (renewals are failing), nothing is sent or written: the
        lease runs out and a sweeper gives the intent back, its attempt never started."""
        confirmed = self._confirmed.get(intent.key)
        if confirmed is not None and confirmed - self.clock.now() >= self.lease / 3:
            return True
        log.warning("not sending: the lease is not confirmed (the database is not answering renewals); "
                    "it will be recovered when it expires", extra=self._fields(intent, None))
        return False

    async def _destination(self, destination_id: str) -> Destination | None:
        cached = self._destinations.get(destination_id)
        if cached and time.monotonic() - cached[0] < DESTINATION_CACHE_SECONDS:
            return cached[1]
        found = await self.store.get_destination(destination_id)
        self._destinations[destination_id] = (time.monotonic(), found)
        return found

    async def _deliver(self, intent: Intent) -> None:
        """One leased intent: wait for a send slot, make the attempt, then record its outcome
        outside the slot, so the next send need not wait for this one's commit."""
        attempt: Attempt | None = None
        sent = False  # once the channel has the request, it may have gone out
        result: SendResult | None = None
        try:
            async with self._sends:
                if self._stopping.is_set():
                    await self._release(intent, "worker stopped before sending", self.clock.now())
                    return
                if not self._lease_confirmed(intent):
                    return
                ready = await self._ready(intent)
                if ready is None:
                    return
                destination, decision = ready
                now = self.clock.now()
                attempt = Attempt(uuid7(), intent.attempts + 1, intent.fence, self.id, now,
                                  None, None, None, None, None, None, None, None)
                await self.store.update_intent(
                    intent.key, fetch=False, expected=Status.LEASED, status=Status.LEASED,
                    fence=intent.fence, changes={"attempts": attempt.number}, attempt=attempt,
                    events=[Event(EventKind.ATTEMPT_STARTED, now, self.id, None,
                                  {"attempt_id": attempt.attempt_id, "number": attempt.number,
                                   "fence": intent.fence, "authority": decision.reason,
                                   "authority_revision": decision.revision,
                                   "authority_checked_at": decision.checked_at and decision.checked_at.isoformat()})],
                )
                crash_point("after_attempt_start")
                channel = self._channel(intent.channel)
                started = time.perf_counter()
                sent = True
                result = await channel.send(intent, destination, attempt_id=attempt.attempt_id, fence=intent.fence)
                crash_point("after_answer")
                seconds = time.perf_counter() - started
            if changed := self.circuits.record(destination, result, self.clock.now()):
                log.log(*changed, extra={"destination": destination.id, "worker": self.id})
            await self._finish(intent, destination, attempt, result, seconds)
        except StaleWrite as exc:
            self.stale_writes += 1
            log.warning("fenced write rejected: %s", exc, extra=self._fields(intent, attempt))
        except asyncio.CancelledError:
            await asyncio.shield(self._abandon(intent, attempt, sent, result, "the worker stopped"))
            raise
        except Exception as exc:
            if isinstance(exc, StoreUnavailable | SecretsKeyError):  # "not now" / "not this key": a line
                log.warning("delivery interrupted: %s", exc, extra=self._fields(intent, attempt))
            else:
                log.exception("delivery failed unexpectedly", extra=self._fields(intent, attempt))
            await asyncio.shield(self._abandon(intent, attempt, sent, result, f"{type(exc).__name__}: {exc}",
                                               retry_in=self.policy.backoff.delay(intent.fence)))

    async def _ready(self, intent: Intent) -> tuple[Destination, Decision] | None:
        """The checks before an attempt, authority last; None when they settled the intent or
        gave it back (nothing sent)."""
        if intent.unreadable is not None:
            await self._set_aside(intent)
            return None
        destination = await self._destination(intent.destination)
        now = self.clock.now()
        if destination is None or destination.disabled:
            why = "is not registered" if destination is None else "is disabled"
            # parked, looking again less often the longer it stays so (the fence counts claims)
            wait = max(PARKED_SECONDS, self.policy.backoff.delay(intent.fence))
            await self._release(intent, f"destination {intent.destination!r} {why}",
                                now + timedelta(seconds=wait))
            log.info("not sent: destination %s; parked for %.0fs", why, wait, extra=self._fields(intent))
            return None
        if intent.expires_at is not None and now >= intent.expires_at:
            expired = Fate(Status.DEAD, EventKind.DEAD_LETTERED, "expired before it could be sent")
            await self._settle(intent, expired, [])
            return None
        if (paused := self.circuits.hold(destination, now)) is not None:
            await self._release(intent, paused[1], paused[0])  # nothing sent, no attempt made
            return None
        if destination.requires_approval and (refusal := _approval_refusal(intent, now)):
            await self.store.update_intent(
                intent.key, fetch=False, expected=Status.LEASED, status=Status.HELD, fence=intent.fence,
                changes={"lease_owner": None, "lease_expires_at": None, "last_error": refusal},
                events=[Event(EventKind.HELD, now, self.id, refusal)])
            log.info("held: %s", refusal, extra=self._fields(intent))
            return None
        decision = await self.authority.check(AuthorityRequest(
            intent.scope, intent.channel, intent.destination, intent.action_id))
        if decision.verdict is Verdict.ALLOW:  # recorded on attempt_started
            return destination, decision
        checked = Event(EventKind.AUTHORITY_CHECKED, self.clock.now(), self.id, decision.reason,
                        {"verdict": decision.verdict.value, "provider": decision.provider,
                         "revision": decision.revision})
        if decision.verdict is Verdict.UNAVAILABLE:
            wait = self.policy.backoff.delay(intent.fence)  # backs off over repeated outages
            await self._release(intent, decision.reason, self.clock.now() + timedelta(seconds=wait),
                                extra=[checked])
            log.warning("not sent: authority unavailable (%s); again in %.0fs", decision.reason, wait,
                        extra=self._fields(intent))
        else:
            self.outbox.metrics.authority_denials.inc()
            await self._settle(intent, Fate(Status.REVOKED, EventKind.REVOKED, decision.reason), [checked])
        return None

    async def _set_aside(self, intent: Intent) -> None:
        """Dead-letter an intent whose stored times cannot be read (``Intent.unreadable``), before
        any attempt: nothing is sent, so nothing is claimed about its delivery, and the intents
        beside it go on. An operator shows it and cancels it (it cannot be replayed)."""
        reason = (f"set aside unsent: {intent.unreadable}; cancel it, and enqueue it again with times "
                  "the outbox takes")
        await self._settle(intent, Fate(Status.DEAD, EventKind.DEAD_LETTERED, reason), [])
        self.set_aside += 1
        self.last_set_aside = (intent.key, self.clock.now())

    async def _finish(self, intent: Intent, destination: Destination, attempt: Attempt,
                      result: SendResult, seconds: float) -> None:
        now = self.clock.now()
        finished = _finished(attempt, result, now, round(seconds * 1000, 3))
        if result.disable_destination:  # before the outcome, so whoever sees the 410 sees it disabled
            await self.store.disable_destination(destination.id, now)
            self._destinations.pop(destination.id, None)
            log.warning("destination %s disabled: it answered 410 Gone", destination.id,
                        extra=self._fields(intent, attempt))
        await self._conclude(intent, destination, result, finished, _finished_event(finished, self.id), intent.fence)

    async def _conclude(self, intent: Intent, destination: Destination, result: SendResult, finished: Attempt,
                        event: Event, fence: int) -> None:
        """Decide what a finished attempt means (reconciling an unknown outcome where the
        receiver answers the probe) and record it with ``event``; ``fence`` is the one the
        intent moves to (a probe raises it further)."""
        first = await self.store.first_submission_at(intent.key) \
            if result.outcome is Outcome.UNKNOWN else None
        fate = decide(intent, destination, result, attempts_made=finished.number,
                      first_submission_at=first, now=self.clock.now(), policy=self.policy)
        fate, reconciled, fence = await self._reconcile(intent, destination, fate, fence)
        self.outbox.metrics.attempts.labels(destination.id, result.outcome.value).inc()
        await self._settle(intent, fate, [event, *reconciled], attempt=finished,
                           new_fence=fence if fence != intent.fence else None)

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

    async def _settle(self, intent: Intent, fate: Fate, events: list[Event], *,
                      attempt: Attempt | None = None, new_fence: int | None = None) -> None:
        now = self.clock.now()
        changes: dict[str, object] = {"lease_owner": None, "lease_expires_at": None,
                                      "last_error": None if fate.status is Status.DELIVERED else fate.reason}
        if fate.next_attempt_at is not None:
            changes["next_attempt_at"] = fate.next_attempt_at
        if attempt is not None:  # counted even when its start could not be recorded
            changes["attempts"] = attempt.number
        if new_fence is not None:
            changes["fence"] = new_fence
        data = {"next_attempt_at": fate.next_attempt_at.isoformat()} if fate.next_attempt_at else {}
        ours = intent.key in self._in_flight  # (the sweeper settles other workers' leases too)
        if ours:  # until the task is done (``_done``): a renewal that meets the lease given back
            self._settling.add(intent.key)  # must not call it lost
        if attempt is not None:
            crash_point("before_outcome")
        try:
            await self.store.update_intent(
                intent.key, fetch=False, expected=Status.LEASED, status=fate.status, fence=intent.fence,
                changes=changes, attempt=attempt,
                events=[*events, Event(fate.event, now, self.id, fate.reason, data)],
            )
        except BaseException:
            self._settling.discard(intent.key)  # still ours: renew it while the outcome is recorded again
            raise
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

    async def _release(self, intent: Intent, reason: str, due: datetime, *,
                       extra: list[Event] | None = None, new_fence: int | None = None,
                       kind: EventKind = EventKind.RELEASED) -> None:
        """Give a lease back without an attempt having started: nothing was sent."""
        changes: dict[str, object] = {"lease_owner": None, "lease_expires_at": None, "next_attempt_at": due}
        if new_fence is not None:
            changes["fence"] = new_fence
        await self.store.update_intent(
            intent.key, fetch=False, expected=Status.LEASED, status=Status.PENDING, fence=intent.fence,
            changes=changes,
            events=[*(extra or []), Event(kind, self.clock.now(), self.id, reason,
                                          {"next_attempt_at": due.isoformat()})],
        )

    async def _abandon(self, intent: Intent, attempt: Attempt | None, sent: bool,
                       result: SendResult | None, why: str, *, retry_in: float = 0.0) -> None:
        """Record what is known when a delivery is cut short (shutdown, a failure of our own code
        or of the store). Before its attempt started, the lease is given back, due again in
        ``retry_in`` seconds (a failure would otherwise be claimed again at once, in a loop).
        Started but never handed to the channel, the attempt is ``not_submitted``: our own
        refusal before the send is proof. Handed over, it keeps the result that came back, or
        else is ``maybe_submitted``."""
        try:
            if attempt is None:
                await self._release(intent, f"{why} before an attempt started",
                                    self.clock.now() + timedelta(seconds=retry_in))
                return
            if not sent:
                result = SendResult(Submission.NOT_SUBMITTED, Outcome.RETRYABLE,
                                    error=f"{why} before the request was sent")
            elif result is None:
                result = SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN,
                                    error=f"{why} while the request was in flight")
            destination = await self._destination(intent.destination)
            if destination is None:
                return
            await self._finish(intent, destination, attempt, result, 0.0)
        except StaleWrite:
            self.stale_writes += 1
            log.warning("fenced write rejected while abandoning the send", extra=self._fields(intent, attempt))
        except Exception as exc:
            log.error("could not record the abandoned send (%s); the sweeper will", exc,
                      exc_info=not isinstance(exc, StoreUnavailable), extra=self._fields(intent, attempt))

    async def _recover(self, intent: Intent, attempt: Attempt | None) -> None:
        """The sweeper's work on one expired lease; bumps the fence so the old holder is shut out."""
        reason = f"lease of {intent.lease_owner} expired"
        try:
            destination = await self.store.get_destination(intent.destination)
            if attempt is None or destination is None:
                # nothing was sent (or there is nowhere to judge it against): give the intent back
                await self._release(intent, reason + (" before any attempt started" if attempt is None
                                                      else " and its destination is gone"),
                                    self.clock.now(), new_fence=intent.fence + 1, kind=EventKind.LEASE_EXPIRED)
                self._recovered(intent, attempt)
                return
            result = SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN,
                                error=reason + " while its attempt was in flight; it may have been sent")
            now = self.clock.now()
            await self._conclude(intent, destination, result, _finished(attempt, result, now),
                                 Event(EventKind.LEASE_EXPIRED, now, self.id, reason, {"fence": intent.fence}),
                                 intent.fence + 1)
            self._recovered(intent, attempt)
        except StaleWrite:
            pass  # the holder finished or another sweeper got there first

    def _recovered(self, intent: Intent, attempt: Attempt | None) -> None:
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
    """How long to wait after ``failures`` failed claims in a row: poll_seconds, doubling, at most
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
    """``attempt`` with its result recorded."""
    return replace(attempt, finished_at=at, submission=result.submission, outcome=result.outcome,
                   status_code=result.status_code, reply=_storable(result.reply),
                   external_id=_storable(result.external_id), error=_storable(result.error),
                   duration_ms=duration_ms, stage=result.stage)


def _finished_event(attempt: Attempt, worker: str) -> Event:
    return Event(EventKind.ATTEMPT_FINISHED, attempt.finished_at or attempt.started_at, worker, attempt.error, {
        "attempt_id": attempt.attempt_id,
        "submission": attempt.submission.value if attempt.submission else None,
        "outcome": attempt.outcome.value if attempt.outcome else None,
        "status_code": attempt.status_code,
    })
