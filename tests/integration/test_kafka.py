"""The Kafka channel against real Kafka-protocol brokers on loopback (noida-db, and Tansu for what
it supports): each failure is recorded as what it is, held against what the topic really holds."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import ssl
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from outbox import Attempt, Intent, OnUnknown, Outcome, Status, Submission, hosts
from receivers import IdempotentConsumer, MemoryRecordStore, wire
from receivers.kafka import Refusal, Refused, digest_of
from sender.kafka import KafkaChannel, KafkaSpec
from tests import smtp
from tests.conftest import SECRET, eventually
from tests.kafka import Broker, Listener, MetadataProxy

from ..problems import assert_problem
from .conftest import Api, SenderEnv

TOPIC = "orders"


async def register(env: SenderEnv, broker: Broker, destination_id: str = "log", **spec: Any) -> Any:
    options: dict[str, Any] = {"channel": "kafka", "bootstrap_servers": [broker.bootstrap], "topic": TOPIC,
                               "allow_private_network": True, "timeout_seconds": 2.0, "secret": SECRET,
                               "enable_idempotence": broker.kind == "noida", **spec}
    return await env.box.put_destination(destination_id, KafkaSpec.model_validate(options))


async def records(broker: Broker, topic: str = TOPIC) -> list[Any]:
    """Every record in the topic, read from the start by a plain consumer (no group)."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    try:
        got: list[Any] = []
        while True:
            batch = await consumer.getmany(timeout_ms=300)
            if not batch:
                return sorted(got, key=lambda r: (r.partition, r.offset))
            for found in batch.values():
                got.extend(found)
    finally:
        await consumer.stop()


@pytest.fixture
async def channel() -> AsyncIterator[KafkaChannel]:
    kafka = KafkaChannel()
    yield kafka
    await kafka.aclose()


async def attempts_of(env: SenderEnv, action_id: str) -> list[Attempt]:
    return list((await env.box.history(action_id)).attempts)


async def settled(env: SenderEnv, action_id: str, attempts: int = 1) -> tuple[Intent, Attempt]:
    """Wait (a worker runs) until ``attempts`` attempts of the intent have finished."""

    async def finished() -> bool:
        found = await attempts_of(env, action_id)
        return len(found) >= attempts and found[-1].finished_at is not None

    assert await eventually(finished, timeout=15)
    return await env.box.get(action_id), (await attempts_of(env, action_id))[-1]


async def run_until(env: SenderEnv, channel: KafkaChannel, action_id: str, attempts: int = 1) -> tuple[Intent, Attempt]:
    """Run a worker until ``attempts`` attempts of the intent have finished (the worker closes
    the channel when it stops)."""
    async with env.running(channels={"kafka": channel}):
        return await settled(env, action_id, attempts)


def facts(attempt: Attempt) -> tuple[str | None, Submission | None, Outcome | None]:
    return attempt.stage, attempt.submission, attempt.outcome


