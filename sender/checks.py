"""The checks before an attempt: is the intent readable, its destination there and enabled, the
intent unexpired, the destination's circuit closed, its approval valid, and (last) its authority
allowing it?

They are judged without awaiting, from what a lease already holds and the caches (destinations
for ``DESTINATION_CACHE_SECONDS``, the authority's decisions as ``CachedAuthority`` keeps them);
a check that needs the store or the authority provider is fetched and judged again. A refusal
is an entry that settles the intent or gives its lease back: nothing is sent.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from datetime import datetime

from outbox import Destination, Event, EventKind, Intent, Outbox, SecretsKeyError, StoreUnavailable
from outbox.destinations import deadline
from outbox.model import Hold
from outbox.tenants import as_allowed
from outbox.timestamps import later
from outbox.ttlcache import TtlCache

from .authority import AuthorityRequest, CachedAuthority, Decision, Verdict
from .circuit import Circuits
from .decision import Policy, denied, expired, set_aside
from .leases import UNREAD, Lease, Unread, log_fields
from .outcomes import Entry, Outcomes

log = logging.getLogger("outbox.sender")

#: How long a destination record is reused before it is read again.
DESTINATION_CACHE_SECONDS = 2.0
#: Destination records kept at most (a registry is small; the bound only keeps it so).
MAX_DESTINATIONS = 4096
#: The intents of a destination disabled, missing or holding settings the outbox does not take
#: (``Destination.unusable``) are looked at again after this long, or longer.
PARKED_SECONDS = 60.0


class Destinations:
    """The destinations' records as last read, each reused for ``DESTINATION_CACHE_SECONDS``, and
    read once however many leases ask while it is read (the cache runs out for all the leases of
    a cycle at once: each reading it would cost a connection and an opening of its secrets).
    Each is as the settings allow it now (``tenants.as_allowed``), not as it was registered."""

    def __init__(self, outbox: Outbox) -> None:
        self.store = outbox.store
        self.settings = outbox.settings
        self._read: TtlCache[str, Destination | None] = TtlCache(DESTINATION_CACHE_SECONDS, MAX_DESTINATIONS)
        self._reading: dict[str, asyncio.Task[Destination | None]] = {}

    def cached(self, destination_id: str) -> Destination | Unread | None:
        return self._read.get(destination_id, UNREAD)

    async def get(self, destination_id: str) -> Destination | None:
        found = self.cached(destination_id)
        if not isinstance(found, Unread):
            return found
        reading = self._reading.get(destination_id)
        if reading is None:
            reading = self._reading[destination_id] = asyncio.create_task(self._get(destination_id))
            reading.add_done_callback(_retrieved)
        return await asyncio.shield(reading)  # one lease given up does not cut the others' read

    async def _get(self, destination_id: str) -> Destination | None:
        try:
            found = await self.store.get_destination(destination_id)
            found = None if found is None else as_allowed(found, self.settings)
            if self._reading.get(destination_id) is asyncio.current_task():  # (not forgotten meanwhile)
                self._read.put(destination_id, found)
            return found
        finally:
            if self._reading.get(destination_id) is asyncio.current_task():
                del self._reading[destination_id]

    def forget(self, destination_id: str) -> None:
        """Read it again next time (it changed): a read under way is not kept either."""
        self._read.pop(destination_id)
        self._reading.pop(destination_id, None)

    def cancel(self) -> None:
        """Cut the reads under way (the worker is closing: no lease waits for them)."""
        for task in self._reading.values():
            task.cancel()


def _retrieved(task: asyncio.Task[Destination | None]) -> None:
    """Each lease that asked has the read's failure raised; none left asking is no warning."""
    if not task.cancelled():
        task.exception()


