"""The idempotent NATS JetStream consumer: at-least-once messages, at-most-once effects (nats-py).

JetStream delivers a message again whenever it was not acknowledged within the consumer's
``ack_wait``: a consumer that died after its handler ran and before the ack, a connection lost in
between, a message the sender published twice outside the stream's duplicate window.
``IdempotentJetStreamConsumer`` pulls batches from a durable consumer with explicit acks; each
message's (scope, idempotency key), read from the NATS headers the NATS channel puts on it, is
claimed before its handler runs, and the message is acknowledged only once its completion is
stored (``receivers.consuming``). A message refused for good is terminated (``term()``, never
delivered again); one to retry is negatively acknowledged with a delay (``nak(delay=...)``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy

from .consuming import Handler, MessageConsumer
from .records import RecordStore

__all__ = ["IdempotentJetStreamConsumer"]

log = logging.getLogger("receivers.nats")


class IdempotentJetStreamConsumer(MessageConsumer[Msg]):
    """Runs ``handler`` at most once per (``scope``, idempotency key) over the caller-made durable
    pull consumer ``durable`` of ``stream`` (``ack_policy`` explicit; its ``ack_wait`` longer than
    a batch takes to handle, else a message still being handled is delivered again, and waits for
    its own claim), through ``js``, a connected JetStream context. ``scope`` defaults to the
    durable consumer's name: the processes pulling from it share their keys.

    Each fetch asks for ``max_batch`` messages (100) and waits a second at most. The other options
    are ``receivers.consuming.MessageConsumer``'s.
    """

    system = "nats"
    source = "stream"

    def __init__(self, js: JetStreamContext, stream: str, durable: str, store: RecordStore, handler: Handler[Msg], *,
                 scope: str | None = None, **options: Any) -> None:
        super().__init__(scope or durable, store, handler, **options)
        self.js = js
        self.stream = stream
        self.durable = durable
        self._subscription: JetStreamContext.PullSubscription | None = None

    async def _subscribe(self) -> None:
        info = await self.js.consumer_info(self.stream, self.durable)
        if info.config.ack_policy != AckPolicy.EXPLICIT:  # the server answers it as text
            raise ValueError(f"consumer {self.durable!r} of stream {self.stream!r} must have ack_policy explicit: a "
                             "message is acknowledged only once its completion is stored")
        self._subscription = await self.js.pull_subscribe_bind(self.durable, self.stream)

    async def _unsubscribe(self) -> None:
        if self._subscription is not None:
            try:
                await self._subscription.unsubscribe()
            except Exception as exc:  # the connection is gone: what was not acknowledged is delivered again
                log.warning("could not unsubscribe from %s/%s: %r", self.stream, self.durable, exc)
            self._subscription = None

    async def _fetch(self) -> list[Msg]:
        assert self._subscription is not None
        try:
            return await self._subscription.fetch(self.max_batch, timeout=1.0)
        except nats.errors.TimeoutError:
            return []


    def _metadata(self, message: Msg) -> Iterable[tuple[str, object]]:
        return (message.headers or {}).items()

    def _body(self, message: Msg) -> bytes:
        return message.data

    def _where(self, message: Msg) -> str:
        return f"{self.stream}/{message.metadata.sequence.stream}"

    def _span(self, message: Msg) -> tuple[str, dict[str, Any]]:
        return f"process {message.subject}", {
            "messaging.system": "nats", "messaging.operation.type": "process", "messaging.operation.name": "process",
            "messaging.destination.name": message.subject, "messaging.consumer.group.name": self.scope,
            "messaging.nats.stream": self.stream, "messaging.nats.stream_sequence": message.metadata.sequence.stream,
        }

    async def _ack(self, message: Msg) -> None:
        try:
            await message.ack()
        except Exception as exc:  # delivered again after ack_wait, its key completed: acknowledged then
            log.warning("could not acknowledge %s: %r; it is delivered again and skipped", self._where(message), exc)

    async def _refuse(self, message: Msg) -> None:
        try:
            await message.term()
        except Exception as exc:
            log.warning("could not terminate %s: %r; it is delivered again and refused again", self._where(message),
                        exc)

    async def _retry(self, message: Msg, delay: float) -> None:
        try:
            await message.nak(delay=delay if delay > 0 else None)
        except Exception as exc:  # delivered again after ack_wait
            log.debug("could not nak %s: %r", self._where(message), exc)
