"""One trace from the producer to the receiver: the producer's span (made here with the SDK) sent
as traceparent through the client to a served outbox (uvicorn on loopback, a real SQLite file),
the intent's create span, one send span per attempt, and the receiver's requests carrying the
attempt's traceparent; on Kafka records (and on through the idempotent consumer to its handler)
and email header fields too; an operator's replay
linked to the trace; a malformed traceparent ignored. The spans are read from the SDK's
in-memory exporter (the ``spans`` fixture): every part runs in this process."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from opentelemetry import trace
from opentelemetry.trace import StatusCode

from outbox import DestinationSpec, Outbox, Role, Settings, Status, operations
from outbox.client import AsyncClient
from receivers import IdempotencyContext, IdempotentConsumer, MemoryRecordStore
from sender.email import EmailChannel
from sender.kafka import KafkaChannel

from ..conftest import SECRET, eventually
from ..kafka import Broker
from ..receiver import Receiver, Reply
from ..smtp import SmtpServer
from ..traces import named, traceparent
from .conftest import Api, SenderEnv
from .test_email import MAIL
from .test_email import register as register_mail
from .test_kafka import TOPIC, records
from .test_kafka import register as register_kafka

PRODUCER = trace.get_tracer("a producer")
CONSUMER_APP = trace.get_tracer("a consumer")
MALFORMED = "00-not-a-trace-context-01"


def trace_id(value: str) -> str:
    return value.split("-")[1]


def span_id(value: str) -> str:
    return value.split("-")[2]


@pytest.fixture
async def served(tmp_path: Path, receiver: Receiver, serve_api) -> AsyncIterator[tuple[str, str]]:
    """A served outbox with its embedded worker, whose destination ``hook`` retries after 50 ms;
    its URL and a producer's token for scope acme."""
    db_path = tmp_path / "traced.db"
    async with await Outbox.open(f"sqlite:///{db_path}") as box:
        await box.put_destination("hook", DestinationSpec(url=f"{receiver.url}/hook", secret=SECRET,
                                                          allow_private_network=True, timeout_seconds=5,
                                                          retry_schedule=[0.05]))
        producer, _ = await box.create_token(Role.PRODUCER, ["acme"])
    yield serve_api(Settings(database_url=f"sqlite:///{db_path}", worker=True, authority="allow-all",
                             poll_seconds=0.05)), producer


async def test_one_trace_runs_from_the_producer_through_two_attempts_to_the_receiver(spans, served, receiver):
    receiver.script("/hook", Reply(500), Reply(200, headers={"External-Id": "r-1"}))
    url, token = served
    async with AsyncClient(url, token=token) as client:
        with PRODUCER.start_as_current_span("checkout") as producer:
            await client.enqueue(destination="hook", scope="acme", payload={"order": 1}, action_id="o-1")
        intent = await client.wait("o-1", timeout=20, scope="acme")
    assert intent.status == "delivered"
    ours = producer.get_span_context()

    [create] = named(spans, "create ")
    assert create.name == "create hook" and create.parent is not None and create.parent.span_id == ours.span_id
    assert create.context.trace_id == ours.trace_id
    assert dict(create.attributes or {})["messaging.message.id"] == "o-1"
    assert intent.data["trace"] == {"traceparent": traceparent(create)}  # GET /v1/intents/{id} shows it

    first, second = named(spans, "send ")
    for number, (span, status_code) in enumerate(((first, 500), (second, 200)), start=1):
        attributes = dict(span.attributes or {})
        assert span.parent is not None and span.parent.span_id == create.context.span_id
        assert span.context.trace_id == ours.trace_id
        assert attributes["outbox.attempt.number"] == number
        assert attributes["http.response.status_code"] == status_code
        assert attributes["url.full"] == f"{receiver.url}/hook" and attributes["http.request.method"] == "POST"
    assert first.status.status_code is StatusCode.ERROR and second.status.status_code is StatusCode.UNSET
    assert dict(first.attributes or {})["outbox.outcome"] == "retryable"
    assert dict(second.attributes or {})["outbox.external_id"] == "r-1"

    seen = [request.headers["traceparent"] for request in receiver.requests("/hook")]
    assert [trace_id(value) for value in seen] == [f"{ours.trace_id:032x}"] * 2
    assert seen == [traceparent(first), traceparent(second)]  # each request under its attempt's span


