"""The sweeper: recovers the intents whose lease expired, and prunes finished ones past retention.

A lease expiring is not proof that its worker stopped, so an intent whose attempt was in
flight is treated as possibly submitted: its outcome is ``maybe_submitted``, decided as any
unknown outcome is, under a raised fence so the old holder's writes are shut out. An intent
leased without an attempt started was never sent, and is given back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta

from outbox import (
    Attempt,
    Event,
    EventKind,
    Intent,
    Outbox,
    Outcome,
    SecretsKeyError,
    StoreUnavailable,
    Submission,
    operations,
)
from outbox.crash import crash_point
from outbox.model import Settle
from outbox.tenants import as_allowed

from .channel import SendResult
from .decision import orphaned
from .leases import log_fields
from .outcomes import Entry, Outcomes, finished_attempt, follow_up

log = logging.getLogger("outbox.sender")

#: Expired leases read per round of a sweep.
SWEEP_BATCH = 100
#: How often a worker prunes finished intents past their retention.
PRUNE_SECONDS = 3600.0


class Sweeper:
    """One worker's sweeps over every worker's expired leases (its own included)."""

    def __init__(self, outbox: Outbox, worker: str, outcomes: Outcomes, lease: timedelta,
                 batch: int = SWEEP_BATCH) -> None:
        self.outbox = outbox
        self.worker = worker
        self.outcomes = outcomes
        self.lease = lease
        self.batch = batch

    async def sweep(self) -> int:
        """Recover every intent whose lease has expired, ``batch`` at a time (each one recovered
        leaves the expired set); returns how many."""
        recovered = 0
        while True:
            now = self.outbox.clock.now()
            expired = await self.outbox.store.expired_leases(now, self.batch)
            idle = [intent for intent, attempt in expired if attempt is None]
            if idle:  # none in flight: given back in one transaction
                given_back = await self.outbox.store.recover(now, self.batch, self.worker)
                self._given_back(idle, given_back)
                recovered += given_back
            stuck = False
            for intent, attempt in expired:
                if attempt is not None:
                    try:
                        recovered += await self._recover(intent, attempt)
                    except StoreUnavailable:
                        raise
                    except Exception as exc:  # that intent's own: the others are recovered all the same
                        stuck = True
                        self._not_recovered(intent, attempt, exc)
            if stuck or len(expired) < self.batch:  # (what is stuck is read again at the next round)
                return recovered

    async def run(self) -> None:
        """Sweep every half lease (at most every 5 s), and prune every ``PRUNE_SECONDS``, until
        cancelled; a failed round is tried again at the next."""
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

    async def _apply_now(self, entry: Entry) -> bool:
        """Apply one change at once (on another worker's lease); whether it applied."""
        if isinstance(entry.change, Settle) and entry.attempt is not None:
            crash_point("before_outcome")
        [result] = (await self.outbox.store.apply([entry.change])).results
        if result is not None:
            return False
        follow_up(entry, self.outbox)
        return True

    async def _recover(self, intent: Intent, attempt: Attempt) -> int:
        """The work on one expired lease with an attempt in flight: it may have been sent.
        Settled under a raised fence, so the old holder is shut out; 1 if it was, 0 if its holder
        finished or another sweeper got there first."""
        reason = f"lease of {intent.lease_owner} expired"
        destination = await self.outbox.store.get_destination(intent.destination)
        if destination is not None:  # its reconcile probe too
            destination = as_allowed(destination, self.outbox.settings)
        now = self.outbox.clock.now()
        result = SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN,
                            error=reason + " while its attempt was in flight; it may have been sent")
        finished = finished_attempt(attempt, result, now)
        if destination is None:  # nowhere to judge it against: due again, parked when claimed
            entry = self.outcomes.settle(intent, orphaned(reason, now), [], attempt=finished,
                                         new_fence=intent.fence + 1)
        else:
            entry = await self.outcomes.conclude(
                intent, destination, result, finished,
                Event(EventKind.LEASE_EXPIRED, now, self.worker, reason, {"fence": intent.fence}), intent.fence + 1)
        if not await self._apply_now(entry):
            return 0
        self._recovered(intent, attempt)
        return 1

    def _not_recovered(self, intent: Intent, attempt: Attempt, exc: Exception) -> None:
        """Say why one expired lease was left for a later round (its destination's secrets do not
        open with this process's key, say): one intent's fault, never the others' recovery."""
        if isinstance(exc, SecretsKeyError):  # "not this key": a line
            log.warning("expired lease left for a later sweep: %s", exc, extra=log_fields(intent, attempt, self.worker))
        else:
            log.exception("expired lease left for a later sweep", extra=log_fields(intent, attempt, self.worker))

    def _given_back(self, idle: list[Intent], given_back: int) -> None:
        """Count and log the leases ``recover`` gave back (each by name when they are the ones read)."""
        self.outbox.metrics.lease_expiries.inc(given_back)
        if given_back == len(idle):
            for intent in idle:
                self._recovered(intent, None)
        elif given_back:
            log.warning("recovered %d expired leases before any attempt started", given_back,
                        extra={"worker": self.worker})

    def _recovered(self, intent: Intent, attempt: Attempt | None) -> None:
        if attempt is not None:
            self.outbox.metrics.lease_expiries.inc()
        log.warning("recovered an expired lease of %s", intent.lease_owner,
                    extra=log_fields(intent, attempt, self.worker))

