"""The idempotent RabbitMQ consumer: at-least-once messages, at-most-once effects (aio-pika).

RabbitMQ delivers a message again whenever it was not acknowledged: a consumer whose connection
dropped after its handler ran and before the ack, a message the sender published twice (a retry
after an unknown outcome). ``IdempotentRabbitMQConsumer`` consumes a queue with manual acks and a
prefetch window; each message's (scope, idempotency key), read from the AMQP headers the RabbitMQ
channel puts on it, is claimed before its handler runs, and the message is acknowledged only once
its completion is stored (``receivers.consuming``). A message refused for good is rejected without
requeue, so a dead-letter exchange bound to the queue takes it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

import aio_pika.abc

from .consuming import Handler, MessageConsumer
from .records import RecordStore

__all__ = ["IdempotentRabbitMQConsumer"]

log = logging.getLogger("receivers.rabbitmq")

Message = aio_pika.abc.AbstractIncomingMessage
#: How long ``stop()`` waits for the broker to confirm the consumer is cancelled.
_CLOSE_SECONDS = 5.0


class IdempotentRabbitMQConsumer(MessageConsumer[Message]):
    """Runs ``handler`` at most once per (``scope``, idempotency key) over a caller-declared
    ``queue`` (on a channel the caller opened; a robust one reconnects by itself). ``scope``
    defaults to the queue's name: the consumers sharing a queue share their keys.

    ``prefetch`` is the channel's window of unacknowledged messages (set with ``basic.qos``); a
    batch is what has arrived, up to ``max_batch`` (``prefetch`` by default). A message to retry
    (its handler raised, its key is in progress elsewhere) stays unacknowledged for its backoff and
    is then requeued (``nack(requeue=True)``), so it keeps its place in the window meanwhile. The
    other options are ``receivers.consuming.MessageConsumer``'s.
    """

    system = "rabbitmq"
    source = "queue"

    def __init__(self, queue: aio_pika.abc.AbstractQueue, store: RecordStore, handler: Handler[Message], *,
                 scope: str | None = None, prefetch: int = 100, max_batch: int | None = None, **options: Any) -> None:
        if prefetch < 1:
            raise ValueError("prefetch must be at least 1: without a window RabbitMQ pushes the whole queue")
        super().__init__(scope or queue.name, store, handler, max_batch=max_batch or prefetch, **options)
        self.queue = queue
        self.prefetch = prefetch
        self._arrived: asyncio.Queue[Message] = asyncio.Queue()
        self._tag: str | None = None
        #: Messages held for a retry's backoff, each with its timer: requeued when it fires or on stop.
        self._held: dict[Message, asyncio.TimerHandle] = {}
        self._requeues: set[asyncio.Task[None]] = set()  # held until done

    async def _subscribe(self) -> None:
        await self.queue.channel.set_qos(prefetch_count=self.prefetch)
        self._tag = await self.queue.consume(self._arrive, no_ack=False)

    async def _arrive(self, message: Message) -> None:
        self._arrived.put_nowait(message)

    async def _unsubscribe(self) -> None:
        for timer in self._held.values():
            timer.cancel()
        held = list(self._held)
        self._held.clear()
        if self.queue.channel.is_closed:  # the broker requeued what was unacknowledged when it closed
            return
        if self._tag is not None:  # first: what the broker sends until it confirms arrives before that
            try:
                await asyncio.wait_for(self.queue.cancel(self._tag), _CLOSE_SECONDS)
            except Exception as exc:
                log.warning("could not stop consuming %r: %r", self.queue.name, exc)
            self._tag = None
        for message in [*held, *(self._arrived.get_nowait() for _ in range(self._arrived.qsize()))]:
            await self._requeue(message)
        if self._requeues:
            await asyncio.wait(list(self._requeues))

    async def _fetch(self) -> list[Message]:
        if self._arrived.empty():  # wait a second at most, and not at all once stopping
            getting = asyncio.ensure_future(self._arrived.get())
            stopped = asyncio.ensure_future(self._stopping.wait())
            await asyncio.wait((getting, stopped), timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if not getting.done():
                getting.cancel()  # a get not done took nothing
                return []
            batch = [getting.result()]
        else:
            batch = [self._arrived.get_nowait()]
        while len(batch) < self.max_batch and not self._arrived.empty():
            batch.append(self._arrived.get_nowait())
        return batch

    def _metadata(self, message: Message) -> Iterable[tuple[str, object]]:
        return (message.headers or {}).items()

    def _body(self, message: Message) -> bytes:
        return message.body

    def _where(self, message: Message) -> str:
        return f"{self.queue.name}/{message.message_id or message.delivery_tag}"

    def _span(self, message: Message) -> tuple[str, dict[str, Any]]:
        return f"process {self.queue.name}", {
            "messaging.system": "rabbitmq", "messaging.operation.type": "process",
            "messaging.operation.name": "process", "messaging.destination.name": self.queue.name,
            "messaging.rabbitmq.destination.routing_key": message.routing_key or "",
            "messaging.message.id": message.message_id or "", "messaging.consumer.group.name": self.scope,
        }

    async def _ack(self, message: Message) -> None:
        try:
            await message.ack()
        except Exception as exc:  # the channel closed first: delivered again, its key completed, it is acked then
            log.warning("could not acknowledge %s: %r; it is delivered again and skipped", self._where(message), exc)

    async def _refuse(self, message: Message) -> None:
        try:
            await message.reject(requeue=False)
        except Exception as exc:
            log.warning("could not reject %s: %r; it is delivered again and refused again", self._where(message), exc)

    async def _retry(self, message: Message, delay: float) -> None:
        if delay <= 0:
            await self._requeue(message)
            return
        self._held[message] = asyncio.get_running_loop().call_later(delay, self._release_held, message)

    def _release_held(self, message: Message) -> None:
        if self._held.pop(message, None) is not None:
            task = asyncio.ensure_future(self._requeue(message))
            self._requeues.add(task)
            task.add_done_callback(self._requeues.discard)

    async def _requeue(self, message: Message) -> None:
        try:
            await message.nack(requeue=True)
        except Exception as exc:  # the channel closed: the broker requeued it already
            log.debug("could not requeue %s: %r", self._where(message), exc)