async def test_a_malformed_traceparent_is_ignored_never_an_error(spans, api: Api):
    async with api.client(api.producer) as http:
        answer = await http.post("/v1/intents", headers={"traceparent": MALFORMED},
                                 json={"scope": "acme", "destination": "billing", "payload": {}, "action_id": "m-1"})
        assert answer.status_code == 201, answer.text
        [create] = named(spans, "create ")
        assert create.parent is None  # the create span is a root of its own trace
        assert answer.json()["trace"]["traceparent"] == traceparent(create)
        shown = (await http.get("/v1/intents/m-1", params={"scope": "acme"})).json()
        assert shown["trace"] == answer.json()["trace"]


async def test_without_the_sdk_a_malformed_traceparent_is_stored_as_none_and_a_valid_one_as_sent(api: Api):
    valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    async with api.client(api.producer) as http:
        for action_id, header in (("n-1", MALFORMED), ("n-2", valid)):
            answer = await http.post("/v1/intents", headers={"traceparent": header, "tracestate": "k=v"},
                                     json={"scope": "acme", "destination": "billing", "payload": {},
                                           "action_id": action_id})
            assert answer.status_code == 201, answer.text
        assert (await http.get("/v1/intents/n-1", params={"scope": "acme"})).json()["trace"] is None
        assert (await http.get("/v1/intents/n-2", params={"scope": "acme"})).json()["trace"] == {
            "traceparent": valid, "tracestate": "k=v"}


async def test_a_batch_item_with_its_own_traceparent_keeps_it_and_the_others_take_the_requests(spans, api: Api):
    own = "00-11111111111111111111111111111111-2222222222222222-01"
    header = "00-33333333333333333333333333333333-4444444444444444-01"
    items: list[dict[str, Any]] = [
        {"scope": "acme", "destination": "billing", "payload": {"n": 1}, "action_id": "b-1", "traceparent": own,
         "tracestate": "a=1"},
        {"scope": "acme", "destination": "billing", "payload": {"n": 2}, "action_id": "b-2"},
        {"scope": "acme", "destination": "billing", "payload": {"n": 3}, "action_id": "b-3", "traceparent": "x"},
    ]
    async with api.client(api.producer) as http:
        answer = await http.post("/v1/intents:batch", headers={"traceparent": header}, json={"intents": items})
    assert answer.status_code == 200 and [r["status"] for r in answer.json()["results"]] == [201, 201, 201]
    by_id = {dict(span.attributes or {})["messaging.message.id"]: span for span in named(spans, "create ")}
    assert f"{by_id['b-1'].parent.span_id:016x}" == span_id(own)
    assert f"{by_id['b-1'].context.trace_id:032x}" == trace_id(own)
    assert f"{by_id['b-2'].parent.span_id:016x}" == span_id(header)
    assert by_id["b-3"].parent is None  # its own traceparent is malformed: ignored, not the request's
    [first, *_] = answer.json()["results"]
    assert first["intent"]["trace"] == {"traceparent": traceparent(by_id["b-1"]), "tracestate": "a=1"}


