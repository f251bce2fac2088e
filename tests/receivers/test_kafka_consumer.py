"""The idempotent Kafka consumer against real brokers (noida-db; a subset on Tansu) and real record
stores (memory, a SQLite file, PostgreSQL). Nothing of Kafka is faked; where a fault must land
at one precise point (a commit that fails or a process that dies before it), that one call is
replaced."""

from __future__ import annotations

import asyncio
import hashlib
import json
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import rfc8785
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import CommitFailedError

from receivers import (
    IdempotencyContext,
    IdempotentConsumer,
    MemoryRecordStore,
    SqliteRecordStore,
    State,
    wire,
)
from receivers.kafka import Refusal, Refused, payload_matches
from receivers.keys import identity
from receivers.wire import KAFKA_ATTEMPT_ID, KAFKA_FENCE, KAFKA_IDEMPOTENCY_KEY, KAFKA_PAYLOAD_DIGEST
from tests.conftest import SECRET, eventually
from tests.kafka import Broker

TOPIC = "orders"
GROUP = "billing"
ROOT = Path(__file__).resolve().parents[2]
#: The destination's previous signing secret, still held by consumers during a rotation.
PREVIOUS = wire.new_secret()


def payload(value: Any) -> bytes:
    return rfc8785.dumps(value)


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def headers(key: str | None, value: bytes, *, fence: int | None = 1, declared: str | None = None,
            signed: str | None = None, signed_at: float | None = None) -> list[tuple[str, bytes]]:
    """The headers the sender puts on a record (``declared`` overrides the payload digest), signed
    over ``value`` with the secret ``signed`` (at ``signed_at``, else now) when given."""
    found = [(KAFKA_ATTEMPT_ID, uuid.uuid4().hex.encode())]
    if key is not None:
        found.append((KAFKA_IDEMPOTENCY_KEY, key.encode()))
    found.append((KAFKA_PAYLOAD_DIGEST, (declared or digest(value)).encode()))
    if fence is not None:
        found.append((KAFKA_FENCE, str(fence).encode()))
    if signed is not None:
        assert key is not None
        stamp = int(datetime.now(UTC).timestamp() if signed_at is None else signed_at)
        found += [(wire.KAFKA_TIMESTAMP, str(stamp).encode()),
                  (wire.KAFKA_SIGNATURE, wire.sign([signed], key, stamp, value).encode())]
    return found


async def produce(broker: Broker, *records: tuple[str | None, bytes] | tuple[Any, ...], partition: int = 0) -> None:
    """Produce ``(key, value[, headers])`` records to one partition, in order."""
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all",
                                enable_idempotence=broker.kind == "noida")
    await producer.start()
    try:
        for key, value, *given in records:
            sent = await producer.send(TOPIC, value, key=(key or "none").encode(), partition=partition,
                                       headers=given[0] if given else headers(key, value))
            await sent
    finally:
        await producer.stop()


@dataclass
class Effects:
    """The handler's effects, and the refusals reported to ``on_error``."""

    done: list[tuple[str, int, int]] = field(default_factory=list)  # key, partition, epoch
    refused: list[tuple[int, int, Refused]] = field(default_factory=list)  # partition, offset, why
    calls: dict[str, int] = field(default_factory=dict)
    fail: dict[str, int] = field(default_factory=dict)  # key: how many first calls raise
    gate: dict[str, asyncio.Event] = field(default_factory=dict)  # key: wait on it first

    async def handle(self, record: Any, context: IdempotencyContext) -> None:
        assert context.scope == GROUP
        self.calls[context.key] = self.calls.get(context.key, 0) + 1
        if context.key in self.gate:
            await self.gate[context.key].wait()
        if self.calls[context.key] <= self.fail.get(context.key, 0):
            raise RuntimeError(f"{context.key} fails this time")
        self.done.append((context.key, record.partition, context.epoch))

    def on_error(self, record: Any, refused: Refused) -> None:
        self.refused.append((record.partition, record.offset, refused))

    @property
    def keys(self) -> list[str]:
        return [key for key, _, _ in self.done]


def kafka_consumer(broker: Broker, **options: Any) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(TOPIC, bootstrap_servers=broker.bootstrap, group_id=GROUP, enable_auto_commit=False,
                            auto_offset_reset="earliest", **options)


