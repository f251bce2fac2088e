"""The RabbitMQ channel's sending: a cycle's messages published on their destinations' channels,
then the broker's confirms of them all awaited as one, each message's result its own (see the
package's docstring for what decides an outcome)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Sequence
from typing import cast

from aiormq.exceptions import DeliveryError, PublishError
from pamqp.commands import Basic
from pydantic import ValidationError

from outbox import Destination, Intent, Outcome, Submission
from outbox.clock import Clock, SystemClock
from outbox.crash import crash_point

from .. import credentials, envelope
from ..channel import ProbeAnswer, Send, SendResult, by_destination, invalid_settings
from .links import Link, Links, Refused, describe
from .spec import SHORT, RabbitSpec

#: What the broker says with basic.return when no queue is bound for a message.
NO_ROUTE = 312


class RabbitChannel:
    """Publishes intents to RabbitMQ destinations, one shared connection and channel per destination."""

    def __init__(self, *, tls_context: ssl.SSLContext | None = None, clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()  # what a message's timestamp and webhook-timestamp say
        self._links = Links(tls_context=tls_context)

    async def send(self, intent: Intent, destination: Destination, *, attempt_id: str, fence: int) -> SendResult:
        return (await self._publish(destination, [Send(intent, destination, attempt_id, fence)]))[0]

    async def send_many(self, sends: Sequence[Send]) -> list[SendResult]:
        """Publish every message on its destination's channel, then await the broker's confirms
        of them all as one wait (one timer, not one per message)."""
        return await by_destination(sends, self._publish)

    async def _publish(self, destination: Destination, sends: Sequence[Send]) -> list[SendResult]:
        """The results of one destination's messages, each in its place."""
        try:
            link = await self._links.link(destination)
        except ValidationError as exc:  # registered before today's rules: it can never be published
            return [invalid_settings(exc)] * len(sends)
        try:
            return await self._published(link, destination, sends)
        finally:
            await self._links.release(link)

    async def _published(self, link: Link, destination: Destination, sends: Sequence[Send]) -> list[SendResult]:
        try:
            channel = await self._links.opened(link, destination)
        except Refused as stop:
            return [stop.result()] * len(sends)
        spec = link.spec
        signing = self._signing(link, destination)
        now = self._clock.now()
        results: list[SendResult | None] = [None] * len(sends)
        confirms: dict[int, asyncio.Task[object]] = {}
        keys = [routing_key(spec, send.intent) for send in sends]
        for i, (send, key) in enumerate(zip(sends, keys, strict=True)):
            if len(key.encode()) > SHORT:
                results[i] = SendResult(Submission.NOT_SUBMITTED, Outcome.REJECTED, stage="publish",
                                        error=f"refused: the ordering key is longer than a routing key may be "
                                              f"({SHORT} bytes)")
                continue
            body = envelope.payload(send)
            properties = Basic.Properties(
                content_type="application/json", delivery_mode=2, message_id=send.intent.key, timestamp=now,
                headers=dict(envelope.headers(send, signing, int(now.timestamp()), body)))
            confirms[i] = asyncio.ensure_future(channel.basic_publish(
                body, exchange=spec.exchange, routing_key=key, properties=properties, mandatory=True))
        if confirms:
            # From here a publish frame may leave: only the broker's confirm can say what became of it.
            crash_point("after_request")
            await asyncio.wait(confirms.values(), timeout=destination.timeout_seconds)
        # No answer (the channel or its connection closed, or the broker silent in time): the
        # connection is replaced, rather than waiting on its heartbeat to find it half-open.
        broken = False
        for i, confirm in confirms.items():
            result = results[i] = confirmed(confirm, spec, keys[i], sends[i].attempt_id, signing)
            broken |= result.submission is Submission.MAYBE_SUBMITTED
        if broken or channel.is_closed:
            await self._links.discard(link, channel)
        return cast(list[SendResult], results)

    @staticmethod
    def _signing(link: Link, destination: Destination) -> tuple[str, ...]:
        if link.signing[0] != destination.secrets:
            link.signing = (destination.secrets, credentials.split(destination.secrets)[0])
        return link.signing[1]

    async def probe(self, intent: Intent, destination: Destination, *, fence: int) -> ProbeAnswer:
        return ProbeAnswer(None, error="a RabbitMQ broker cannot be asked whether a message was published")

    async def aclose(self) -> None:
        await self._links.aclose()


def routing_key(spec: RabbitSpec, intent: Intent) -> str:
    """The message's routing key: the intent's ordering key when the destination routes by it
    and the intent has one, else the destination's routing key."""
    return (intent.ordering_key if spec.routing_key_from == "ordering_key" else None) or spec.routing_key


def external_id(spec: RabbitSpec, key: str, attempt_id: str) -> str:
    """``exchange/routing-key/attempt``: where the broker routed it, and the attempt whose message
    it is (its ``outbox-attempt-id`` header); RabbitMQ gives a message no id of its own."""
    return f"{spec.exchange or 'amq.default'}/{key}/{attempt_id}"


def confirmed(confirm: asyncio.Task[object], spec: RabbitSpec, key: str, attempt_id: str,
              signing: tuple[str, ...]) -> SendResult:
    """What the broker answered for a published message (no answer in time: the task is still
    pending, and cancelled)."""
    where = f"exchange {spec.exchange or 'amq.default'} with routing key {key!r}"
    if not confirm.done():
        confirm.cancel()
        return SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, stage="publish",
                          error="no confirm from the broker: TimeoutError: the destination's timeout passed")
    exc = confirm.exception() if not confirm.cancelled() else asyncio.CancelledError()
    if isinstance(exc, PublishError):
        returned = exc.frame
        assert isinstance(returned, Basic.Return)
        hint = "; bind a queue to it for this key" if returned.reply_code == NO_ROUTE else ""
        return SendResult(Submission.SUBMITTED, Outcome.REJECTED, stage="publish", answered=True,
                          error=f"the broker returned the message, it reached no queue: {where} "
                                f"({returned.reply_code} {returned.reply_text}){hint}")
    if isinstance(exc, DeliveryError):
        return SendResult(Submission.SUBMITTED, Outcome.RETRYABLE, stage="publish", answered=True,
                          error=f"the broker refused the message (basic.nack): {where}")
    if exc is not None:  # the channel or connection closed with the message in flight: it may have been routed
        return SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, stage="publish",
                          error=f"no confirm from the broker: {describe(exc)}")
    ident = external_id(spec, key, attempt_id)
    return SendResult(Submission.SUBMITTED, Outcome.DELIVERED, stage="done", answered=True, external_id=ident,
                      reply=f"confirmed by the broker: {where}" + ("" if signing else ", unsigned: the destination "
                                                                    "holds no signing secret"))