async def test_a_kafka_record_carries_the_attempts_traceparent(spans, env: SenderEnv, kafka: Broker):
    await kafka.create_topic(TOPIC)
    await register_kafka(env, kafka)
    with PRODUCER.start_as_current_span("order placed") as producer:
        await env.enqueue("k-1", destination="log")
    channel = KafkaChannel()
    async with env.running(channels={"kafka": channel}):
        assert await eventually(lambda: env.status_is("k-1", Status.DELIVERED), timeout=15)
    [record] = await records(kafka)
    headers = dict(record.headers)
    [send] = named(spans, "send ")
    assert headers["traceparent"].decode() == traceparent(send)
    assert send.context.trace_id == producer.get_span_context().trace_id
    attributes = dict(send.attributes or {})
    assert attributes["messaging.system"] == "kafka" and attributes["messaging.destination.name"] == TOPIC
    assert attributes["messaging.destination.partition.id"] == str(record.partition)
    assert attributes["messaging.kafka.offset"] == record.offset

    # the idempotent consumer continues that trace: its span under the send, the handler's under it
    async def handle(record: Any, context: IdempotencyContext) -> None:
        with CONSUMER_APP.start_as_current_span("post the order"):
            handled.append(context.key)

    handled: list[str] = []
    consumer = IdempotentConsumer(AIOKafkaConsumer(TOPIC, bootstrap_servers=kafka.bootstrap, group_id="fulfilment",
                                                   enable_auto_commit=False, auto_offset_reset="earliest"),
                                  MemoryRecordStore(), handle)
    async with consumer:
        assert await eventually(lambda: handled == ["acme/k-1"], timeout=20), handled
        [consumed] = await _ended(spans, f"process {TOPIC}")
    [handler] = named(spans, "post the order")
    assert consumed.parent is not None and consumed.parent.span_id == send.context.span_id
    assert consumed.context.trace_id == producer.get_span_context().trace_id
    assert handler.parent is not None and handler.parent.span_id == consumed.context.span_id
    assert dict(consumed.attributes or {})["outbox.idempotency.outcome"] == "claimed"


async def _ended(spans: Any, name: str) -> list[Any]:
    """The spans called ``name`` once one has ended (a consumer's span ends after its record is settled)."""
    assert await eventually(lambda: named(spans, name), timeout=10), [s.name for s in spans.get_finished_spans()]
    return named(spans, name)


async def test_an_email_carries_the_attempts_traceparent_header(spans, env: SenderEnv):
    smtp = SmtpServer().start()
    try:
        await _email_carries_traceparent(spans, env, smtp)
    finally:
        smtp.stop()


async def _email_carries_traceparent(spans, env: SenderEnv, smtp: SmtpServer) -> None:
    await register_mail(env, smtp)
    with PRODUCER.start_as_current_span("receipt due") as producer:
        await env.enqueue("e-1", MAIL, destination="mail")
    channel = EmailChannel(tls_context=SmtpServer.client_context())
    async with env.running(channels={"email": channel}):
        assert await eventually(lambda: env.status_is("e-1", Status.DELIVERED), timeout=10)
    [got] = smtp.received
    [send] = named(spans, "send ")
    assert got.message["traceparent"] == traceparent(send)
    assert send.context.trace_id == producer.get_span_context().trace_id
    assert dict(send.attributes or {})["outbox.stage"] == "done"


async def test_an_operators_replay_is_linked_to_the_intents_trace(spans, env: SenderEnv, receiver: Receiver):
    receiver.script("/hook", Reply(400), Reply(200))
    await env.destination(f"{receiver.url}/hook")
    with PRODUCER.start_as_current_span("checkout"):
        await env.enqueue("r-1")
    await env.worker().run_once()
    assert await env.status_is("r-1", Status.DEAD)
    await operations.replay(env.box, "r-1", operations.Actor("oncall", "receiver fixed"))
    [create] = named(spans, "create ")
    [replay] = named(spans, "replay ")
    assert replay.context.trace_id != create.context.trace_id  # the operator's own trace
    assert [link.context.span_id for link in replay.links] == [create.context.span_id]
    assert dict(replay.attributes or {})["outbox.actor"] == "oncall"


async def test_each_intent_of_an_event_is_a_child_of_the_events_create_span(spans, env: SenderEnv,
                                                                            receiver: Receiver):
    for name in ("a", "b"):
        await env.box.put_destination(name, DestinationSpec(
            url=f"{receiver.url}/{name}", secret=SECRET, allow_private_network=True,
            subscriptions=[{"topic": "invoice.*"}]))
    with PRODUCER.start_as_current_span("invoice paid") as producer:
        published = await env.box.publish(scope="acme", topic="invoice.paid", payload={"id": 9}, event_id="ev-1")
    [create] = named(spans, "create ")
    assert create.name == "create invoice.paid" and create.parent.span_id == producer.get_span_context().span_id
    kept = {json.loads((await env.box.get(d.action_id, scope="acme")).trace_context or "{}")["traceparent"]
            for d in published.event.fanout}
    assert kept == {traceparent(create)}
