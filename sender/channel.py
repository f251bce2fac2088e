"""What a channel does with one attempt, and what it must report back."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from opentelemetry.context import Context

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


def batching(channel: Channel) -> BatchChannel | None:
    """``channel`` when it takes batches (has ``send_many``), else None: it is sent one by one."""
    return cast(BatchChannel, channel) if callable(getattr(channel, "send_many", None)) else None


@dataclass(frozen=True, slots=True, kw_only=True)
class ChannelModule(ChannelKind):
    """What a channel's module registers (``outbox.channels``): the core's declaration plus
    ``open``, which builds the implementation one worker sends through, ``concurrency`` sends
    at once. A channel's driver is imported by its module, so only when the channel is named."""

    open: Callable[[int], Channel]
