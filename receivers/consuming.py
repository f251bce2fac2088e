"""The broker-neutral engine of the idempotent queue consumers (RabbitMQ, NATS JetStream).

A queue broker redelivers a message whenever it was not acknowledged: a consumer that died after
its handler ran and before the ack, a connection lost in between, a sender that published the same
action twice. ``MessageConsumer`` claims each message's (scope, idempotency key) in a record store
before its handler runs, stores the completion after, and acknowledges the message only once that
completion is durable; a message delivered again finds its key completed and is acknowledged
without running. What is broker-specific (how messages are fetched, acknowledged, refused for good
and handed back for a later delivery) is a subclass's: ``receivers.rabbitmq``, ``receivers.nats``.

Per fetched batch it pays one claim transaction and one completion transaction; handlers run one
at a time, in the batch's order. The metadata is read and checked by ``messages.MessageReader``,
the reader the Kafka consumer uses too, and each message settled is a CONSUMER span
(``receivers.tracing``) in the trace its headers carry, current while its handler runs.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

from opentelemetry import trace
from opentelemetry.trace import TracerProvider

from . import tracing
from .engine import IdempotencyContext, purge_forever
from .messages import MessageReader, Refusal, Refused
from .records import (
    Busy,
    Claimed,
    ClaimRequest,
    ClaimResult,
    Mismatch,
    RecordStore,
    Replay,
    StaleFence,
    StoredResponse,
    distinct_runs,
)
from .tracing import Settled
from .wire import EXTERNAL_ID, KAFKA_FENCE

log = logging.getLogger("receivers.consuming")
_EXTERNAL_ID = EXTERNAL_ID.lower()

M = TypeVar("M")

#: Your effect for one message; ``context.epoch`` rises on a takeover, to fence downstream writes.
Handler = Callable[[M, IdempotencyContext], Awaitable[object]]
#: Told about every message that will never be handled (plain or ``async``).
ErrorCallback = Callable[[M, Refused], "Awaitable[object] | object"]


def log_refusal(message: object, refused: Refused) -> None:
    """The default ``on_error``: a warning."""
    log.warning("refused a message (key %r): %s: %s", refused.key, refused.reason.value, refused.detail)


@dataclass(slots=True)
class Fetched(Generic[M]):
    """One fetched message and what became of it in this batch."""

    message: M
    key: str | None = None
    request: ClaimRequest | None = None  # None: refused before claiming
    refused: Refused | None = None
    answer: ClaimResult | None = None


class MessageConsumer(ABC, Generic[M]):
    """Runs ``handler`` at most once per (``scope``, idempotency key) over a broker's messages.

    ``start()`` opens the store, starts consuming and the processing loop; ``stop()`` lets the
    message in flight finish, stores its completion, acknowledges it, hands back what was fetched
    and not started, and closes the store; ``async with`` does the two, and ``run()`` waits for the
    loop (it raises what stopped it).
    """

    #: ``messaging.system`` of the spans, and what the warning without secrets calls the source.
    system = ""
    source = "queue"

    def __init__(
        self,
        scope: str,
        store: RecordStore,
        handler: Handler[M],
        *,
        on_error: ErrorCallback[M] = log_refusal,
        retention_seconds: float = 86_400,
        lease_seconds: float = 60,
        max_batch: int = 100,
        verify_digest: bool = True,
        secrets: str | Sequence[str] | None = None,
        signature_tolerance_seconds: float | None = None,
        retry_seconds: float = 0.2,
        max_retry_seconds: float = 30,
        purge_seconds: float = 300,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        if not scope:
            raise ValueError("the consumer needs a scope: the idempotency key is scoped to it")
        if not 0 < lease_seconds < retention_seconds:
            raise ValueError("lease_seconds must be positive and shorter than retention_seconds")
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.scope = scope
        self.store = store
        self.handler = handler
        self.on_error = on_error
        self.retention = timedelta(seconds=retention_seconds)
        self.lease = timedelta(seconds=lease_seconds)
        self.max_batch = max_batch
        #: The signature no older than the tolerance: the retention by default, beyond which a
        #: replayed message's key may be purged and could run again.
        self.reader = MessageReader(scope, secrets=secrets, verify_digest=verify_digest, clock=clock,
                                    source=self.source,
                                    signature_tolerance_seconds=(retention_seconds if signature_tolerance_seconds
                                                                 is None else signature_tolerance_seconds))
        self.retry_seconds = retry_seconds
        self.max_retry_seconds = max_retry_seconds
        self.purge_seconds = purge_seconds
        self.clock = clock
        self.tracer_provider = tracer_provider  # None: the global provider
        self.tracer = tracing.tracer(tracer_provider)
        self._stopping = asyncio.Event()
        self._loop: asyncio.Task[None] | None = None
        self._purger: asyncio.Task[None] | None = None
        self._closing: asyncio.Future[None] | None = None
        #: Retries in a row per key (or per message without one), for the backoff.
        self._failures: dict[str, int] = {}

    # -- what each broker adds ---------------------------------------------------------------

    @abstractmethod
    async def _subscribe(self) -> None:
        """Start receiving messages."""

    @abstractmethod
    async def _unsubscribe(self) -> None:
        """Stop receiving, and hand back what was received and not settled."""

    @abstractmethod
    async def _fetch(self) -> list[M]:
        """The next batch (at most ``max_batch``), waiting about a second at most; [] when none."""

    @abstractmethod
    def _metadata(self, message: M) -> Iterable[tuple[str, object]]:
        """The message's headers as (name, value) pairs."""

    @abstractmethod
    def _body(self, message: M) -> bytes:
        """The message's body."""

    @abstractmethod
    def _where(self, message: M) -> str:
        """Where the message was read from, in words (logs, and the completion's External-Id)."""

    @abstractmethod
    def _span(self, message: M) -> tuple[str, dict[str, Any]]:
        """The message's span name and the broker's attributes."""

    @abstractmethod
    async def _ack(self, message: M) -> None:
        """Acknowledge: never deliver it again."""

    @abstractmethod
    async def _refuse(self, message: M) -> None:
        """Settle a message that can never succeed (to a dead-letter, where the broker has one)."""

    @abstractmethod
    async def _retry(self, message: M, delay: float) -> None:
        """Have the message delivered again after ``delay`` seconds."""

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the store, start consuming and the processing loop."""
        if self._loop is not None:
            return
        await self.store.open()
        try:
            await self._subscribe()
        except BaseException:
            await self.store.close()
            raise
        self._purger = asyncio.create_task(purge_forever(self.store, self.purge_seconds, self.clock))
        self._loop = asyncio.create_task(self._consume())

    async def run(self) -> None:
        """Start if needed and process until ``stop()``; raises what ended the loop otherwise."""
        await self.start()
        assert self._loop is not None
        await self._loop

    async def stop(self) -> None:
        """Stop fetching, finish the message in flight, store completions and acknowledge them,
        hand back the rest, then close the store. Safe to call more than once."""
        self._stopping.set()
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        if self._loop is not None:
            await asyncio.wait([self._loop])  # what ended it was logged, and is run()'s to raise
        if self._purger is not None:
            self._purger.cancel()
        try:
            await self._unsubscribe()
        finally:
            await self.store.close()

    async def __aenter__(self) -> MessageConsumer[M]:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # -- the loop ----------------------------------------------------------------------------

    async def _consume(self) -> None:
        try:
            while not self._stopping.is_set():
                messages = await self._next()
                read, metadata, body = self.reader.read, self._metadata, self._body
                items = [read(Fetched(message), metadata(message), body(message)) for message in messages]
                for run in distinct_runs(items, _identity):  # a repeat is claimed once the first is completed
                    if self._stopping.is_set():  # not claimed: straight back to the broker
                        for item in run:
                            await self._retry(item.message, 0)
                    else:
                        await self._settle_run(run)
        except Exception:
            log.exception("the idempotent consumer %r stopped", self.scope)
            raise

    async def _next(self) -> list[M]:
        """The next batch, or nothing once ``stop()`` is called (a batch that arrives meanwhile is
        handed back)."""
        fetch = asyncio.ensure_future(self._fetch())
        stopped = asyncio.ensure_future(self._stopping.wait())
        await asyncio.wait((fetch, stopped), return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not self._stopping.is_set():
            return fetch.result()  # raises what the fetch raised
        try:
            late = await fetch  # a fetch waits a second at most: whatever it got goes back
        except Exception:
            return []
        for message in late:
            await self._retry(message, 0)
        return []

    async def _settle_run(self, items: Sequence[Fetched[M]]) -> None:
        """Claim the run's keys (one transaction), settle each message in order, store the
        completions (one transaction) and only then acknowledge their messages."""
        began = time.monotonic()
        claiming = [item for item in items if item.request is not None]
        if claiming:
            now = self.clock()
            try:
                answers = await self.store.claim_many([item.request for item in claiming if item.request], now=now,
                                                      lease_until=now + self.lease, expires_at=now + self.retention)
            except Exception as exc:  # any store failure: never run a handler unclaimed
                log.error("idempotency store unavailable, retrying: %r", exc)
                for item in items:
                    await self._retry(item.message, self._backoff(item))
                return
            for item, answer in zip(claiming, answers, strict=True):
                item.answer = answer
        deadline = began + self.lease.total_seconds() / 2
        traced = tracing.recording(self.tracer_provider)
        handled: list[tuple[Fetched[M], int]] = []
        releasing: list[tuple[Fetched[M], int]] = []
        for n, item in enumerate(items):
            if self._stopping.is_set() or (n and time.monotonic() > deadline):
                for later in items[n:]:  # not started: back to the broker, claims released
                    if isinstance(later.answer, Claimed):
                        releasing.append((later, later.answer.epoch))
                    await self._retry(later.message, 0)
                break
            if traced:
                name, attributes = self._span(item.message)
                with tracing.message_span(self.tracer, name, list(self._metadata(item.message)), item, attributes):
                    ran = await self._settle(item)
            else:
                ran = await self._settle(item)
            if isinstance(item.answer, Claimed):
                (handled if ran else releasing).append((item, item.answer.epoch))
        if releasing:
            await self._release(releasing)
        if handled and await self._complete(handled):
            for item, _ in handled:
                await self._ack(item.message)
        else:
            for item, _ in handled:  # stopping with the store down: they run again once their lease ends
                await self._retry(item.message, 0)

    async def _settle(self, item: Fetched[M]) -> bool:
        """Run the handler under a claim (True when it returned; the message waits for its
        completion to be stored), or settle a message whose handler is not to run."""
        answer = item.answer
        if isinstance(answer, Claimed):
            assert item.key is not None
            try:
                await self.handler(item.message, IdempotencyContext(self.scope, item.key, answer.epoch))
            except Exception as exc:
                log.exception("handler failed on %s (key %r); it will be retried", self._where(item.message),
                              item.key, exc_info=exc)
                tracing.failed(trace.get_current_span(), exc)
                await self._retry(item.message, self._backoff(item))
                return False
            self._succeeded(item)
            return True
        if isinstance(answer, Replay):  # delivered again: its effect was made and recorded
            self._succeeded(item)
            await self._ack(item.message)
            return False
        if isinstance(answer, Busy):  # another consumer runs it: ask again once it may be done
            await self._retry(item.message, min(self._backoff(item), answer.retry_after))
            return False
        try:
            reported = self.on_error(item.message, refusal(item))
            if inspect.isawaitable(reported):
                await reported
        except Exception:
            log.exception("on_error failed on %s; it will be called again", self._where(item.message))
            await self._retry(item.message, self._backoff(item))
            return False
        self._succeeded(item)
        await self._refuse(item.message)
        return False

    def _backoff(self, item: Fetched[M]) -> float:
        """The delay before ``item`` is delivered again: doubling with each retry in a row (capped)."""
        name = item.key or self._where(item.message)
        failures = self._failures[name] = self._failures.get(name, 0) + 1
        return float(min(self.max_retry_seconds, self.retry_seconds * 2 ** (failures - 1)))

    def _succeeded(self, item: Fetched[M]) -> None:
        if self._failures:
            self._failures.pop(item.key or self._where(item.message), None)

    async def _complete(self, handled: list[tuple[Fetched[M], int]]) -> bool:
        """Store the handled messages' completions (each keeps where it was read as its
        External-Id), retrying while the store is down; False only when stopping with the store
        still down."""
        done = [(item.request.identity, epoch, StoredResponse(200, ((_EXTERNAL_ID, self._where(item.message)),), b""))
                for item, epoch in handled if item.request]
        stored = await store_completions(self.store, done, expires_at=lambda: self.clock() + self.retention,
                                         retry_seconds=self.retry_seconds, max_retry_seconds=self.max_retry_seconds,
                                         stopping=self._stopping)
        if stored is None:
            return False
        log_taken_over(handled, stored)
        return True

    async def _release(self, claimed: list[tuple[Fetched[M], int]]) -> None:
        try:
            await self.store.release_many([(item.request.identity, epoch) for item, epoch in claimed if item.request])
        except Exception as exc:
            log.error("could not release %d claims: %r; they are retried once their lease ends", len(claimed), exc)



def refusal(item: Settled) -> Refused:
    """Why a message whose handler is not to run is refused: what its reader found, or what the
    store answered (the key used for another payload, a fence lower than one seen)."""
    answer = item.answer
    if isinstance(answer, Mismatch):
        return Refused(Refusal.KEY_REUSED, "the key was used for another payload (digest)", item.key)
    if isinstance(answer, StaleFence):
        assert item.request is not None
        return Refused(Refusal.STALE_FENCE, f"{KAFKA_FENCE} {item.request.fence} is lower than "
                       f"{answer.min_fence}, already seen for this key", item.key)
    assert item.refused is not None
    return item.refused


async def store_completions(store: RecordStore, done: list[tuple[str, int, StoredResponse]], *,
                            expires_at: Callable[[], datetime], retry_seconds: float, max_retry_seconds: float,
                            stopping: asyncio.Event) -> list[bool] | None:
    """Store ``done``'s completions, retrying while the store is down (the delay doubling from
    ``retry_seconds``): whether each was stored (False: taken over first), or None when
    ``stopping`` with the store still down (those messages run again once their lease ends)."""
    delay = retry_seconds
    while True:
        try:
            return await store.complete_many(done, expires_at=expires_at())
        except Exception as exc:
            if stopping.is_set():
                log.error("could not store %d completions while stopping: %r; they are not acknowledged and run "
                          "again once their lease ends", len(done), exc)
                return None
            log.error("could not store %d completions, retrying in %.1f s: %r", len(done), delay, exc)
            try:
                await asyncio.wait_for(stopping.wait(), delay)
            except TimeoutError:
                pass
            delay = min(max_retry_seconds, delay * 2)


def log_taken_over(handled: Sequence[tuple[Settled, int]], stored: list[bool]) -> None:
    """Warn of each completion the store did not take: its key was taken over (a higher epoch)."""
    if all(stored):
        return
    for (item, epoch), ok in zip(handled, stored, strict=True):
        if not ok:
            log.warning("key %r was taken over (epoch %d is stale) before its completion was stored", item.key, epoch)


def _identity(item: Fetched[Any]) -> str:
    """What ``distinct_runs`` tells runs apart by: the claim's identity (always holding a ``:``),
    or, for a message refused before claiming, a name no other can have."""
    return item.request.identity if item.request is not None else str(id(item))
