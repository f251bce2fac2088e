"""The Kafka channel's sending: a cycle's records handed to their destinations' producers, then
the broker's answers to them all awaited as one, each record's result its own (see the package's
docstring for what decides an outcome)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Sequence
from typing import cast

from aiokafka.errors import KafkaError, MessageSizeTooLargeError
from aiokafka.structs import RecordMetadata
from pydantic import ValidationError

from outbox import Destination, Intent, Outcome, Submission
from outbox.clock import Clock, SystemClock
from outbox.crash import crash_point

from .. import credentials, envelope
from ..channel import ProbeAnswer, Send, SendResult, by_destination, describe, invalid_settings
from .answers import Refused, answer
from .connections import GUARD
from .producers import Producer, Producers


class KafkaChannel:
    """Produces intents to Kafka destinations, one shared producer per destination."""

    def __init__(self, *, tls_context: ssl.SSLContext | None = None, clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()  # what a record's webhook-timestamp says
        self._producers = Producers(tls_context=tls_context)

    async def send(self, intent: Intent, destination: Destination, *, attempt_id: str, fence: int) -> SendResult:
        return (await self._produce(destination, [Send(intent, destination, attempt_id, fence)]))[0]

    async def send_many(self, sends: Sequence[Send]) -> list[SendResult]:
        """Hand every record to its destination's producer, then await the broker's answers to
        them all as one (one timer, not one per record): the producer packs them into its
        per-partition requests as it would concurrent sends."""
        return await by_destination(sends, self._produce)

    async def _produce(self, destination: Destination, sends: Sequence[Send]) -> list[SendResult]:
        """The results of one destination's records, each in its place."""
        try:
            entry = await self._producers.entry(destination)
        except ValidationError as exc:  # registered before today's rules: it can never be produced
            return [invalid_settings(exc)] * len(sends)
        guarding = GUARD.set(entry.guard)
        try:
            return await self._produced(entry, destination, sends)
        finally:
            GUARD.reset(guarding)

    async def _produced(self, entry: Producer, destination: Destination, sends: Sequence[Send]) -> list[SendResult]:
        try:
            producer = await self._producers.started(entry, destination)
            places = await self._producers.partitions(producer, entry, [record_key(send.intent) for send in sends],
                                            destination)
        except Refused as stop:
            return [stop.result()] * len(sends)
        if entry.signing[0] != destination.secrets:
            entry.signing = (destination.secrets, credentials.split(destination.secrets)[0])
        signing = entry.signing[1]
        timestamp = int(self._clock.now().timestamp())
        results: list[SendResult | None] = [None] * len(sends)
        futures: dict[int, asyncio.Future[RecordMetadata]] = {}
        failed: SendResult | None = None  # the producer failed for good: no later record is handed to it
        for i, (send, place) in enumerate(zip(sends, places, strict=True)):
            if isinstance(place, Refused):
                results[i] = place.result()
                continue
            if failed is not None:
                results[i] = failed
                continue
            value, headers = record(send, signing, timestamp)
            try:
                futures[i] = await producer.send(place.topic, value, key=place.key, partition=place.partition,
                                                 headers=headers)
            except MessageSizeTooLargeError as exc:
                results[i] = SendResult(Submission.NOT_SUBMITTED, Outcome.REJECTED, stage="produce",
                                        error=f"refused: the record is larger than max_request_size: {describe(exc)}")
            except KafkaError as exc:  # the producer failed for good, before taking the record
                results[i] = failed = SendResult(Submission.NOT_SUBMITTED, Outcome.RETRYABLE, stage="produce",
                                                 error=describe(exc))
        if futures:
            # From here a produce request carrying the records may leave: only the broker can say one did not.
            crash_point("after_request")
            await asyncio.wait(futures.values(), timeout=destination.timeout_seconds)
        ended = False
        for i, future in futures.items():
            results[i], lost = answer(future, signing)
            ended |= lost
        if failed is not None or ended:
            await self._producers.discard(entry, producer)
        return cast(list[SendResult], results)

    async def probe(self, intent: Intent, destination: Destination, *, fence: int) -> ProbeAnswer:
        return ProbeAnswer(None, error="a Kafka broker cannot be asked whether a record was appended")

    async def aclose(self) -> None:
        await self._producers.aclose()


def record_key(intent: Intent) -> bytes:
    """The record's key: the ordering key when the intent has one (a key's records stay in one
    partition, in order), else its action id."""
    return (intent.ordering_key or intent.action_id).encode()


def record(send: Send, signing: tuple[str, ...], timestamp: int) -> tuple[bytes, list[tuple[str, bytes]]]:
    """A record's value and headers (``envelope``: its identity, its attempt's span, and its
    signature when the destination holds a signing secret)."""
    value = envelope.payload(send)
    return value, [(name, text.encode()) for name, text in envelope.headers(send, signing, timestamp, value)]
