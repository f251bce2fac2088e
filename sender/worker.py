"""The delivery worker: lease due intents, re-check authority, send, record, decide.

A ``Worker`` is the cycle pipeline (``sender.pipeline``) with what it starts and sends: the
checks before an attempt (``sender.checks``), the send through the intent's channel, and the
outcome it records (``sender.outcomes``); beside it run the heartbeat that renews its leases
(``sender.heartbeat``) and the sweeper that recovers expired ones (``sender.sweeper``).

Every write a worker makes after its claim is conditional on the fence it was given; if the
lease expired and the sweeper (or another worker) moved the intent on, the write is rejected
and logged, never applied.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Mapping
from contextlib import ExitStack
from datetime import datetime, timedelta

from outbox import Attempt, Destination, Outbox, SecretsKeyError, StoreUnavailable, channels
from outbox.crash import arm, crash_point
from outbox.ids import uuid7

from . import spans
from .authority import Authority, CachedAuthority, OwnersOnly, authority_from_setting
from .backoff import Backoff
from .channel import BatchChannel, Channel, ChannelModule, Send, SendResult, batching
from .checks import Checks, Destinations
from .circuit import Circuits
from .decision import Policy
from .heartbeat import Heartbeat
from .leases import Lease, log_fields
from .outcomes import Entry, Outcomes, cut_short
from .pipeline import MAX_CLAIM_BACKOFF_SECONDS, Pipeline, Ready, claim_pause
from .sweeper import SWEEP_BATCH, Sweeper

__all__ = ["MAX_CLAIM_BACKOFF_SECONDS", "SWEEP_BATCH", "Worker", "claim_pause"]

log = logging.getLogger("outbox.sender")


class Worker(Pipeline):
    """Delivers due intents from one outbox until stopped: the cycle pipeline, whose leases are
    judged by ``Checks`` and sent through their intent's channel."""

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
        worker = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid7()[-8:]}"
        self.policy = policy or Policy(
            Backoff(settings.backoff_initial_seconds, settings.backoff_cap_seconds),
            settings.retention_margin_seconds,
        )
        self.authority = CachedAuthority(
            OwnersOnly(authority) if authority else authority_from_setting(settings.authority, outbox),
            settings.authority_seconds,
            wall=outbox.clock.now,
        )
        self.channels: dict[str, Channel] = dict(channels or {})  # the rest are opened when first needed
        destinations = Destinations(outbox)
        super().__init__(outbox, worker, concurrency or settings.worker_concurrency,
                         timedelta(seconds=settings.lease_seconds),
                         Outcomes(outbox, worker, self.policy, self._channel, destinations.forget))
        self.circuits = Circuits(settings.circuit_failures, settings.circuit_pause_seconds)
        outbox.metrics.paused_destinations.set_function(lambda: self.circuits.paused)
        self.checks = Checks(outbox, self.id, self.policy, self.authority, self.circuits, destinations, self.outcomes)
        self.heartbeat = Heartbeat(self.store, self.clock, self.lease, self.id, self.leases)
        self.sweeper = Sweeper(outbox, self.id, self.outcomes, self.lease, SWEEP_BATCH)
        arm(settings.crash_at)  # tests only: where this process kills itself (unset: nowhere)

    # -- running ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Claim and deliver until ``stop()``; then drain and release (graceful shutdown)."""
        log.info("worker %s started (concurrency %d)", self.id, self.concurrency)
        helpers = [asyncio.create_task(self.heartbeat.run()), asyncio.create_task(self.sweeper.run())]
        try:
            await self._deliver()
        finally:
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
        self.checks.destinations.cancel()
        for channel in self.channels.values():
            await channel.aclose()
        await self.authority.aclose()

    async def sweep(self) -> int:
        """Recover every intent whose lease has expired, ``SWEEP_BATCH`` at a time (each one
        recovered leaves the expired set); returns how many."""
        return await self.sweeper.sweep()

    @property
    def set_aside(self) -> int:
        """Intents this worker set aside because the store cannot read their times (``/healthz``
        and the console say so)."""
        return self.checks.set_aside

    @property
    def last_set_aside(self) -> tuple[str, datetime] | None:
        """The key of the last intent set aside, and when."""
        return self.checks.last_set_aside

    # -- starting and sending ---------------------------------------------------------------

    def _ready(self, now: datetime) -> list[Ready]:
        """The attempts to start in this cycle: waiting leases, one per free send slot, checked
        now, authority last. A lease whose check must await the store or the provider is
        fetched meanwhile and judged again in a later cycle; one the checks refuse has its
        change buffered for this cycle."""
        ready: list[Ready] = []

        def take(lease: Lease) -> bool:
            if not lease.picked:
                if not self.heartbeat.confirmed(lease, now):
                    self.leases.forget(lease)
                    return False
                lease.picked = True
            # One lease's fault, in its checks or in the start they allow (where the attempt goes,
            # in its channel's words): that lease is given back and the cycle goes on. Raised out
            # of ``pick``, it would lose every lease taken off the queue so far, held and renewed
            # but never started.
            judged: Ready | Entry | None
            try:
                checked = self.checks.judge(lease, now)
                if isinstance(checked, tuple):
                    destination, decision = checked
                    judged = Ready(lease, self.outcomes.start(lease.intent, destination, decision, now), destination)
                else:
                    judged = checked
            except Exception as exc:
                judged = self.checks.failed(lease.intent, exc)
            if isinstance(judged, Entry):
                self._keep(lease, judged)
                return False
            if judged is None:
                self.leases.fetching(asyncio.create_task(self._fetch(lease)))
            else:
                ready.append(judged)
            return True

        self.leases.pick(time.monotonic(), take)
        return ready

    async def _fetch(self, lease: Lease) -> None:
        """Read what a lease's checks need; the next cycle judges it with the answers."""
        try:
            if (entry := await self.checks.fetch(lease)) is not None:
                self._keep(lease, entry)
        finally:
            self.leases.wait_again(lease)

    def _launch(self, started: list[Ready]) -> None:
        """Send the attempts a cycle started: a channel that takes batches (``send_many``) gets
        its own at once, as one task; the others' are sent one by one."""
        by_channel: dict[str, list[Ready]] = {}
        for item in started:
            by_channel.setdefault(item.lease.intent.channel, []).append(item)
        alone: list[Ready] = []
        for name, items in by_channel.items():
            many = self._batching(name) if len(items) > 1 else None
            if many is None:
                alone += items
            else:
                self.leases.sending(asyncio.create_task(self._send_many(many, items)), len(items))
        super()._launch(alone)

    def _batching(self, name: str) -> BatchChannel | None:
        """The channel called ``name`` if it takes batches; None when it does not, or cannot be
        opened (each send then records why)."""
        try:
            return batching(self._channel(name))
        except Exception:
            return None

    async def _send(self, lease: Lease, destination: Destination, attempt: Attempt) -> None:
        """Send a started attempt and buffer its outcome for the next cycle."""
        intent = lease.intent
        sent = False  # once the channel has the request, it may have gone out
        result: SendResult | None = None
        try:
            channel = self._channel(intent.channel)
            started = time.perf_counter()
            sent = True
            with spans.sending(intent, destination, attempt) as span:
                result = await channel.send(intent, destination, attempt_id=attempt.attempt_id, fence=intent.fence)
                spans.finished(span, intent, destination, result)
            await self._answered_with(lease, destination, attempt, result, time.perf_counter() - started)
        except asyncio.CancelledError:
            await asyncio.shield(self._abandon(lease, destination, attempt, sent, result, "the worker stopped"))
            raise
        except Exception as exc:
            await self._interrupted(lease, destination, attempt, sent, result, exc)
        finally:
            if not lease.final:  # nothing to record: the sweeper recovers it when its lease runs out
                self.leases.forget(lease)

    async def _send_many(self, channel: BatchChannel, items: list[Ready]) -> None:
        """Send a cycle's started attempts through a channel at once and buffer each outcome
        for the next cycle. Every one was handed over, so each result lost is ``maybe_submitted``;
        one attempt's failure while it is recorded leaves the others' results standing."""
        results: list[SendResult] = []  # none until the channel answered for every attempt
        done = 0  # the attempts whose outcome is buffered
        try:
            with ExitStack() as stack:
                opened = [stack.enter_context(spans.apart(item.lease.intent, item.destination, item.start.attempt))
                          for item in items]
                started = time.perf_counter()
                answered = await channel.send_many([
                    Send(item.lease.intent, item.destination, item.start.attempt.attempt_id, item.lease.intent.fence,
                         context) for item, (_, context) in zip(items, opened, strict=True)])
                if len(answered) != len(items):
                    raise RuntimeError(f"send_many answered {len(answered)} results for {len(items)} attempts")
                results = answered
                for item, result, (span, _) in zip(items, results, opened, strict=True):
                    spans.finished(span, item.lease.intent, item.destination, result)
            seconds = time.perf_counter() - started
            for item, result in zip(items, results, strict=True):
                try:
                    await self._answered_with(item.lease, item.destination, item.start.attempt, result, seconds)
                except Exception as exc:
                    await self._interrupted(item.lease, item.destination, item.start.attempt, True, result, exc)
                done += 1
        except asyncio.CancelledError:
            for i, item in enumerate(items[done:], done):
                await asyncio.shield(self._abandon(item.lease, item.destination, item.start.attempt, True,
                                                   results[i] if results else None, "the worker stopped"))
            raise
        except Exception as exc:
            for i, item in enumerate(items[done:], done):
                await self._interrupted(item.lease, item.destination, item.start.attempt, True,
                                        results[i] if results else None, exc)
        finally:
            for item in items:
                if not item.lease.final:
                    self.leases.forget(item.lease)

    async def _answered_with(self, lease: Lease, destination: Destination, attempt: Attempt, result: SendResult,
                             seconds: float) -> None:
        """Buffer the outcome of an attempt the channel answered, counted by its destination's circuit."""
        crash_point("after_answer")
        if changed := self.circuits.record(destination, result, self.clock.now()):
            log.log(*changed, extra={"destination": destination.id, "worker": self.id})
        self._keep(lease, await self.outcomes.finish(lease.intent, destination, attempt, result, seconds))

    async def _interrupted(self, lease: Lease, destination: Destination, attempt: Attempt, sent: bool,
                           result: SendResult | None, exc: Exception) -> None:
        """Log a send or its recording that failed on ``exc``, and buffer what is known of it."""
        if isinstance(exc, StoreUnavailable | SecretsKeyError):  # "not now" / "not this key": a line
            log.warning("delivery interrupted: %s", exc, extra=log_fields(lease.intent, attempt, self.id))
        else:
            log.exception("delivery failed unexpectedly", extra=log_fields(lease.intent, attempt, self.id))
        await asyncio.shield(self._abandon(lease, destination, attempt, sent, result, f"{type(exc).__name__}: {exc}"))

    async def _abandon(self, lease: Lease, destination: Destination, attempt: Attempt, sent: bool,
                       result: SendResult | None, why: str) -> None:
        """Buffer what is known when a send is cut short (``outcomes.cut_short``)."""
        try:
            self._keep(lease, await self.outcomes.finish(lease.intent, destination, attempt,
                                                         cut_short(sent, result, why), 0.0))
        except Exception as exc:
            log.error("could not record the abandoned send (%s); the sweeper will", exc,
                      exc_info=not isinstance(exc, StoreUnavailable), extra=log_fields(lease.intent, attempt, self.id))