def consumer_for(broker: Broker, store: Any, effects: Effects, **options: Any) -> IdempotentConsumer:
    return IdempotentConsumer(kafka_consumer(broker), store, effects.handle, on_error=effects.on_error,
                              retry_seconds=0.05, **options)


async def committed(consumer: IdempotentConsumer, partition: int = 0) -> int | None:
    offset: int | None = await consumer.consumer.committed(TopicPartition(TOPIC, partition))
    return offset


async def until_committed(consumer: IdempotentConsumer, offset: int, partition: int = 0,
                          timeout: float = 20) -> None:
    async def reached() -> bool:
        return await committed(consumer, partition) == offset

    assert await eventually(reached, timeout), f"committed {await committed(consumer, partition)}, not {offset}"


@pytest.fixture
async def topic(kafka: Broker) -> Broker:
    await kafka.create_topic(TOPIC, partitions=2)
    return kafka


# -- once per key ----------------------------------------------------------------------------


async def test_each_key_is_handled_once_across_duplicates_and_redelivery(topic: Broker, new_store: Any) -> None:
    a, b, c = payload({"invoice": 1}), payload({"invoice": 2}), payload({"invoice": 3})
    # the sender produced a and b twice (a retry after an unknown outcome, with a higher fence)
    await produce(topic, ("a", a), ("b", b), ("a", a, headers("a", a, fence=2)), ("c", c), ("b", b))
    effects = Effects()
    first = consumer_for(topic, new_store(), effects)
    asked: list[dict[TopicPartition, int]] = []

    async def lost(offsets: dict[TopicPartition, int]) -> None:  # as when a rebalance beats the commit
        asked.append(offsets)
        raise CommitFailedError("the group rebalanced")

    first.consumer.commit = lost
    async with first:
        assert await eventually(lambda: any(o.get(TopicPartition(TOPIC, 0)) == 5 for o in asked), 20)
    assert effects.keys == ["a", "b", "c"]
    # nothing was committed, so the group's next consumer is given every record again
    second = consumer_for(topic, new_store(), effects)
    async with second:
        await until_committed(second, 5)
    assert effects.done == [("a", 0, 1), ("b", 0, 1), ("c", 0, 1)]
    assert effects.refused == []


async def test_one_fetched_batch_with_repeats_refusals_and_a_record_without_headers(
        topic: Broker, new_store: Any) -> None:
    """The rounds of one batch: a key repeated (the repeats replay, in order, after the first is
    handled), the key reused for another payload, a record with no headers at all, keys once."""
    a, other = payload({"n": 1}), payload({"n": 2})
    await produce(topic, ("k1", a), (None, a, []), ("k1", a), ("k1", other), ("k2", a, headers("k2", a, fence=5)),
                  ("k1", a, headers("k1", a, fence=0)), ("k3", a))
    effects = Effects()
    consumer = consumer_for(topic, new_store(), effects)
    async with consumer:
        await until_committed(consumer, 7)
    assert effects.done == [("k1", 0, 1), ("k2", 0, 1), ("k3", 0, 1)]
    assert [(offset, refused.reason, refused.key) for _, offset, refused in effects.refused] == [
        (1, Refusal.MISSING_KEY, None), (3, Refusal.KEY_REUSED, "k1")]


async def test_a_crash_between_the_handler_and_the_offset_commit_runs_the_handler_once(
        tansu: Broker, tmp_path: Path, pg_dsn: str, pg_table: str) -> None:
    """A consumer process dies (SIGKILL) after its handlers' effects and their completions and
    before the offset commit; a new process in the same group is given the records again and
    runs none of them twice. With a SQLite file and with PostgreSQL, one group each, side by side.

    On Tansu: noida-db never evicts a SIGKILLed member from its group, so the new member would
    wait for ever in the rebalance."""
    await tansu.create_topic(TOPIC, partitions=1)
    keys = [f"k{i}" for i in range(40)]
    signed = [(key, value, headers(key, value, signed=SECRET)) for key in keys for value in [payload({"n": key})]]
    await produce(tansu, *signed)

    async def run(*args: str) -> tuple[int | None, str]:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "tests.receivers.kafka_worker", *args,
                                                    cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 90)
        return proc.returncode, err.decode()[-2000:]

    async def crash_then_resume(kind: str, store: str) -> list[str]:
        effects = tmp_path / f"effects-{kind}.txt"
        worker = (tansu.bootstrap, TOPIC, f"crash-{kind}", store, str(effects), SECRET)
        assert await run(*worker, "--die-before-commit") == (-signal.SIGKILL, "")
        assert effects.read_text()  # it ran handlers before it died
        assert await run(*worker, "--until", str(len(keys))) == (0, "")
        return [line.split()[0] for line in effects.read_text().splitlines()]

    stores = {"sqlite": f"sqlite:{tmp_path / 'records.db'}", "postgres": f"postgres:{pg_table}:{pg_dsn}"}
    for handled in await asyncio.gather(*(crash_then_resume(kind, store) for kind, store in stores.items())):
        assert sorted(handled) == sorted(keys)  # each once, none twice


