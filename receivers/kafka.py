"""The idempotent Kafka consumer: at-least-once records, at-most-once effects (aiokafka).

Kafka redelivers a record whenever its offset was not committed: a consumer that crashed after
its handler ran and before the commit, a rebalance in between, a sender that produced the same
action twice. ``IdempotentConsumer`` claims each record's (consumer group, idempotency key) in a
record store before its handler runs, stores the completion after, and commits the offset only
then; a redelivered record finds its key completed and is skipped.

Given the destination's signing secrets, it also checks each record's signature (the Kafka
channel signs as webhooks are signed, ``receivers.wire``) before anything is claimed: a record
anyone else wrote to the topic under a real key, unsigned or badly signed, never runs and never
claims the key, so the genuine record still does.

Per fetched batch it pays one store transaction and one offset commit, not one of each per record:
a batch's completions are stored together with a later batch's claims (the stores'
``complete_and_claim``), and its offsets committed once that transaction is durable; when no
records are waiting the completions are stored on their own at once. The transaction runs while
the batch before it is handled, when the next batch is already fetched and names no key of the
batch in flight (whose claim it would find in progress): so a batch's handlers wait for its
claims only when the store is slower than the handlers before it. Handlers run one at a time,
in each partition's order; a record that must be retried holds its partition (seek back, pause,
resume after a backoff) while the others go on. Each record settled is a CONSUMER span
(``receivers.tracing``) in the trace its headers carry, current while its handler runs.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from opentelemetry import trace
from opentelemetry.trace import TracerProvider

from . import tracing
from .consuming import log_taken_over, refusal, store_completions
from .engine import IdempotencyContext, purge_forever
from .kafka_records import (
    FetchedRecord,
    Record,
    RecordReader,
    Refusal,
    Refused,
    digest_of,
    payload_matches,
)
from .records import Busy, Claimed, RecordStore, Replay, StoredResponse
from .wire import EXTERNAL_ID

__all__ = ["ErrorCallback", "Handler", "IdempotentConsumer", "Record", "Refusal", "Refused", "digest_of",
           "payload_matches"]

log = logging.getLogger("receivers.kafka")
_EXTERNAL_ID = EXTERNAL_ID.lower()

#: Your effect for one record; ``context.epoch`` rises on a takeover, to fence downstream writes.
Handler = Callable[[Record, IdempotencyContext], Awaitable[object]]
ErrorCallback = Callable[[Record, Refused], "Awaitable[object] | object"]


def _log_refusal(record: Record, refused: Refused) -> None:
    log.warning("refused %s/%d/%d (key %r): %s: %s", record.topic, record.partition, record.offset,
                refused.key, refused.reason.value, refused.detail)


class IdempotentConsumer:
    """Runs ``handler`` at most once per (consumer group, idempotency key), over a caller-made
    ``AIOKafkaConsumer`` (subscribed, not started; ``group_id`` set, ``enable_auto_commit=False``).

    ``start()`` opens the store and starts the Kafka consumer and the processing loop;
    ``stop()`` lets the record in flight finish, stores its completion, commits, and closes both;
    ``async with`` does the two, and ``run()`` waits for the loop (it raises what stopped it).
    """

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        store: RecordStore,
        handler: Handler,
        *,
        on_error: ErrorCallback = _log_refusal,
        retention_seconds: float = 86_400,
        lease_seconds: float = 60,
        max_batch: int = 500,
        verify_digest: bool = True,
        secrets: str | Sequence[str] | None = None,
        signature_tolerance_seconds: float | None = None,
        retry_seconds: float = 0.2,
        max_retry_seconds: float = 30,
        purge_seconds: float = 300,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        # aiokafka has no public accessors for these two settings.
        group: str | None = getattr(consumer, "_group_id", None)
        if not group:
            raise ValueError("the consumer needs a group_id: the idempotency key is scoped to the consumer group")
        if getattr(consumer, "_enable_auto_commit", True):
            raise ValueError("create the consumer with enable_auto_commit=False: an offset is committed only "
                             "once its record's completion is stored")
        if not 0 < lease_seconds < retention_seconds:
            raise ValueError("lease_seconds must be positive and shorter than retention_seconds")
        self.consumer = consumer
        self.store = store
        self.handler = handler
        self.on_error = on_error
        self.group = group
        self.retention = timedelta(seconds=retention_seconds)
        self.lease = timedelta(seconds=lease_seconds)
        self.max_batch = max_batch
        #: Reads each record's key, digest, fence and signature (the signature no older than the
        #: tolerance: the retention by default, beyond which a replayed record's key may be purged
        #: and could run again).
        self.reader = RecordReader(group, secrets=secrets, verify_digest=verify_digest, clock=clock,
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
        #: Partitions held for a retry: when each resumes, and how many retries in a row it had.
        self._resume_at: dict[TopicPartition, float] = {}
        self._failures: dict[TopicPartition, int] = {}
        #: Records handled whose completions are not stored yet (with their claims' epochs), and the
        #: offsets that wait for them: both go with the next round's claims, or alone (``_flush``).
        self._done: list[tuple[FetchedRecord, int]] = []
        self._offsets: dict[TopicPartition, int] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the store, start the Kafka consumer (joining its group) and the processing loop."""
        if self._loop is not None:
            return
        await self.store.open()
        try:
            await self.consumer.start()
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
        """Stop fetching, finish the record in flight, store completions and commit their offsets,
        then stop the Kafka consumer and close the store. Safe to call more than once."""
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
            await self.consumer.stop()
        finally:
            await self.store.close()

    async def __aenter__(self) -> IdempotentConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # -- the loop ----------------------------------------------------------------------------

    async def _consume(self) -> None:
        queue: list[FetchedRecord] = []  # read, not yet in a round
        ahead: _Round | None = None  # the next round, its claims already on their way
        void: set[TopicPartition] = set()  # partitions sought back since ``ahead``'s records were read
        try:
            while not self._stopping.is_set():
                self._resume_due()
                if ahead is None:
                    if not queue:
                        waiting = bool(self._done or self._offsets)
                        queue = self._read(await self._fetch(wait=not waiting))  # completions waiting take what is here
                        if not queue:
                            if waiting:
                                await self._flush()
                            continue
                    ahead, queue = self._begin(queue, overlap=False)
                    void = set()
                current, ahead = ahead, None
                assert current is not None  # begun without overlap, a round always is
                held: set[TopicPartition] = set()
                if await self._ready(current, void, held):
                    if not self._stopping.is_set():
                        queue = queue or self._read(await self._fetch(wait=False))
                        # The next round's claims are taken while this round's handlers run, unless
                        # it names a key this round holds (that claim would find its own in progress).
                        if queue and not self._stopping.is_set():
                            ahead, queue = self._begin(queue, overlap=True, beside=current.identities)
                    await self._handle(current, void, held)
                queue = _outside(queue, held)
                void = held
            if ahead is not None:  # stopping: what it claimed is released
                held = set()
                if await self._ready(ahead, void, held):
                    await self._handle(ahead, void, held)
                ahead = None
            await self._flush()
        except Exception:
            log.exception("the idempotent consumer of group %r stopped", self.group)
            raise
        finally:
            if ahead is not None:  # the loop failed with claims on their way: they wait out their lease
                ahead.cancel()

    def _read(self, batch: dict[TopicPartition, list[Record]]) -> list[FetchedRecord]:
        read = self.reader.read
        return [read(partition, record) for partition, records in batch.items() for record in records]

    async def _fetch(self, *, wait: bool) -> dict[TopicPartition, list[Record]]:
        """The next batch (without ``wait``, only records already fetched), or nothing once
        ``stop()`` is called (unprocessed records are not committed, so they are fetched again)."""
        if not wait:
            return await self._top_up(await self.consumer.getmany(timeout_ms=0, max_records=self.max_batch))
        wait_ms = 1000
        if self._resume_at:
            wait_ms = max(0, min(wait_ms, int((min(self._resume_at.values()) - time.monotonic()) * 1000)))
        fetch = asyncio.ensure_future(self.consumer.getmany(timeout_ms=wait_ms, max_records=self.max_batch))
        stopped = asyncio.ensure_future(self._stopping.wait())
        await asyncio.wait((fetch, stopped), return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if self._stopping.is_set():
            fetch.cancel()
            await asyncio.wait([fetch])
            if not fetch.cancelled():
                fetch.exception()  # retrieved: a failed fetch while stopping is not worth reporting
            return {}
        return await self._top_up(fetch.result())  # raises what getmany raised

    async def _top_up(self, batch: dict[TopicPartition, list[Record]]) -> dict[TopicPartition, list[Record]]:
        """``batch`` with what is already fetched added, up to ``max_batch``: each batch costs a
        store transaction."""
        count = sum(len(records) for records in batch.values())
        while batch and count < self.max_batch:
            more = await self.consumer.getmany(timeout_ms=0, max_records=self.max_batch - count)
            if not more:
                break
            for partition, records in more.items():
                batch.setdefault(partition, []).extend(records)
                count += len(records)
        return batch

    def _resume_due(self) -> None:
        now = time.monotonic()
        for partition, when in list(self._resume_at.items()):
            if when <= now:
                del self._resume_at[partition]
                if partition in self.consumer.assignment():  # else a rebalance took it away
                    self.consumer.resume(partition)

    def _begin(self, queue: list[FetchedRecord], *, overlap: bool,
               beside: set[str] | frozenset[str] = frozenset()) -> tuple[_Round | None, list[FetchedRecord]]:
        """Take the next round from ``queue`` and begin its store transaction (its claims, with the
        completions waiting), and the rest of the queue. With ``overlap`` the transaction runs as a
        task beside the round in flight, unless the round names a key in ``beside``: then nothing
        is begun (None)."""
        items, rest, identities = _next_round(queue)
        if overlap and not identities.isdisjoint(beside):
            return None, queue
        done, offsets = self._done, self._offsets
        self._done, self._offsets = [], {}
        round_ = _Round(items, identities, done, offsets, time.monotonic())
        claiming = [item for item in items if item.request is not None]
        if claiming or done:
            step = self._claim(claiming, done)
            round_.step = asyncio.ensure_future(step) if overlap else step
        return round_, rest

    async def _claim(self, claiming: list[FetchedRecord], done: list[tuple[FetchedRecord, int]]) -> None:
        """Store ``done``'s completions and claim ``claiming``, in one transaction; each claimed
        record is given its answer."""
        now = self.clock()
        stored, answers = await self.store.complete_and_claim(
            _completions(done), [item.request for item in claiming if item.request], now=now,
            lease_until=now + self.lease, expires_at=now + self.retention)
        log_taken_over(done, stored)
        for item, answer in zip(claiming, answers, strict=True):
            item.answer = answer

    async def _ready(self, round_: _Round, void: set[TopicPartition], held: set[TopicPartition]) -> bool:
        """Wait for the round's transaction, then commit the offsets its completions made safe.
        False when the store failed: no handler of the round runs, its partitions are held (added
        to ``held``), and the completions it carried are stored alone, retried until they are."""
        if round_.step is not None:
            try:
                await round_.step
            except Exception as exc:  # any store failure: back off, never run a handler unclaimed
                log.error("idempotency store unavailable, retrying: %r", exc)
                await self._store_alone(round_.done, round_.offsets)
                for item in round_.items:
                    if item.partition not in void and item.partition not in held:
                        self._hold(item, held)
                return False
        await self._commit(round_.offsets)
        return True

    async def _handle(self, round_: _Round, void: set[TopicPartition], held: set[TopicPartition]) -> None:
        """Run the round's handlers in order, leaving their completions to wait for the next
        round's transaction. A record of a partition sought back since it was read (``void``, or
        ``held`` here) is skipped and its claim released. Once stopping, or once half the claims'
        lease has gone, the records not started are released too, and (not stopping) their
        partitions sought back to read them again."""
        items = round_.items
        deadline = round_.began + self.lease.total_seconds() / 2
        traced = tracing.recording(self.tracer_provider)  # asked once a round, not per record
        handled: list[tuple[FetchedRecord, int]] = []
        releasing: list[tuple[FetchedRecord, int]] = []  # claims whose handler failed or did not start
        handler, group, offsets, monotonic = self.handler, self.group, self._offsets, time.monotonic
        for n, item in enumerate(items):
            claim = item.answer if isinstance(item.answer, Claimed) else None
            if (void or held) and (item.partition in void or item.partition in held):
                if claim:
                    releasing.append((item, claim.epoch))
                continue
            if (stopping := self._stopping.is_set()) or (n and monotonic() > deadline):
                for later in items[n:]:
                    if isinstance(later.answer, Claimed):
                        releasing.append((later, later.answer.epoch))
                    if not (stopping or later.partition in void or later.partition in held):
                        self._rewind(later, held)
                break
            if claim is not None and not traced:  # the usual record, its handler called here: no frame of its own
                try:
                    await handler(item.record, IdempotencyContext(group, item.key, claim.epoch))  # type: ignore[arg-type]  # a claim has a key
                    settled = True
                except Exception as exc:
                    settled = self._failed(item, exc)
            else:
                step = self._settle(item) if claim is None else self._run(item, claim.epoch)
                settled = await (self._traced(item, step) if traced else step)
            if claim is not None:
                (handled if settled else releasing).append((item, claim.epoch))
            if settled:
                offsets[item.partition] = item.record.offset + 1
                if self._failures:
                    self._failures.pop(item.partition, None)
            else:
                self._hold(item, held)
        if releasing:
            await self._release(releasing)
        self._done += handled

    async def _traced(self, item: FetchedRecord, step: Awaitable[bool]) -> bool:
        """``step`` (settling ``item``) inside the record's CONSUMER span."""
        with tracing.consumer_span(self.tracer, self.group, item):
            return await step

    async def _run(self, item: FetchedRecord, epoch: int) -> bool:
        """Run the handler under a claim; False (retry it) when it raised."""
        assert item.key is not None
        try:
            await self.handler(item.record, IdempotencyContext(self.group, item.key, epoch))
        except Exception as exc:
            return self._failed(item, exc)
        return True

    def _failed(self, item: FetchedRecord, exc: Exception) -> bool:
        """Report a handler's exception (it is retried): False, not settled."""
        log.exception("handler failed on %s/%d/%d (key %r); it will be retried", item.record.topic,
                      item.record.partition, item.record.offset, item.key, exc_info=exc)
        tracing.failed(trace.get_current_span(), exc)
        return False

    async def _settle(self, item: FetchedRecord) -> bool:
        """Settle a record whose handler is not to run: True to move past it, False to retry it."""
        answer = item.answer
        if isinstance(answer, Replay):
            return True
        if isinstance(answer, Busy):  # another member runs it (after a rebalance): wait for its outcome
            return False
        try:
            reported = self.on_error(item.record, refusal(item))
            if inspect.isawaitable(reported):
                await reported
        except Exception:
            log.exception("on_error failed on %s/%d/%d; it will be called again", item.record.topic,
                          item.record.partition, item.record.offset)
            return False
        return True

    def _hold(self, item: FetchedRecord, held: set[TopicPartition]) -> None:
        """Retry ``item`` later: seek its partition back to it and pause it for a backoff that
        doubles with each retry in a row (capped), or until a busy key's lease runs out."""
        partition = item.partition
        failures = self._failures[partition] = self._failures.get(partition, 0) + 1
        delay = min(self.max_retry_seconds, self.retry_seconds * 2 ** (failures - 1))
        if isinstance(item.answer, Busy):
            delay = min(delay, item.answer.retry_after)
        if self._rewind(item, held):
            self.consumer.pause(partition)
            self._resume_at[partition] = time.monotonic() + delay

    def _rewind(self, item: FetchedRecord, held: set[TopicPartition]) -> bool:
        """Seek ``item``'s partition back to it (the records read after it are void: ``held``);
        False when a rebalance took the partition away (its next owner starts from the committed
        offset)."""
        held.add(item.partition)
        if item.partition not in self.consumer.assignment():
            return False
        self.consumer.seek(item.partition, item.record.offset)
        return True

    async def _flush(self) -> None:
        """Store the completions waiting, on their own (no claim comes to take them along), and
        commit the offsets that waited for them."""
        done, offsets = self._done, self._offsets
        self._done, self._offsets = [], {}
        await self._store_alone(done, offsets)

    async def _store_alone(self, handled: list[tuple[FetchedRecord, int]], offsets: dict[TopicPartition, int]) -> None:
        if handled and not await self._complete(handled):
            for item, _ in handled:  # stopping with the store down: commit nothing from here on
                offsets[item.partition] = min(offsets[item.partition], item.record.offset)
        await self._commit(offsets)

    async def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        if not offsets:
            return
        try:
            await self.consumer.commit(offsets)
        except KafkaError as exc:  # a rebalance moved a partition: its next owner skips what we completed
            log.warning("could not commit offsets %s: %r; their records are skipped when fetched again",
                        {f"{p.topic}/{p.partition}": o for p, o in offsets.items()}, exc)

    async def _complete(self, handled: list[tuple[FetchedRecord, int]]) -> bool:
        """Store the handled records' completions, retrying while the store is down; False only
        when stopping with the store still down (their offsets are not committed, and those records
        run again once their lease ends)."""
        stored = await store_completions(self.store, _completions(handled),
                                         expires_at=lambda: self.clock() + self.retention,
                                         retry_seconds=self.retry_seconds, max_retry_seconds=self.max_retry_seconds,
                                         stopping=self._stopping)
        if stored is None:
            return False
        log_taken_over(handled, stored)
        return True

    async def _release(self, claimed: list[tuple[FetchedRecord, int]]) -> None:
        try:
            await self.store.release_many([(item.request.identity, epoch) for item, epoch in claimed
                                           if item.request])
        except Exception as exc:
            log.error("could not release %d claims: %r; they are retried once their lease ends", len(claimed), exc)

def _next_round(queue: list[FetchedRecord]) -> tuple[list[FetchedRecord], list[FetchedRecord], set[str]]:
    """The longest head of ``queue`` naming each key once (a repeat is claimed once the first
    settled, then replays rather than waiting on its own claim), the rest, and the head's keys."""
    keys = [item.request.identity for item in queue if item.request is not None]
    distinct = set(keys)
    if len(distinct) == len(keys):  # the usual batch, each key once: one round, found at C speed
        return queue, [], distinct
    seen: set[str] = set()
    for n, item in enumerate(queue):
        if item.request is not None:
            if item.request.identity in seen:
                return queue[:n], queue[n:], seen
            seen.add(item.request.identity)
    raise AssertionError("a repeated key was counted but not found")


def _outside(queue: list[FetchedRecord], held: set[TopicPartition]) -> list[FetchedRecord]:
    """``queue`` without the records of partitions sought back (they are read again)."""
    return [item for item in queue if item.partition not in held] if held else queue


@dataclass(slots=True)
class _Round:
    """Records settled together: their claims and the completions that waited for them are one
    store transaction (``step``), begun while the round before is still being handled when it can be."""

    items: list[FetchedRecord]
    identities: set[str]
    done: list[tuple[FetchedRecord, int]]  # the completions its transaction stores
    offsets: dict[TopicPartition, int]  # committed once those completions are stored
    began: float  # time.monotonic() before its claims were taken: its handlers start within half the lease
    step: Awaitable[None] | None = None

    def cancel(self) -> None:
        if isinstance(self.step, asyncio.Future):
            self.step.cancel()
        elif inspect.iscoroutine(self.step):
            self.step.close()


def _completions(handled: list[tuple[FetchedRecord, int]]) -> list[tuple[str, int, StoredResponse]]:
    """The completions of handled records, as the stores' ``complete_many`` takes them: each
    stores where its effect was made (``External-Id: topic/partition/offset``)."""
    return [(item.request.identity, epoch, StoredResponse(200, ((_EXTERNAL_ID, f"{item.record.topic}/"
             f"{item.record.partition}/{item.record.offset}"),), b"")) for item, epoch in handled if item.request]
