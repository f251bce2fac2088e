"""One trace across processes: a producer's span (made here with the SDK) sent as traceparent by
the Python client to a real ``outbox serve --no-worker``, a separate ``outbox worker`` making the
attempts, and a real uvicorn receiver whose app runs behind the receivers' idempotency middleware,
reached through a gateway that fails the first request. Both outbox processes set up their SDK
from ``OTEL_*`` alone and export OTLP/HTTP to a collector run here (``tests.otlp``); the
receiver's spans (the middleware's and the handler's) are this process's, read from the SDK's
in-memory exporter (the ``spans`` fixture). The same through Kafka: the worker produces to a real
broker and the idempotent consumer's span, with its handler's inside, continues the trace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from outbox import DestinationSpec, Outbox, Role
from outbox.client import AsyncClient
from receivers import IdempotencyContext, IdempotencyMiddleware, IdempotentConsumer, MemoryRecordStore
from sender.kafka import KafkaSpec

from ..conftest import SECRET, eventually
from ..kafka import Broker
from ..traces import named
from .conftest import clean_env, outbox_worker, served_in_thread
from .test_service import Service

pytestmark = pytest.mark.acceptance

BILLING = trace.get_tracer("billing")


class Gateway:
    """In front of the receiver's app: answers the first request 500 itself (the app never sees
    it), passes the others on, and keeps every request's traceparent."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.traceparents: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.traceparents.append(dict(scope["headers"]).get(b"traceparent", b"").decode())
            if len(self.traceparents) == 1:
                await Response(status_code=500)(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def invoice(request: Request) -> Response:
    with BILLING.start_as_current_span("record the invoice"):
        return JSONResponse({"recorded": (await request.json())["order"]})


async def _delivered_through_serve_and_a_worker(tmp_path: Path, collector_url: str, spec: Any) -> trace.Span:
    """Destination ``hook`` registered as ``spec``; a real ``outbox serve --no-worker`` and a
    separate ``outbox worker``, both exporting to the collector; an intent enqueued through the
    client inside a producer's span ("checkout"), which is returned once the intent is delivered."""
    db = f"sqlite:///{tmp_path / 'traced.db'}"
    async with await Outbox.open(db) as box:
        await box.put_destination("hook", spec)
        token, _ = await box.create_token(Role.PRODUCER, ["acme"])
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector_url, "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OUTBOX_DATABASE_URL": db, "OUTBOX_AUTHORITY": "allow-all", "OUTBOX_POLL_SECONDS": "0.1"}
    service = Service(tmp_path, "--no-worker", env={**otel, "OTEL_SERVICE_NAME": "outbox-api"})
    try:
        with outbox_worker(tmp_path, clean_env(**otel, OTEL_SERVICE_NAME="outbox-worker")) as (_worker, log):
            async with AsyncClient(service.url, token=token) as client:
                with trace.get_tracer("shop").start_as_current_span("checkout") as producer:
                    await client.enqueue(destination="hook", scope="acme", payload={"order": 1}, action_id="o-1")
                intent = await client.wait("o-1", timeout=30, scope="acme")
            assert intent.status == "delivered", log.read_text()
    finally:
        service.stop()
    return producer


async def test_one_trace_from_the_producer_through_serve_and_a_separate_worker_to_the_handler(
        tmp_path: Path, spans, collector):
    app, collector_url = collector
    gateway = Gateway(IdempotencyMiddleware(Starlette(routes=[Route("/hook", invoice, methods=["POST"])]),
                                            store=MemoryRecordStore(), secrets=SECRET))
    with served_in_thread(gateway, "billing") as receiver_url:
        spec = DestinationSpec(url=f"{receiver_url}/hook", secret=SECRET, allow_private_network=True,
                               retry_schedule=[0.2])
        producer = await _delivered_through_serve_and_a_worker(tmp_path, collector_url, spec)
        assert await eventually(lambda: len(app.named("send ")) >= 2, timeout=10), app.spans
    ours = producer.get_span_context()
    [create] = app.named("create ")
    assert (create.service, create.trace_id, create.parent_id) == (
        "outbox-api", f"{ours.trace_id:032x}", f"{ours.span_id:016x}")
    sends = sorted(app.named("send "), key=lambda span: span.attributes["outbox.attempt.number"])
    assert [(s.service, s.trace_id, s.parent_id) for s in sends] == [
        ("outbox-worker", create.trace_id, create.span_id)] * 2
    assert [s.attributes["http.response.status_code"] for s in sends] == [500, 200]
    assert [value.split("-")[1:3] for value in gateway.traceparents] == [[s.trace_id, s.span_id] for s in sends]
    # the receiver's side: one middleware span, under the second attempt's, and the handler's under it
    [server] = [span for span in spans.get_finished_spans() if span.kind is SpanKind.SERVER]
    [handler] = named(spans, "record the invoice")
    assert (f"{server.context.trace_id:032x}", f"{server.parent.span_id:016x}") == (create.trace_id, sends[1].span_id)
    assert handler.parent is not None and handler.parent.span_id == server.context.span_id
    assert dict(server.attributes or {})["outbox.idempotency.outcome"] == "claimed"


async def test_one_trace_from_the_producer_through_serve_a_worker_and_kafka_to_the_consumers_handler(
        tmp_path: Path, spans, collector, kafka: Broker):
    app, collector_url = collector
    await kafka.create_topic("orders")
    spec = KafkaSpec(channel="kafka", bootstrap_servers=[kafka.bootstrap], topic="orders", secret=SECRET,
                     allow_private_network=True, enable_idempotence=True)
    producer = await _delivered_through_serve_and_a_worker(tmp_path, collector_url, spec)
    assert await eventually(lambda: app.named("send "), timeout=10), app.spans
    [send] = app.named("send ")

    async def handle(record: Any, context: IdempotencyContext) -> None:
        with BILLING.start_as_current_span("post the order"):
            handled.append(context.key)

    handled: list[str] = []
    consumer = IdempotentConsumer(AIOKafkaConsumer("orders", bootstrap_servers=kafka.bootstrap, group_id="billing",
                                                   enable_auto_commit=False, auto_offset_reset="earliest"),
                                  MemoryRecordStore(), handle)
    async with consumer:
        assert await eventually(lambda: handled == ["acme/o-1"], timeout=20), handled
        assert await eventually(lambda: named(spans, "process orders"), timeout=10)
    [consumed] = named(spans, "process orders")
    [handler] = named(spans, "post the order")
    assert send.trace_id == f"{producer.get_span_context().trace_id:032x}" and send.service == "outbox-worker"
    assert (f"{consumed.context.trace_id:032x}", f"{consumed.parent.span_id:016x}") == (send.trace_id, send.span_id)
    assert handler.parent is not None and handler.parent.span_id == consumed.context.span_id