@pytest.mark.parametrize("kind", ["noida", "tansu"])
async def test_a_record_carries_its_identity_and_the_canonical_payload(env: SenderEnv, channel, tmp_path, kind):
    broker = Broker(kind, tmp_path).start()
    try:
        await broker.create_topic(TOPIC, partitions=3)
        await register(env, broker)
        await env.enqueue("order-1", {"total": 12.5, "id": "o-1"}, destination="log")
        intent, attempt = await run_until(env, channel, "order-1")
        assert intent.status is Status.DELIVERED
        assert facts(attempt) == ("done", Submission.SUBMITTED, Outcome.DELIVERED)
        [record] = await records(broker)
        assert attempt.external_id == f"{TOPIC}/{record.partition}/{record.offset}"
        assert record.key == b"order-1"
        assert record.value == intent.payload_json.encode() == b'{"id":"o-1","total":12.5}'
        headers = dict(record.headers)
        signed = {wire.KAFKA_TIMESTAMP: headers.pop(wire.KAFKA_TIMESTAMP).decode(),
                  wire.KAFKA_SIGNATURE: headers.pop(wire.KAFKA_SIGNATURE).decode()}
        assert headers == {
            wire.KAFKA_IDEMPOTENCY_KEY: b"acme/order-1", wire.KAFKA_PAYLOAD_DIGEST: intent.payload_digest.encode(),
            wire.KAFKA_ATTEMPT_ID: attempt.attempt_id.encode(), wire.KAFKA_FENCE: str(attempt.fence).encode()}
        # signed as a webhook is, the idempotency key standing for webhook-id (the reference library agrees)
        assert Webhook(SECRET).verify(record.value, {"webhook-id": "acme/order-1", **signed}) == {
            "id": "o-1", "total": 12.5}
        with pytest.raises(WebhookVerificationError):  # the signature covers the key
            Webhook(SECRET).verify(record.value, {"webhook-id": "acme/order-2", **signed})
    finally:
        broker.stop()


async def test_a_record_anyone_else_wrote_under_a_real_key_never_runs_and_the_genuine_one_does(
        env: SenderEnv, channel, kafka: Broker):
    """Someone who can write to the topic produces a record with a real intent's idempotency key,
    another payload and its own valid digest, before the outbox sends the intent. A consumer given
    the destination's secret reports the forgery and runs the outbox's record; without the secret
    it could tell them apart only by arrival, running the forgery and refusing the genuine record
    as a reuse of the key."""
    await kafka.create_topic(TOPIC)
    await register(env, kafka)
    forged = b'{"total":999}'
    attacker = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap)
    await attacker.start()
    try:
        await (await attacker.send(TOPIC, forged, key=b"order-5", headers=[
            (wire.KAFKA_IDEMPOTENCY_KEY, b"acme/order-5"), (wire.KAFKA_PAYLOAD_DIGEST, digest_of(forged).encode())]))
    finally:
        await attacker.stop()
    await env.enqueue("order-5", {"total": 5}, destination="log")
    intent, _ = await run_until(env, channel, "order-5")
    assert intent.status is Status.DELIVERED

    ran: list[bytes] = []
    refused: list[Refused] = []

    async def handle(record: Any, context: Any) -> None:
        ran.append(record.value)

    consumer = AIOKafkaConsumer(TOPIC, bootstrap_servers=kafka.bootstrap, group_id="billing",
                                auto_offset_reset="earliest", enable_auto_commit=False)
    async with IdempotentConsumer(consumer, MemoryRecordStore(), handle, secrets=SECRET,
                                  on_error=lambda record, why: refused.append(why)):
        assert await eventually(lambda: bool(ran and refused), timeout=15)
    assert ran == [b'{"total":5}']
    assert [(why.reason, why.key) for why in refused] == [(Refusal.MISSING_SIGNATURE, "acme/order-5")]


async def test_a_destination_registered_before_records_were_signed_produces_them_unsigned(
        env: SenderEnv, channel, kafka: Broker):
    """Backward compatible: a destination stored without a signing secret goes on producing, its
    records unsigned (the attempt says so), and keeps doing so when it is updated without one."""
    await kafka.create_topic(TOPIC)
    destination, _ = await register(env, kafka)
    await env.box.store.put_destination(dataclasses.replace(destination, secrets=()))  # as stored before
    spec = {"channel": "kafka", "bootstrap_servers": [kafka.bootstrap], "topic": TOPIC, "allow_private_network": True,
            "timeout_seconds": 2.0}
    updated, created = await env.box.put_destination("log", KafkaSpec.model_validate(spec))
    assert not created and updated.secrets == ()
    await env.enqueue("old", destination="log")
    intent, attempt = await run_until(env, channel, "old")
    assert intent.status is Status.DELIVERED
    assert attempt.reply == f"appended at {attempt.external_id}, unsigned: the destination holds no signing secret"
    [record] = await records(kafka)
    assert {wire.KAFKA_TIMESTAMP, wire.KAFKA_SIGNATURE}.isdisjoint(dict(record.headers))


