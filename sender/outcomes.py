"""What a worker writes for an intent it holds, and what it counts and logs once that is applied.

An attempt that finished (or was cut short) is decided by ``sender.decision``, after asking a
receiver that answers the probe before an outcome is left ``unknown``; a lease given back before
any attempt started is a release, nothing sent. Each is an ``Entry``: the change for a cycle's
``Store.apply``, and what to do once the store applied it.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from outbox import Attempt, Destination, Event, EventKind, Intent, Outbox, Outcome, Status, Submission, channels
from outbox.ids import uuid7
from outbox.metrics import destination_label
from outbox.model import SETTLED, Hold, Release, Settle, Start

from .authority import Decision
from .channel import Channel, SendResult
from .decision import Fate, Policy, decide, pause_until, reconciled
from .leases import Lease, log_fields

log = logging.getLogger("outbox.sender")

#: What a store cannot keep in text, or a log should not show: controls but tab and newline.
CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


@dataclass(slots=True)
class Entry:
    """A worker change waiting for a cycle, and what to do once the store applied it."""

    change: Settle | Release | Hold
    intent: Intent
    attempt: Attempt | None = None
    applied: Callable[[], None] | None = None
    lease: Lease | None = None


class Outcomes:
    """Turns what became of an intent this worker holds into the entry that records it."""

    def __init__(self, outbox: Outbox, worker: str, policy: Policy, channel: Callable[[str], Channel],
                 forget_destination: Callable[[str], None]) -> None:
        self.outbox = outbox
        self.store = outbox.store
        self.clock = outbox.clock
        self.worker = worker
        self.policy = policy
        self._channel = channel  # the worker's, by name (a probe goes through the intent's channel)
        self._forget_destination = forget_destination  # a disabled destination is read again
        self._attempt_counts: dict[tuple[str, Outcome], Any] = {}  # the attempts counter's children
        self._last_checked: tuple[Decision, Destination, dict[str, Any]] | None = None  # (``_checked``)

    def start(self, intent: Intent, destination: Destination, decision: Decision, now: datetime) -> Start:
        """The change that starts the next attempt on ``intent``, with the authority's ``decision``
        and where the attempt goes (the attempt row does not keep it; the destination may change)."""
        attempt = Attempt(uuid7(), intent.attempts + 1, intent.fence, self.worker, now,
                          None, None, None, None, None, None, None, None)
        return Start(intent.key, intent.fence, attempt, Event(
            EventKind.ATTEMPT_STARTED, now, self.worker, None,
            {"attempt_id": attempt.attempt_id, "number": attempt.number, "fence": intent.fence,
             **self._checked(decision, destination)}))

    def _checked(self, decision: Decision, destination: Destination) -> dict[str, Any]:
        """What an ``attempt_started`` event says of its authority and its target: the same for
        every attempt on one decision to one destination record (both cached, so the same
        objects), so made once for them, not per attempt."""
        last = self._last_checked
        if last is None or last[0] is not decision or last[1] is not destination:
            last = self._last_checked = (decision, destination, {
                "authority": decision.reason, "authority_revision": decision.revision,
                "authority_checked_at": decision.checked_at and decision.checked_at.isoformat(),
                "target": channels.target(destination)})
        return last[2]

    async def finish(self, intent: Intent, destination: Destination, attempt: Attempt, result: SendResult,
                     seconds: float) -> Entry:
        """The entry of an attempt that came back with ``result`` after ``seconds``.

        A receiver's 410 (disable) or 429/503 with Retry-After (pause) is written at once, in a
        write of its own, not in the cycle's commit with the outcome: every worker's next claim
        must see it (the cycle's commit may wait for the next cycle, while the other leases to the
        destination would still be sent), and whoever reads the outcome then sees the destination
        as the receiver left it. A crash between the two leaves the pause or the disable, which the
        receiver asked for, and the attempt to the sweeper, as any attempt in flight."""
        now = self.clock.now()
        finished = finished_attempt(attempt, result, now, round(seconds * 1000, 3))
        if result.disable_destination:  # before the outcome, so whoever sees the 410 sees it disabled
            await self.store.disable_destination(destination.id, now)
            self._forget_destination(destination.id)
            log.warning("destination %s disabled: it answered 410 Gone", destination.id,
                        extra=log_fields(intent, attempt, self.worker))
        if (until := pause_until(result, now, self.policy)) is not None:  # at once too, as above
            await self.store.pause_destination(destination.id, until)
            self._forget_destination(destination.id)  # its leases not yet started are given back
            log.info("destination %s paused until %s: it answered %s with Retry-After", destination.id,
                     until.isoformat(), result.status_code, extra=log_fields(intent, attempt, self.worker))
        return await self.conclude(intent, destination, result, finished, finished_event(finished, self.worker),
                                   intent.fence)

    async def conclude(self, intent: Intent, destination: Destination, result: SendResult, finished: Attempt,
                       event: Event, fence: int) -> Entry:
        """Decide what a finished attempt means (reconciling an unknown outcome where the
        receiver answers the probe), recorded with ``event``; ``fence`` is the one the intent
        moves to (a probe raises it further)."""
        first = await self.store.first_submission_at(intent.key) \
            if result.outcome is Outcome.UNKNOWN else None
        fate = decide(intent, destination, result, attempts_made=finished.number,
                      first_submission_at=first, now=self.clock.now(), policy=self.policy)
        fate, reconciled, fence = await self._reconcile(intent, destination, fate, fence)
        return self._decided(intent, destination, result, finished, fate, [event, *reconciled], fence)

    def not_started(self, intent: Intent, destination: Destination, attempt: Attempt, why: str) -> Entry:
        """A start whose apply failed or was cut: never sent, so ``not_submitted`` (our own
        refusal before the send is proof)."""
        now = self.clock.now()
        result = SendResult(Submission.NOT_SUBMITTED, Outcome.RETRYABLE, error=f"{why} before the request was sent")
        finished = finished_attempt(attempt, result, now, 0.0)
        fate = decide(intent, destination, result, attempts_made=finished.number, first_submission_at=None,
                      now=now, policy=self.policy)
        return self._decided(intent, destination, result, finished, fate,
                             [finished_event(finished, self.worker)], intent.fence)

    def _decided(self, intent: Intent, destination: Destination, result: SendResult, finished: Attempt,
                 fate: Fate, events: list[Event], fence: int) -> Entry:
        counted = (destination_label(destination), result.outcome)
        child = self._attempt_counts.get(counted)
        if child is None:  # a child looked up once per destination and outcome, not per attempt
            child = self._attempt_counts[counted] = self.outbox.metrics.attempts.labels(
                counted[0], result.outcome.value)
        child.inc()
        return self.settle(intent, fate, events, attempt=finished,
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
        event = Event(EventKind.RECONCILED, now, self.worker, answer.error,
                      {"state": answer.state, "fence": probe_fence, "status_code": answer.status_code,
                       "external_id": answer.external_id})
        return reconciled(fate, answer, now, self.policy), [event], probe_fence

    def settle(self, intent: Intent, fate: Fate, events: list[Event], *,
               attempt: Attempt | None = None, new_fence: int | None = None) -> Entry:
        """The change that gives ``intent`` its fate, and what is counted and logged once it
        is applied."""
        now = self.clock.now()
        data = {"next_attempt_at": fate.next_attempt_at.isoformat()} if fate.next_attempt_at else {}
        events = [*events, Event(fate.event, now, self.worker, fate.reason, data)]
        change = Settle(intent.key, intent.fence, fate.status, tuple(events),
                        last_error=None if fate.status is Status.DELIVERED else fate.reason,
                        next_attempt_at=fate.next_attempt_at,
                        attempts=attempt.number if attempt is not None else None,  # counted even when its start
                        attempt=attempt, new_fence=new_fence)  # could not be recorded
        return Entry(change, intent, attempt, functools.partial(self._settled, intent, fate, attempt, now, data))

    def _settled(self, intent: Intent, fate: Fate, attempt: Attempt | None, now: datetime,
                 data: dict[str, str]) -> None:
        metrics = self.outbox.metrics
        if fate.status is Status.DELIVERED:
            metrics.latency.observe(max(0.0, (now - intent.created_at).total_seconds()))
            if log.isEnabledFor(logging.DEBUG):
                log.debug("delivered", extra=log_fields(intent, attempt, self.worker))
        elif fate.status is Status.PENDING:
            log.info("%s; next attempt at %s", fate.reason, data.get("next_attempt_at"),
                     extra=log_fields(intent, attempt, self.worker))
        else:  # dead, unknown, revoked: what someone will be asked about
            if fate.status is Status.DEAD:
                metrics.dead_lettered.inc()
            elif fate.status is Status.UNKNOWN:
                metrics.unknown.inc()
            log.warning("%s: %s", fate.status.value, fate.reason, extra=log_fields(intent, attempt, self.worker))
        if fate.status in SETTLED:
            self.outbox.settled.notify()

    def release(self, intent: Intent, reason: str, due: datetime, *, extra: list[Event] | None = None,
                applied: Callable[[], None] | None = None) -> Entry:
        """The change that gives a lease back without an attempt having started: nothing was sent."""
        return Entry(Release(intent.key, intent.fence, due, (
            *(extra or []), Event(EventKind.RELEASED, self.clock.now(), self.worker, reason,
                                  {"next_attempt_at": due.isoformat()}))), intent, applied=applied)


def follow_up(entry: Entry, outbox: Outbox) -> None:
    """What follows once the store applied ``entry``: its own follow-up (counting, logging), and,
    for an intent with an ordering key, a wake-up, since the next of its key may be claimable."""
    if entry.applied is not None:
        entry.applied()
    if entry.intent.ordering_key is not None:
        outbox.enqueued.notify()


def cut_short(sent: bool, result: SendResult | None, why: str) -> SendResult:
    """What is known of a send cut short (shutdown, a failure of our own code or of the store).
    Never handed to the channel, the attempt is ``not_submitted``: our own refusal before the
    send is proof. Handed over, it keeps the result that came back, or else is ``maybe_submitted``."""
    if not sent:
        return SendResult(Submission.NOT_SUBMITTED, Outcome.RETRYABLE, error=f"{why} before the request was sent")
    if result is None:
        return SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, error=f"{why} while the request was in flight")
    return result


def _storable(text: str | None) -> str | None:
    """A receiver's words (a reply, an id, an error quoting them) as every store can keep them:
    bytes that were not UTF-8 (kept by a client as lone surrogates) and control characters
    become U+FFFD. Otherwise one odd byte in a server's banner would fail the outcome's write
    and turn an answered attempt into an unknown one."""
    if text is None:
        return None
    return CONTROLS.sub("\ufffd", text.encode("utf-8", "replace").decode("utf-8"))


def finished_attempt(attempt: Attempt, result: SendResult, at: datetime,
                     duration_ms: float | None = None) -> Attempt:
    """``attempt`` with its result recorded (built directly: ``dataclasses.replace`` reads the
    fields anew on every call, a few microseconds per delivery)."""
    return Attempt(attempt.attempt_id, attempt.number, attempt.fence, attempt.worker, attempt.started_at, at,
                   result.submission, result.outcome, result.status_code, _storable(result.reply),
                   _storable(result.external_id), _storable(result.error), duration_ms, result.stage)


def finished_event(attempt: Attempt, worker: str) -> Event:
    """The ``attempt_finished`` event: what the attempt came back with."""
    return Event(EventKind.ATTEMPT_FINISHED, attempt.finished_at or attempt.started_at, worker, attempt.error, {
        "attempt_id": attempt.attempt_id,
        "submission": attempt.submission.value if attempt.submission else None,
        "outcome": attempt.outcome.value if attempt.outcome else None,
        "status_code": attempt.status_code,
    })