async def test_a_batchs_completions_are_stored_with_the_next_batchs_claims(topic: Broker, tmp_path: Path) -> None:
    """Three batches already fetched cost three write transactions and a last one for the final
    completions, not two each; every offset is committed once its completion is stored."""
    await produce(topic, *[(f"k{i}", payload({"n": i})) for i in range(6)])
    effects = Effects()
    store = SqliteRecordStore(tmp_path / "records.db")
    consumer = consumer_for(topic, store, effects, max_batch=2)
    began: list[str] = []
    await store.open()
    await store._committer.db.set_trace_callback(lambda sql: sql.startswith("BEGIN") and began.append(sql))
    async with consumer:
        await until_committed(consumer, 6)
        assert effects.keys == [f"k{i}" for i in range(6)]
        for i in range(6):
            assert (await store.get(identity(GROUP, f"k{i}"))).state is State.COMPLETED
        assert len(began) == 4, began


async def test_the_next_batchs_claims_are_taken_while_a_batchs_handlers_run(topic: Broker, new_store: Any) -> None:
    """The next batch, already fetched, is claimed in the store while the batch before it is
    handled, so its transaction does not wait for those handlers; its own handlers run after, in
    order, and nothing is committed before its completion is stored."""
    await produce(topic, *[(f"k{i}", payload({"n": i})) for i in range(4)])
    effects = Effects(gate={"k0": asyncio.Event()})
    store = new_store()
    consumer = consumer_for(topic, store, effects, max_batch=2)

    async def claimed_ahead() -> bool:
        record = await store.get(identity(GROUP, "k2"))
        return record is not None and record.state is State.IN_PROGRESS

    async with consumer:
        try:
            assert await eventually(lambda: effects.calls.get("k0") == 1, 20)
            assert await eventually(claimed_ahead, 20)
            assert effects.calls == {"k0": 1} and await committed(consumer) is None
        finally:
            effects.gate["k0"].set()  # stopping waits for the handler in flight
        await until_committed(consumer, 4)
    assert effects.keys == ["k0", "k1", "k2", "k3"]


async def test_a_batch_naming_a_key_of_the_batch_in_flight_is_claimed_after_it(topic: Broker, new_store: Any) -> None:
    """Claimed beside the batch in flight, a key they share would find its own claim in progress:
    such a batch is claimed once the batch before it is handled, and its repeat replays."""
    a = payload({"n": 1})
    await produce(topic, ("k0", a), ("k1", a), ("k1", a), ("k2", a))
    effects = Effects(gate={"k0": asyncio.Event()})
    store = new_store()
    consumer = consumer_for(topic, store, effects, max_batch=2)
    async with consumer:
        try:
            assert await eventually(lambda: effects.calls.get("k0") == 1, 20)
            await asyncio.sleep(0.5)
            assert await store.get(identity(GROUP, "k2")) is None
        finally:
            effects.gate["k0"].set()  # stopping waits for the handler in flight
        await until_committed(consumer, 4)
    assert effects.keys == ["k0", "k1", "k2"] and effects.refused == []