class Checks:
    """Judges a lease before its attempt, and counts the intents it set aside (``/healthz``
    and the console say so)."""

    def __init__(self, outbox: Outbox, worker: str, policy: Policy, authority: CachedAuthority, circuits: Circuits,
                 destinations: Destinations, outcomes: Outcomes) -> None:
        self.outbox = outbox
        self.clock = outbox.clock
        self.worker = worker
        self.policy = policy
        self.authority = authority
        self.circuits = circuits
        self.destinations = destinations
        self.outcomes = outcomes
        #: Intents set aside because the store cannot read their times: how many, and the last
        #: one's key and when.
        self.set_aside = 0
        self.last_set_aside: tuple[str, datetime] | None = None

    def judge(self, lease: Lease, now: datetime) -> tuple[Destination, Decision] | Entry | None:
        """The checks before an attempt, authority last, without awaiting: (destination,
        decision) to start it; the entry that settles it or gives it back (nothing sent); None
        when the destination or the decision must be read first (``fetch``)."""
        intent = lease.intent
        if intent.unreadable is not None:
            return self._set_aside(intent)
        destination = lease.destination
        if isinstance(destination, Unread):
            destination = self.destinations.cached(intent.destination)
            if isinstance(destination, Unread):
                return None
        if destination is None or destination.disabled or destination.unusable:
            why = ("is not registered" if destination is None else "is disabled" if destination.disabled
                   else f"holds {destination.unusable}")
            # parked, looking again less often the longer it stays so
            wait = max(PARKED_SECONDS, self.policy.backoff.delay(_claims(intent)))
            return self.outcomes.release(intent, f"destination {intent.destination!r} {why}",
                                         later(now, wait), applied=functools.partial(
                                             log.info, "not sent: destination %s; parked for %.0fs", why, wait,
                                             extra=log_fields(intent, None, self.worker)))
        if (ends := deadline(intent, destination)) is not None and now >= ends.at:
            return self.outcomes.settle(intent, expired(ends.why), [])
        if (paused := self.circuits.hold(destination, now)) is not None:
            return self.outcomes.release(intent, paused[1], paused[0])  # nothing sent, no attempt made
        if destination.paused_until is not None and now < destination.paused_until:  # leased before the pause
            return self.outcomes.release(intent, f"destination {intent.destination!r} is paused until "
                                         f"{destination.paused_until.isoformat()}: its receiver asked to wait",
                                         destination.paused_until)
        if destination.requires_approval and (refusal := approval_refusal(intent, now)):
            hold = Hold(intent.key, intent.fence, refusal, (Event(EventKind.HELD, now, self.worker, refusal),))
            return Entry(hold, intent, applied=functools.partial(
                log.info, "held: %s", refusal, extra=log_fields(intent, None, self.worker)))
        decision = lease.decision or self.authority.cached(intent.scope, intent.channel, intent.destination)
        lease.decision = None
        if decision is None:
            lease.destination = destination
            return None
        lease.destination = UNREAD  # judged again (a later attempt) with a fresh read
        if decision.verdict is Verdict.ALLOW:  # recorded on attempt_started
            return destination, decision
        checked = Event(EventKind.AUTHORITY_CHECKED, self.clock.now(), self.worker, decision.reason,
                        {"verdict": decision.verdict.value, "provider": decision.provider,
                         "revision": decision.revision})
        if decision.verdict is Verdict.UNAVAILABLE:
            wait = self.policy.backoff.delay(_claims(intent))  # backs off over repeated outages
            return self.outcomes.release(
                intent, decision.reason, later(self.clock.now(), wait), extra=[checked],
                applied=functools.partial(log.warning, "not sent: authority unavailable (%s); again in %.0fs",
                                          decision.reason, wait, extra=log_fields(intent, None, self.worker)))
        self.outbox.metrics.authority_denials.inc()
        return self.outcomes.settle(intent, denied(decision.reason), [checked])

    async def fetch(self, lease: Lease) -> Entry | None:
        """Read what a lease's checks need (its destination, then, where it would be sent, the
        authority's decision), for the next ``judge``. A store that cannot answer leaves it
        waiting, leased, for a later cycle; any other failure is the entry that gives it back."""
        intent = lease.intent
        try:
            if isinstance(lease.destination, Unread):
                lease.destination = await self.destinations.get(intent.destination)
            destination, now = lease.destination, self.clock.now()
            if (destination is not None and not destination.disabled and not destination.unusable
                    and ((ends := deadline(intent, destination)) is None or now < ends.at)
                    and not (destination.requires_approval and approval_refusal(intent, now))):
                lease.decision = await self.authority.check(_request(intent, destination))
        except StoreUnavailable as exc:  # its lease is confirmed again before it is taken next
            lease.destination, lease.picked = UNREAD, False
            lease.not_before = time.monotonic() + self.outbox.settings.poll_seconds
            log.warning("checks before the attempt wait: %s", exc, extra=log_fields(intent, None, self.worker))
        except Exception as exc:
            return self.failed(intent, exc)
        return None

    def failed(self, intent: Intent, exc: Exception) -> Entry:
        """The entry that gives back a lease whose checks failed with ``exc`` (nothing sent), due
        again after a backoff: one intent's fault, never its cycle's."""
        if isinstance(exc, SecretsKeyError):  # "not this key": a line
            log.warning("delivery interrupted: %s", exc, extra=log_fields(intent, None, self.worker))
        else:
            log.exception("delivery failed unexpectedly", extra=log_fields(intent, None, self.worker))
        retry = later(self.clock.now(), self.policy.backoff.delay(_claims(intent)))
        return self.outcomes.release(intent, f"{type(exc).__name__}: {exc} before an attempt started", retry)

    def _set_aside(self, intent: Intent) -> Entry:
        """Dead-letter an intent whose stored times cannot be read (``Intent.unreadable``), before
        any attempt: nothing is sent, so nothing is claimed about its delivery, and the intents
        beside it go on. An operator shows it and cancels it (it cannot be replayed)."""
        entry = self.outcomes.settle(intent, set_aside(intent.unreadable or ""), [])
        settled = entry.applied

        def counted() -> None:
            self.set_aside += 1
            self.last_set_aside = (intent.key, self.clock.now())
            if settled is not None:
                settled()

        entry.applied = counted
        return entry


def approval_refusal(intent: Intent, now: datetime) -> str | None:
    """Why an intent to a destination requiring approval may not be sent now, or None."""
    if intent.approved_digest is None:
        return "waiting for an operator's approval"
    if intent.approved_digest != intent.payload_digest:
        return "the approval was for another payload"
    if intent.approval_expires_at is None or now >= intent.approval_expires_at:
        return "the approval expired before the send; approve it again"
    return None


def _request(intent: Intent, destination: Destination) -> AuthorityRequest:
    return AuthorityRequest(intent.scope, intent.channel, intent.destination, intent.action_id, destination.owner)


def _claims(intent: Intent) -> int:
    """How many times ``intent`` has been claimed, near enough (each claim raises its fence, as a
    recovery and a probe do): what a wait backs off over when it is given back unsent, since
    then no attempt is counted."""
    return intent.fence