async def test_a_stopped_broker_is_not_submitted_and_the_retry_is_delivered(env: SenderEnv, channel, kafka: Broker):
    await kafka.create_topic(TOPIC)
    await register(env, kafka)
    async with env.running(channels={"kafka": channel}):
        await env.enqueue("warm", destination="log")
        await settled(env, "warm")  # the producer is started and connected
        kafka.stop(graceful=True)
        await env.enqueue("order-2", destination="log")
        intent, attempt = await settled(env, "order-2")
        assert facts(attempt) == ("connect", Submission.NOT_SUBMITTED, Outcome.RETRYABLE), attempt.error
        assert "does not take connections" in (attempt.error or "")
        assert intent.status is Status.PENDING
        kafka.start()
        await env.advance_until_due("order-2")
        intent, attempt = await settled(env, "order-2", attempts=2)
    assert intent.status is Status.DELIVERED
    assert [r.key for r in await records(kafka)] == [b"warm", b"order-2"]


async def test_a_broker_silent_after_the_produce_request_is_maybe_submitted_and_has_one_effect(
        env: SenderEnv, channel, kafka: Broker):
    """The broker stops answering once the producer is connected: the record's produce request is
    written and never answered in time (``maybe_submitted``). The broker then wakes and appends it
    late, and the outbox (``on_unknown: always``) produces the intent again: two records with one
    idempotency key, one effect through the receivers' idempotent consumer."""
    await kafka.create_topic(TOPIC)
    await register(env, kafka, timeout_seconds=1.0)
    assert kafka.process is not None
    async with env.running(channels={"kafka": channel}):
        await env.enqueue("warm", destination="log")
        await settled(env, "warm")
        os.kill(kafka.process.pid, signal.SIGSTOP)  # connected, and from now on silent
        try:
            await env.enqueue("order-3", {"total": 3}, destination="log")
            intent, attempt = await settled(env, "order-3")
        finally:
            os.kill(kafka.process.pid, signal.SIGCONT)
        assert facts(attempt) == ("produce", Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN), attempt.error
        assert intent.status is Status.PENDING  # on_unknown: always (consumers deduplicate)
        assert await eventually(lambda: _count(kafka, b"order-3", 1), timeout=10)  # appended late after all
        await env.advance_until_due("order-3")
        intent, _ = await settled(env, "order-3", attempts=2)
    assert intent.status is Status.DELIVERED
    assert len([r for r in await records(kafka) if r.key == b"order-3"]) == 2

    effects: list[bytes] = []

    async def handle(record: Any, context: Any) -> None:
        effects.append(record.key)

    consumer = AIOKafkaConsumer(TOPIC, bootstrap_servers=kafka.bootstrap, group_id="billing",
                                auto_offset_reset="earliest", enable_auto_commit=False)
    async with IdempotentConsumer(consumer, MemoryRecordStore(), handle):
        assert await eventually(lambda: len(effects) == 2, timeout=15)
        await asyncio.sleep(0.5)  # the second record of order-3 has been read and skipped by now
    assert sorted(effects) == [b"order-3", b"warm"]


async def _count(broker: Broker, key: bytes, at_least: int) -> bool:
    return len([r for r in await records(broker) if r.key == key]) >= at_least


async def test_a_record_too_large_is_rejected_without_a_send(env: SenderEnv, channel, kafka: Broker):
    await kafka.create_topic(TOPIC)
    await register(env, kafka, max_request_size=1024)
    await env.enqueue("big", {"blob": "x" * 4000}, destination="log")
    intent, attempt = await run_until(env, channel, "big")
    assert facts(attempt) == ("produce", Submission.NOT_SUBMITTED, Outcome.REJECTED)
    assert intent.status is Status.DEAD
    assert await records(kafka) == []