async def test_a_batch_starts_no_handler_once_half_its_lease_is_gone(topic: Broker, new_store: Any) -> None:
    """A batch claimed together stops starting handlers once half the claims' lease has gone: the
    records not started are released and read again, claimed anew, and each runs once, in order."""
    producer = AIOKafkaProducer(bootstrap_servers=topic.bootstrap, acks="all")
    await producer.start()
    try:  # one record batch, so that one fetch gives the consumer all four
        batch = producer.create_batch()
        for i in range(4):
            value = payload({"n": i})
            batch.append(key=f"k{i}".encode(), value=value, timestamp=None, headers=headers(f"k{i}", value))
        await (await producer.send_batch(batch, TOPIC, partition=0))
    finally:
        await producer.stop()
    effects = Effects(gate={"k0": asyncio.Event()})
    consumer = consumer_for(topic, new_store(), effects, lease_seconds=0.8)
    async with consumer:
        try:
            assert await eventually(lambda: effects.calls.get("k0") == 1, 20)
            await asyncio.sleep(0.5)  # k0's handler takes longer than half the lease
        finally:
            effects.gate["k0"].set()
        await until_committed(consumer, 4)
    assert effects.keys == ["k0", "k1", "k2", "k3"] and set(effects.calls.values()) == {1}
    assert effects.done[0] == ("k0", 0, 1)
    assert all(epoch >= 2 for _, _, epoch in effects.done[1:])  # released and claimed again (more than once if slow)


# -- refusals -------------------------------------------------------------------------------


async def test_the_same_key_with_another_payload_is_reported_and_not_handled(topic: Broker, new_store: Any) -> None:
    await produce(topic, ("a", payload({"amount": 10})), ("a", payload({"amount": 99})), ("b", payload({})))
    effects = Effects()
    consumer = consumer_for(topic, new_store(), effects)
    async with consumer:
        await until_committed(consumer, 3)  # moved past it: a retry of the same record cannot help
    assert effects.keys == ["a", "b"]
    [(_partition, offset, refused)] = effects.refused
    assert (offset, refused.reason, refused.key) == (1, Refusal.KEY_REUSED, "a")


async def test_a_fence_below_the_highest_seen_for_its_key_is_refused(topic: Broker, new_store: Any) -> None:
    store = new_store()
    await store.open()
    now = datetime.now(UTC)
    # the sender's reconcile probe raised the key's fence to 7: attempts fenced lower are superseded
    await store.probe(identity(GROUP, "a"), 7, now=now, expires_at=now + timedelta(hours=1))
    a = payload({"x": 1})
    await produce(topic, ("a", a, headers("a", a, fence=3)), ("a", a, headers("a", a, fence=8)))
    effects = Effects()
    consumer = consumer_for(topic, store, effects)
    async with consumer:
        await until_committed(consumer, 2)
    assert effects.done == [("a", 0, 1)]
    [(_, offset, refused)] = effects.refused
    assert (offset, refused.reason) == (0, Refusal.STALE_FENCE)
    assert "3 is lower than 7" in refused.detail


async def test_records_that_cannot_be_deduplicated_are_reported_and_skipped(topic: Broker) -> None:
    good = payload({"ok": True})
    await produce(
        topic,
        (None, good, headers(None, good)),  # no idempotency-key
        ("a", good, headers("a", good, declared=digest(b"something else"))),  # value is not its payload
        ("b", good, [(KAFKA_IDEMPOTENCY_KEY, b"b")]),  # no payload-digest
        ("c", good, [*headers("c", good), (KAFKA_FENCE, b"2")]),  # two fences
        ("bad key", good),  # a space is no visible ASCII
        ("d", json.dumps({"ok": True}, indent=2).encode(), headers("d", good)),  # the same JSON, not canonical
    )
    effects = Effects()
    calls = 0

    def flaky(record: Any, refused: Refused) -> None:  # a dead-letter write that fails once
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError("dead letter queue down")
        effects.on_error(record, refused)

    consumer = IdempotentConsumer(kafka_consumer(topic), MemoryRecordStore(), effects.handle, on_error=flaky,
                                  retry_seconds=0.05)
    async with consumer:
        await until_committed(consumer, 6)
    assert effects.keys == ["d"]
    assert [(offset, refused.reason) for _, offset, refused in effects.refused] == [
        (0, Refusal.MISSING_KEY), (1, Refusal.DIGEST_MISMATCH), (2, Refusal.MISSING_DIGEST),
        (3, Refusal.MALFORMED_FENCE), (4, Refusal.MALFORMED_KEY)]
    assert calls == 6  # the failed report was made again, not skipped


