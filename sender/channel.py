"""What a channel does with one attempt, and what it must report back."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, cast

from opentelemetry.context import Context
from pydantic import ValidationError

from outbox import Destination, Intent, Outcome, Submission
from outbox.channels import ChannelKind

#: How much of a receiver's reply is kept with an attempt.
REPLY_BYTES = 2048


@dataclass(slots=True)
class SendResult:
    """The facts of one attempt, as far as the control path could establish them."""

    submission: Submission
    outcome: Outcome
    status_code: int | None = None
    reply: str | None = None
    external_id: str | None = None
    error: str | None = None
    retry_after: float | None = None  # seconds the receiver asked us to wait
    disable_destination: bool = False  # the receiver said the endpoint is gone for good
    #: The receiver answered, whatever it said (an HTTP status, an SMTP reply, a broker's error):
    #: a destination's circuit counts only sends that got no answer at all.
    answered: bool = False
    #: How far the attempt got, for a channel that goes through stages (recorded with it).
    stage: str | None = None


@dataclass(frozen=True, slots=True)
class ProbeAnswer:
    """A receiver's answer to a reconcile probe; ``state`` None when it could not be asked."""

    state: str | None  # completed | in_progress | absent
    status_code: int | None = None  # the completed request's stored status
    reply: str | None = None
    external_id: str | None = None
    error: str | None = None


class Channel(Protocol):
    """Delivers intents of one kind (webhook, email, kafka)."""

    async def send(self, intent: Intent, destination: Destination, *, attempt_id: str, fence: int) -> SendResult:
        """Make one attempt. Never raises for a delivery failure: classify it instead.
        ``not_submitted`` only with proof that nothing was written."""
        ...

    async def probe(self, intent: Intent, destination: Destination, *, fence: int) -> ProbeAnswer:
        """Ask the receiver what became of ``intent`` while raising its fence to ``fence``."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


@dataclass(slots=True)
class Send:
    """One attempt of a batch handed to ``BatchChannel.send_many``: what ``Channel.send`` takes,
    and the attempt's span context, whose trace the channel puts on the wire (``tracing.carrier``)."""

    intent: Intent
    destination: Destination
    attempt_id: str
    fence: int
    context: Context | None = None


class BatchChannel(Channel, Protocol):
    """A channel that takes a cycle's attempts at once, for one request or one wait for them all."""

    async def send_many(self, sends: Sequence[Send]) -> list[SendResult]:
        """Make every attempt (each one's start is already recorded) and return one result per
        send, in its place. Never raises for a delivery failure, and one failing attempt does not
        decide the others' results: ``not_submitted`` only with proof for that attempt, and
        ``maybe_submitted`` for every one that may have gone out when the answers are lost."""
        ...


async def by_destination(sends: Sequence[Send],
                         send_group: Callable[[Destination, Sequence[Send]], Awaitable[list[SendResult]]],
                         ) -> list[SendResult]:
    """Each destination's sends (as its settings read now: its id and ``updated_at``) handed to
    ``send_group`` as one group, the groups at once, and every result put back in its send's place.
    A group whose coroutine raises an Exception (an error of our own, not a receiver's answer) gets
    ``maybe_submitted``/``unknown`` for each of its sends, since they may have gone out; the other
    groups keep their own results (a broker's confirm is not thrown away for another's bug)."""
    groups: dict[tuple[str, datetime], list[int]] = {}
    for i, send in enumerate(sends):
        groups.setdefault((send.destination.id, send.destination.updated_at), []).append(i)
    answered = await asyncio.gather(*(send_group(sends[places[0]].destination, [sends[i] for i in places])
                                      for places in groups.values()), return_exceptions=True)
    results: list[SendResult | None] = [None] * len(sends)
    for places, answers in zip(groups.values(), answered, strict=True):
        if isinstance(answers, BaseException):
            if not isinstance(answers, Exception):  # a cancellation or an exit: not ours to classify
                raise answers
            answers = [lost(answers)] * len(places)
        for i, result in zip(places, answers, strict=True):
            results[i] = result
    return cast(list[SendResult], results)


def describe(exc: BaseException) -> str:
    """An error as an attempt records it: its type and text (its type again when it has none), bounded."""
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:500]


def lost(exc: Exception) -> SendResult:
    """A send that failed on an error of our own after it was handed over: it may have gone out."""
    return SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN,
                      error=f"the send failed unexpectedly, it may have gone out: {type(exc).__name__}: {exc}"[:500])


def invalid_settings(exc: ValidationError) -> SendResult:
    """A destination whose settings were stored before today's rules: it can never be sent to."""
    return SendResult(Submission.NOT_SUBMITTED, Outcome.REJECTED, stage="connect",
                      error=f"refused: the destination's settings are not valid: {exc.errors()[0]['msg']}")


def batching(channel: Channel) -> BatchChannel | None:
    """``channel`` when it takes batches (has ``send_many``), else None: it is sent one by one."""
    return cast(BatchChannel, channel) if callable(getattr(channel, "send_many", None)) else None


@dataclass(frozen=True, slots=True, kw_only=True)
class ChannelModule(ChannelKind):
    """What a channel's module registers (``outbox.channels``): the core's declaration plus
    ``open``, which builds the implementation one worker sends through, ``concurrency`` sends
    at once. A channel's driver is imported by its module, so only when the channel is named."""

    open: Callable[[int], Channel]