async def test_no_broker_at_all_is_not_submitted(env: SenderEnv, channel, closed_port: int):
    await env.box.put_destination("log", KafkaSpec.model_validate({
        "channel": "kafka", "bootstrap_servers": [f"127.0.0.1:{closed_port}"], "topic": TOPIC,
        "allow_private_network": True, "timeout_seconds": 1.0, "secret": SECRET}))
    await env.enqueue("nowhere", destination="log")
    intent, attempt = await run_until(env, channel, "nowhere")
    assert facts(attempt) == ("connect", Submission.NOT_SUBMITTED, Outcome.RETRYABLE)
    assert intent.status is Status.PENDING


async def test_a_loopback_broker_without_the_private_network_is_refused(env: SenderEnv, channel, kafka: Broker):
    await kafka.create_topic(TOPIC)
    await env.box.put_destination("log", KafkaSpec.model_validate({
        "channel": "kafka", "bootstrap_servers": [f"localhost:{kafka.port}"], "topic": TOPIC,
        "secret": SECRET}))
    await env.enqueue("ssrf", destination="log")
    _, attempt = await run_until(env, channel, "ssrf")
    assert facts(attempt) == ("connect", Submission.NOT_SUBMITTED, Outcome.REJECTED)
    assert "non-public" in (attempt.error or "")
    assert await records(kafka) == []


PUBLIC = "127.0.0.2"  # a loopback address the tests below judge public, as a broker on the internet would be


@pytest.fixture
def public_proxy_address(monkeypatch: pytest.MonkeyPatch) -> str:
    """``PUBLIC``, judged a public address by the SSRF guard (this machine has none of its own)."""
    judged = hosts.is_public
    monkeypatch.setattr(hosts, "is_public", lambda address: address == PUBLIC or judged(address))
    return PUBLIC


@pytest.mark.parametrize("named", ["127.0.0.1", "localhost", "::ffff:0:7f00:1"])
async def test_a_broker_only_the_metadata_names_is_never_connected_to_when_the_guard_refuses_it(
        env: SenderEnv, channel, kafka: Broker, public_proxy_address: str, named: str):
    """A hostile broker (the proxy, at an address the guard allows) answers Metadata naming a
    listener on loopback as the cluster's broker, as an address, as a name resolving to one, or in
    SIIT's IPv4-translated form (special-purpose, which Python's ``is_global`` calls global on
    3.11): no connection reaches the listener, and the attempt is refused before anything was sent."""
    await kafka.create_topic(TOPIC)
    async with Listener() as listener, MetadataProxy(kafka, public_proxy_address, (named, listener.port)) as proxy:
        await env.box.put_destination("log", KafkaSpec.model_validate({
            "channel": "kafka", "bootstrap_servers": [proxy.bootstrap], "topic": TOPIC, "timeout_seconds": 2.0,
            "secret": SECRET}))
        await env.enqueue("ssrf", destination="log")
        intent, attempt = await run_until(env, channel, "ssrf")
        await asyncio.sleep(0.5)  # time for any connection aiokafka would still be opening
    assert proxy.rewritten >= 1
    assert listener.connections == 0
    assert facts(attempt) == ("connect", Submission.NOT_SUBMITTED, Outcome.REJECTED), attempt.error
    assert f"refused: {named} resolves only to non-public addresses" in (attempt.error or "")
    assert intent.status is Status.DEAD
    assert await records(kafka) == []


async def test_the_same_metadata_reaches_the_listener_when_the_private_network_is_allowed(
        env: SenderEnv, channel, kafka: Broker, public_proxy_address: str):
    """The control for the test above: the proxy's rewritten metadata does send the producer to the
    listener, which counts it, when the destination allows the private network."""
    await kafka.create_topic(TOPIC)
    async with Listener() as listener, MetadataProxy(kafka, public_proxy_address,
                                                     ("127.0.0.1", listener.port)) as proxy:
        await register(env, kafka, bootstrap_servers=[proxy.bootstrap])
        await env.enqueue("private", destination="log")
        _, attempt = await run_until(env, channel, "private")
    assert listener.connections >= 1
    assert facts(attempt)[1:] == (Submission.NOT_SUBMITTED, Outcome.RETRYABLE), attempt.error


