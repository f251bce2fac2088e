"""The NATS channel's sending: a cycle's messages published on their destinations' connections,
then JetStream's acknowledgements of them all awaited as one, each message's result its own (see
the package's docstring for what decides an outcome)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Sequence
from typing import cast

import nats.errors
from nats.aio.client import Client
from nats.js.api import PubAck
from pydantic import ValidationError

from outbox import Destination, Intent, Outcome, Submission
from outbox.clock import Clock, SystemClock
from outbox.crash import crash_point

from .. import credentials, envelope
from ..channel import ProbeAnswer, Send, SendResult, by_destination, describe, invalid_settings
from .acks import Acks, answer
from .connections import Connection, Connections, Refused

#: The header JetStream's duplicate window keys on, and the one naming the stream that must store it.
MSG_ID, EXPECTED_STREAM = "Nats-Msg-Id", "Nats-Expected-Stream"


class NatsChannel:
    """Publishes intents to NATS JetStream destinations, one shared connection per destination."""

    def __init__(self, *, tls_context: ssl.SSLContext | None = None, clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()  # what a message's webhook-timestamp says
        self._connections = Connections(tls_context=tls_context)

    async def send(self, intent: Intent, destination: Destination, *, attempt_id: str, fence: int) -> SendResult:
        return (await self._publish(destination, [Send(intent, destination, attempt_id, fence)]))[0]

    async def send_many(self, sends: Sequence[Send]) -> list[SendResult]:
        """Publish every message on its destination's connection, then await JetStream's
        acknowledgements of them all as one wait (one timer, not one per message)."""
        return await by_destination(sends, self._publish)

    async def _publish(self, destination: Destination, sends: Sequence[Send]) -> list[SendResult]:
        """The results of one destination's messages, each in its place."""
        try:
            async with self._connections.held(destination) as entry:
                client, acks = await self._connections.opened(entry, destination)
                return await self._publish_on(entry, client, acks, destination, sends)
        except ValidationError as exc:  # registered before today's rules: it can never be published
            return [invalid_settings(exc)] * len(sends)
        except Refused as stop:
            return [SendResult(Submission.NOT_SUBMITTED, stop.outcome, stage="connect", error=stop.error)] * len(sends)

    async def _publish_on(self, entry: Connection, client: Client, acks: Acks, destination: Destination,
                          sends: Sequence[Send]) -> list[SendResult]:
        if entry.signing[0] != destination.secrets:
            entry.signing = (destination.secrets, credentials.split(destination.secrets)[0])
        signing = entry.signing[1]
        spec = entry.spec
        timestamp = int(self._clock.now().timestamp())
        results: list[SendResult | None] = [None] * len(sends)
        futures: dict[int, asyncio.Future[PubAck]] = {}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + destination.timeout_seconds
        for i, send in enumerate(sends):
            # publishing is held to the timeout too: on a stalled server each publish past 2 MiB unflushed
            # waits flush_timeout, and the rest of a large batch would wait one each
            if loop.time() > deadline:
                results[i] = SendResult(Submission.NOT_SUBMITTED, Outcome.RETRYABLE, stage="publish",
                                        error="not published: the connection took no more within the destination's "
                                              "timeout")
                continue
            body, headers = message(send, signing, timestamp, spec.expected_stream)
            reply, future = acks.expect()
            try:
                await client.publish(spec.subject, body, reply=reply, headers=headers)
                futures[i] = future
            except nats.errors.MaxPayloadError as exc:
                future.cancel()
                results[i] = SendResult(Submission.NOT_SUBMITTED, Outcome.REJECTED, stage="publish",
                                        error=f"refused: the message is larger than the server's max_payload: "
                                              f"{describe(exc)}")
            except (nats.errors.Error, OSError) as exc:  # closed, or its buffer full: nothing of it was queued
                future.cancel()
                results[i] = SendResult(Submission.NOT_SUBMITTED, Outcome.RETRYABLE, stage="publish",
                                        error=f"not published: {describe(exc)}")
        if futures:
            # From here a message may have reached the server: only JetStream's answer says one was not stored.
            crash_point("after_request")
            await asyncio.wait(futures.values(), timeout=destination.timeout_seconds)
        closed = client.is_closed
        # a PubAck not in time: the connection may be dead without knowing it (its pings notice after
        # minutes), so the next send opens a new one rather than waiting on this one again
        silent = any(not future.done() for future in futures.values())
        for i, future in futures.items():
            results[i] = answer(future, signing, closed=closed)
        if closed or silent:
            await self._connections.discard(entry, client)
        return cast(list[SendResult], results)

    async def probe(self, intent: Intent, destination: Destination, *, fence: int) -> ProbeAnswer:
        return ProbeAnswer(None, error="a NATS server cannot be asked whether a message was stored")

    async def aclose(self) -> None:
        await self._connections.aclose()


def message(send: Send, signing: tuple[str, ...], timestamp: int,
            expected_stream: str | None) -> tuple[bytes, dict[str, str]]:
    """A message's body and headers (``envelope``), with ``Nats-Msg-Id``, the idempotency key, so
    JetStream drops a resend within the stream's duplicate window, and the stream expected to store it."""
    body = envelope.payload(send)
    headers = {**dict(envelope.headers(send, signing, timestamp, body)), MSG_ID: send.intent.key}
    return body, headers if expected_stream is None else {**headers, EXPECTED_STREAM: expected_stream}