async def test_with_secrets_only_records_they_signed_run_and_the_others_never_claim_their_key(
        topic: Broker, new_store: Any) -> None:
    """Anyone who can write to the topic produced records under a real intent's key before the
    outbox's own one, with another payload and its own valid digest. Given the destination's
    secrets (the current one and the previous, mid-rotation), the consumer runs only what they
    signed: the forgeries are reported, never run and never claim the key, so the genuine record
    runs rather than being refused as a reuse of the key."""
    genuine, forged = payload({"amount": 10}), payload({"amount": 99})
    two_days_ago = datetime.now(UTC).timestamp() - 2 * 86_400
    await produce(
        topic,
        ("a", forged, headers("a", forged)),  # unsigned
        ("a", forged, headers("a", forged, signed=wire.new_secret())),  # signed with a secret of its own
        ("a", genuine, headers("a", genuine, signed=SECRET)),
        # a genuine signature over another value
        ("b", forged, headers("b", genuine, declared=digest(forged), signed=SECRET)),
        ("c", genuine, headers("c", genuine, signed=SECRET, signed_at=two_days_ago)),  # older than the retention
        ("d", genuine, headers("d", genuine, signed=PREVIOUS)),  # the previous secret, still held
    )
    effects = Effects()
    store = new_store()
    consumer = consumer_for(topic, store, effects, secrets=[SECRET, PREVIOUS])
    async with consumer:
        await until_committed(consumer, 6)
    assert effects.keys == ["a", "d"]
    assert [(offset, refused.reason, refused.key) for _, offset, refused in effects.refused] == [
        (0, Refusal.MISSING_SIGNATURE, "a"), (1, Refusal.INVALID_SIGNATURE, "a"), (3, Refusal.INVALID_SIGNATURE, "b"),
        (4, Refusal.INVALID_SIGNATURE, "c")]
    assert "no webhook-signature matches" in effects.refused[1][2].detail
    assert "more than 86400s from now" in effects.refused[3][2].detail
    await store.open()
    try:
        assert await store.get(identity(GROUP, "b")) is None and await store.get(identity(GROUP, "c")) is None
        record = await store.get(identity(GROUP, "a"))
        assert record.state is State.COMPLETED and record.fingerprint == digest(genuine)
    finally:
        await store.close()


async def test_secrets_must_be_signing_secrets() -> None:
    kafka = AIOKafkaConsumer(TOPIC, bootstrap_servers="127.0.0.1:9", group_id=GROUP, enable_auto_commit=False)
    with pytest.raises(ValueError, match="must start with 'whsec_'"):
        IdempotentConsumer(kafka, MemoryRecordStore(), Effects().handle, secrets="hunter2")
    with pytest.raises(ValueError, match="holds no secret"):
        IdempotentConsumer(kafka, MemoryRecordStore(), Effects().handle, secrets=[])


# -- retries --------------------------------------------------------------------------------


async def test_a_failing_handler_is_retried_until_it_succeeds_and_holds_only_its_partition(
        topic: Broker, new_store: Any) -> None:
    await produce(topic, ("a", payload(1)), ("b", payload(2)), ("c", payload(3)))
    await produce(topic, ("x", payload(4)), ("y", payload(5)), partition=1)
    effects = Effects(fail={"b": 2})
    consumer = consumer_for(topic, new_store(), effects)
    async with consumer:
        await until_committed(consumer, 3)
        await until_committed(consumer, 2, partition=1)
    assert effects.calls == {"a": 1, "b": 3, "c": 1, "x": 1, "y": 1}
    assert [key for key, partition, _ in effects.done if partition == 0] == ["a", "b", "c"]  # in order
    assert [key for key, partition, _ in effects.done if partition == 1] == ["x", "y"]
    assert dict((k, e) for k, _, e in effects.done)["b"] == 3  # each failure released its claim