async def test_a_guarded_tls_connection_verifies_the_brokers_certificate_against_its_name(
        env: SenderEnv, kafka: Broker, monkeypatch: pytest.MonkeyPatch):
    """The guard connects the socket itself (to the address it checked) and hands it to aiokafka,
    which must still verify the broker's certificate against the broker's name: the certificate
    names only ``localhost`` (no IP address), so it checks out only if the name is what TLS was
    given. Every broker the metadata names is the TLS proxy, by name."""
    judged = hosts.is_public
    monkeypatch.setattr(hosts, "is_public", lambda address: address == "127.0.0.1" or judged(address))
    cert = smtp.CA.issue_cert("localhost")
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server)
    client = ssl.create_default_context()
    smtp.CA.configure_trust(client)
    await kafka.create_topic(TOPIC)
    async with MetadataProxy(kafka, "127.0.0.1", tls=server) as proxy:
        proxy.named = ("localhost", proxy.port)
        await env.box.put_destination("log", KafkaSpec.model_validate({
            "channel": "kafka", "bootstrap_servers": [f"localhost:{proxy.port}"], "topic": TOPIC, "tls": True,
            "timeout_seconds": 2.0, "secret": SECRET}))
        await env.enqueue("over-tls", destination="log")
        intent, attempt = await run_until(env, KafkaChannel(tls_context=client), "over-tls")
    assert facts(attempt) == ("done", Submission.SUBMITTED, Outcome.DELIVERED), attempt.error
    assert proxy.rewritten >= 1 and intent.status is Status.DELIVERED


async def test_the_destination_defaults_say_what_kafka_needs(env: SenderEnv, kafka: Broker):
    destination, _ = await register(env, kafka)
    assert destination.on_unknown is OnUnknown.ALWAYS
    assert destination.settings["acks"] == "all" and destination.settings["enable_idempotence"] is True


async def test_the_api_registers_kafka_destinations_and_refuses_what_cannot_be_produced(api: Api):
    base = {"channel": "kafka", "bootstrap_servers": ["kafka.example.com:9092"], "topic": "orders", "secret": SECRET}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"secret": None}, "is new: it needs a whsec_ secret to sign its records"),
        ({"secret": "hunter2-pw"}, "give the SASL password as sasl_password"),
        ({"sasl_password": "hunter2-pw"}, "sasl_password needs sasl_mechanism"),
        ({"topic": "bad topic"}, "is not a Kafka topic name"),
        ({"bootstrap_servers": ["kafka.example.com"]}, "has no port"),
        ({"bootstrap_servers": ["10.0.0.1:9092"]}, "is not a public address"),
        ({"acks": "leader"}, "the idempotent producer needs acks: all"),
        ({"sasl_mechanism": "PLAIN", "sasl_username": "u"}, "set tls, or allow_insecure"),
        ({"reconcile": True}, "leave reconcile off"),
        ({"linger_ms": 5000}, "linger_ms"),
    ]
    async with api.client(api.admin) as admin:
        for change, words in cases:
            refused = await admin.put("/v1/destinations/log", json={**base, **change})
            assert_problem(refused, 422, "invalid-input", words)
        registered = await admin.put("/v1/destinations/log", json={
            **base, "tls": True, "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "svc",
            "sasl_password": "hunter2-pw"})
        assert registered.status_code == 201, registered.text
        shown = registered.json()
        assert (shown["channel"], shown["topic"], shown["acks"], shown["on_unknown"]) == (
            "kafka", "orders", "all", "always")
        assert "hunter2" not in registered.text and SECRET not in registered.text
        assert "sasl_password" not in shown
        # one whsec_ secret signs; the SASL password held beside it is a credential, not counted
        assert shown["signing_secrets"] == 1
        assert (await admin.get("/v1/destinations/log")).json()["signing_secrets"] == 1