async def test_a_key_another_member_is_running_waits_for_its_outcome(topic: Broker, new_store: Any) -> None:
    store = new_store()
    await store.open()
    a = payload({"a": 1})
    now = datetime.now(UTC)
    # another member of the group claimed a (before a rebalance gave us its partition)
    await store.claim(identity(GROUP, "a"), digest(a), fence=1, now=now, lease_until=now + timedelta(seconds=60),
                      expires_at=now + timedelta(hours=1))
    await produce(topic, ("a", a), ("b", payload({"b": 1})))
    effects = Effects()
    consumer = consumer_for(topic, store, effects)
    async with consumer:
        await asyncio.sleep(1)
        assert effects.calls == {} and await committed(consumer) is None  # nothing past a, not even b
        from receivers import StoredResponse

        await store.complete(identity(GROUP, "a"), 1, StoredResponse(200, (), b""),
                             expires_at=now + timedelta(hours=1))
        await until_committed(consumer, 2)
    assert effects.keys == ["b"]


async def test_an_unavailable_store_runs_no_handler_until_it_is_back(topic: Broker) -> None:
    store = MemoryRecordStore()
    await produce(topic, ("a", payload(1)))
    effects = Effects()
    consumer = consumer_for(topic, store, effects)
    store.available = False
    async with consumer:
        await asyncio.sleep(1)
        assert effects.calls == {} and await committed(consumer) is None
        store.available = True
        await until_committed(consumer, 1)
    assert effects.keys == ["a"]


async def test_stop_finishes_the_record_in_flight_and_commits_it(topic: Broker, new_store: Any) -> None:
    await produce(topic, ("a", payload(1)), ("b", payload(2)))
    effects = Effects(gate={"a": asyncio.Event()})
    consumer = consumer_for(topic, new_store(), effects)
    await consumer.start()
    assert await eventually(lambda: effects.calls.get("a") == 1, 20)
    stopping = asyncio.create_task(consumer.stop())
    await asyncio.sleep(0.2)
    assert not stopping.done()  # it waits for the handler
    effects.gate["a"].set()
    await stopping
    assert effects.keys == ["a"]  # b was not started
    store = new_store()
    await store.open()
    assert (await store.get(identity(GROUP, "a"))).state is State.COMPLETED
    b = await store.get(identity(GROUP, "b"))
    assert b is None or b.state is State.ABSENT  # its claim was released, not left to expire
    await store.close()
    after = Effects()
    consumer = consumer_for(topic, new_store(), after)
    async with consumer:
        await until_committed(consumer, 2)
    assert after.keys == ["b"]


# -- set-up -----------------------------------------------------------------------------------


async def test_the_consumer_needs_a_group_and_manual_commits() -> None:
    store, handle, nowhere = MemoryRecordStore(), Effects().handle, "127.0.0.1:9"
    with pytest.raises(ValueError, match="group_id"):
        IdempotentConsumer(AIOKafkaConsumer(TOPIC, bootstrap_servers=nowhere, enable_auto_commit=False), store, handle)
    with pytest.raises(ValueError, match="enable_auto_commit=False"):
        IdempotentConsumer(AIOKafkaConsumer(TOPIC, bootstrap_servers=nowhere, group_id=GROUP), store, handle)


def test_a_value_matches_its_digest_as_sent_or_as_the_same_json() -> None:
    canonical = payload({"b": [1, 2.5], "a": "é"})
    assert payload_matches(canonical, digest(canonical))
    assert payload_matches(json.dumps({"a": "é", "b": [1, 2.5]}).encode(), digest(canonical))
    assert payload_matches({"a": "é", "b": [1, 2.5]}, digest(canonical))  # a deserializer decoded it
    assert not payload_matches(payload({"a": "é", "b": [1, 2.6]}), digest(canonical))
    assert not payload_matches(b"\xff not json", digest(canonical))
    assert payload_matches(b"\xff not json", digest(b"\xff not json"))
    assert not payload_matches(None, digest(b""))


# -- Tansu ------------------------------------------------------------------------------------


async def test_on_tansu_each_key_is_handled_once(tansu: Broker, tmp_path: Path) -> None:
    await tansu.create_topic(TOPIC, partitions=1)
    a, b = payload({"a": 1}), payload({"b": 1})
    await produce(tansu, ("a", a), ("b", b), ("a", a, headers("a", a, fence=2)), ("b", payload({"b": 2})))
    effects = Effects()
    consumer = consumer_for(tansu, SqliteRecordStore(tmp_path / "records.db"), effects)
    async with consumer:
        await until_committed(consumer, 4, timeout=30)
    assert effects.keys == ["a", "b"]
    assert [(offset, refused.reason) for _, offset, refused in effects.refused] == [(3, Refusal.KEY_REUSED)]