async def test_a_broker_without_the_idempotent_producer_says_so(env: SenderEnv, channel, tansu: Broker):
    await tansu.create_topic(TOPIC)
    await register(env, tansu, enable_idempotence=True)
    await env.enqueue("order-4", destination="log")
    _, attempt = await run_until(env, channel, "order-4")
    assert facts(attempt)[1:] == (Submission.NOT_SUBMITTED, Outcome.REJECTED), attempt.error
    assert "enable_idempotence: false" in (attempt.error or "")
    assert await records(tansu) == []


async def test_an_ordering_key_is_the_record_key_so_a_key_keeps_one_partition(env: SenderEnv, channel,
                                                                               kafka: Broker):
    await kafka.create_topic(TOPIC, partitions=4)
    await register(env, kafka)
    for n in range(6):
        await env.enqueue(f"step-{n}", {"n": n}, destination="log", ordering_key="customer-7")
    async with env.running(channels={"kafka": channel}):
        for n in range(6):
            await settled(env, f"step-{n}")
    found = await records(kafka)
    assert {r.key for r in found} == {b"customer-7"} and len({r.partition for r in found}) == 1


class Batches(KafkaChannel):
    """The Kafka channel, noting the attempts of each batch a worker hands it, in their order."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[str]] = []

    async def send_many(self, sends):
        self.batches.append([send.intent.action_id for send in sends])  # in the order handed over
        return await super().send_many(sends)


@pytest.fixture
async def batch_env(open_env) -> SenderEnv:
    """Authority allows all (a cycle starts its leases together, none waits on a read), and payloads
    up to 2 MiB: one larger than the broker takes can be enqueued."""
    return await open_env(authority="allow-all", max_payload_bytes=2 * 1024 * 1024)


async def test_a_cycles_records_are_produced_as_one_batch_each_answered_in_its_place(
        batch_env: SenderEnv, kafka: Broker):
    """One record of the batch is larger than the broker takes (not than the destination's
    max_request_size): the broker refuses it, and the records handed over before it are appended.
    Those behind it in its partition are refused too, for a sequence the broker no longer expects
    (the idempotent producer numbers each partition's records, and the refused one left a gap):
    the producer is replaced and they are ``maybe_submitted``, then delivered by the retry."""
    env = batch_env
    await kafka.create_topic(TOPIC)
    await register(env, kafka, max_request_size=4 * 1024 * 1024)
    channel = Batches()
    worker = env.worker(channels={"kafka": channel}, concurrency=8)
    await env.enqueue("warm", destination="log")
    assert await worker.run_once() == 1  # the destination is read and the producer started
    for action_id in ("a", "b"):
        await env.enqueue(action_id, destination="log")
    await env.enqueue("huge", {"blob": "x" * 1_200_000}, destination="log")
    for action_id in ("c", "d"):
        await env.enqueue(action_id, destination="log")
    assert await worker.run_once() == 5
    [handed] = channel.batches  # (the warm-up, alone in its cycle, was a send)
    assert sorted(handed) == ["a", "b", "c", "d", "huge"]
    before, behind = handed[:handed.index("huge")], handed[handed.index("huge") + 1:]
    assert before and behind, handed
    for action_id in before:
        attempt = (await attempts_of(env, action_id))[-1]
        assert facts(attempt) == ("done", Submission.SUBMITTED, Outcome.DELIVERED), attempt.error
        assert attempt.external_id is not None and attempt.external_id.startswith(f"{TOPIC}/0/")
    attempt = (await attempts_of(env, "huge"))[-1]
    assert facts(attempt) == ("produce", Submission.SUBMITTED, Outcome.REJECTED), attempt.error
    assert "MessageSizeTooLargeError" in (attempt.error or "")
    assert (await env.box.get("huge")).status is Status.DEAD
    for action_id in behind:
        attempt = (await attempts_of(env, action_id))[-1]
        assert facts(attempt) == ("produce", Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN), attempt.error
        assert "OutOfOrderSequenceNumber" in (attempt.error or "")
        await env.advance_until_due(action_id)
    assert await worker.run_once() == len(behind)
    await worker.aclose()
    for action_id in behind:
        assert (await env.box.get(action_id)).status is Status.DELIVERED
    assert sorted(r.key for r in await records(kafka)) == [b"a", b"b", b"c", b"d", b"warm"]


async def test_a_broker_dropped_mid_batch_leaves_what_may_have_gone_maybe_submitted(
        batch_env: SenderEnv, kafka: Broker):
    """The broker (behind a proxy) is gone once the batch's produce request reached it: the records
    handed to the producer may have been appended (``maybe_submitted``); the one refused before it
    was handed over (larger than max_request_size) is ``not_submitted``."""
    env = batch_env
    await kafka.create_topic(TOPIC)
    async with MetadataProxy(kafka, "127.0.0.1") as proxy:
        await register(env, kafka, bootstrap_servers=[proxy.bootstrap], max_request_size=1024, timeout_seconds=1.0)
        channel = Batches()
        worker = env.worker(channels={"kafka": channel}, concurrency=8)
        await env.enqueue("warm", destination="log")
        assert await worker.run_once() == 1
        proxy.drop_at_produce = True
        await env.enqueue("a", destination="log")
        await env.enqueue("big", {"blob": "x" * 4000}, destination="log")
        await env.enqueue("b", destination="log")
        assert await worker.run_once() == 3
    await worker.aclose()
    assert [sorted(batch) for batch in channel.batches] == [["a", "b", "big"]]
    for action_id in ("a", "b"):
        attempt = (await attempts_of(env, action_id))[-1]
        assert facts(attempt) == ("produce", Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN), attempt.error
        assert (await env.box.get(action_id)).status is Status.PENDING  # on_unknown: always
    attempt = (await attempts_of(env, "big"))[-1]
    assert facts(attempt) == ("produce", Submission.NOT_SUBMITTED, Outcome.REJECTED), attempt.error
    assert b"big" not in [r.key for r in await records(kafka)]


async def test_a_batch_to_two_destinations_is_produced_by_each_ones_producer(batch_env: SenderEnv, kafka: Broker):
    env = batch_env
    await kafka.create_topic(TOPIC)
    await kafka.create_topic("refunds")
    await register(env, kafka)
    await register(env, kafka, "refund-log", topic="refunds")
    channel = Batches()
    worker = env.worker(channels={"kafka": channel}, concurrency=8)
    await env.enqueue("warm", destination="log")
    await env.enqueue("warm-refund", destination="refund-log")
    assert await worker.run_once() == 2
    for n in range(3):
        await env.enqueue(f"order-{n}", destination="log")
        await env.enqueue(f"refund-{n}", destination="refund-log")
    assert await worker.run_once() == 6
    await worker.aclose()
    assert sorted(channel.batches[-1]) == sorted([f"order-{n}" for n in range(3)] + [f"refund-{n}" for n in range(3)])
    for n in range(3):
        for action_id, topic in ((f"order-{n}", TOPIC), (f"refund-{n}", "refunds")):
            attempt = (await attempts_of(env, action_id))[-1]
            assert facts(attempt) == ("done", Submission.SUBMITTED, Outcome.DELIVERED), attempt.error
            assert attempt.external_id is not None and attempt.external_id.startswith(f"{topic}/")
    assert sorted(r.key for r in await records(kafka, "refunds")) == [b"refund-0", b"refund-1", b"refund-2",
                                                                     b"warm-refund"]
