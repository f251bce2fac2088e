"""The receivers continue the sender's trace: the middleware's SERVER span (ASGI over a real
uvicorn, WSGI over a real wsgiref server with Flask) and the Kafka consumer's CONSUMER span
(a real broker) are children of the W3C context the sender put on the wire, and the handler's
own spans are theirs. Spans go to the SDK's in-memory exporter through a tracer provider passed
to the middleware and the consumer (``tracer_provider=``), never the global one."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from wsgiref.simple_server import make_server

import httpx
import pytest
from flask import Flask, jsonify
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from receivers import IdempotencyContext, IdempotencyMiddleware, IdempotentConsumer, MemoryRecordStore, tracing
from receivers import wsgi as receivers_wsgi
from tests.conftest import eventually
from tests.kafka import Broker

from .test_asgi_middleware import SECRET, signed
from .test_kafka_consumer import GROUP, TOPIC, headers, kafka_consumer, payload, produce, until_committed
from .test_wsgi_middleware import QuietHandler, ThreadingServer

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
SENDER_SPAN_ID = 0xB7AD6B7169203331
TRACEPARENT = f"00-{TRACE_ID:032x}-{SENDER_SPAN_ID:016x}-01"


class Spans:
    """A tracer provider of its own whose finished spans are kept in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.app_tracer = self.provider.get_tracer("the-app")

    def finished(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.finished() if span.name == name]

    async def until(self, count: int, kind: SpanKind) -> list[ReadableSpan]:
        """The spans of ``kind`` once ``count`` have ended (a span ends after its answer left)."""
        def of_kind() -> list[ReadableSpan]:
            return [span for span in self.finished() if span.kind is kind]

        assert await eventually(lambda: len(of_kind()) >= count, 10), self.finished()
        return of_kind()


@pytest.fixture
def spans() -> Iterator[Spans]:
    made = Spans()
    yield made
    made.provider.shutdown()


def assert_child(child: ReadableSpan, parent: ReadableSpan) -> None:
    assert child.parent is not None and child.parent.span_id == parent.context.span_id
    assert child.context.trace_id == parent.context.trace_id


def assert_continues_the_sender(span: ReadableSpan) -> None:
    assert span.context.trace_id == TRACE_ID
    assert span.parent is not None and span.parent.span_id == SENDER_SPAN_ID and span.parent.is_remote


# -- ASGI, over a real uvicorn ----------------------------------------------------------------


def traced_app(spans: Spans, calls: list[IdempotencyContext]) -> Starlette:
    """A handler that counts its runs and makes a span of its own."""

    async def handle(request: Request) -> Response:
        with spans.app_tracer.start_as_current_span("charge"):
            calls.append(request.state.idempotency)
            return JSONResponse({"charged": len(calls)}, status_code=201)

    return Starlette(routes=[Route("/charges", handle, methods=["POST"])])


async def test_the_asgi_span_continues_the_senders_trace_and_a_replay_runs_nothing(serve: Any, spans: Spans) -> None:
    calls: list[IdempotencyContext] = []
    server = serve(IdempotencyMiddleware(traced_app(spans, calls), MemoryRecordStore(),
                                         tracer_provider=spans.provider))
    sent = {"content-type": "application/json", "idempotency-key": "pay-1", "outbox-fence": "3",
            "traceparent": TRACEPARENT, "tracestate": "vendor=x"}
    async with httpx.AsyncClient(base_url=server.url) as client:
        first = await client.post("/charges?x=1", content=b'{"amount": 10}', headers=sent)
        assert first.status_code == 201
        [server_span] = await spans.until(1, SpanKind.SERVER)
        again = await client.post("/charges?x=1", content=b'{"amount": 10}', headers=sent)
        assert (again.status_code, again.headers["idempotent-replayed"]) == (201, "true")
        _, replay = await spans.until(2, SpanKind.SERVER)
    assert len(calls) == 1

    [handler] = spans.named("charge")
    assert_child(handler, server_span)  # the handler ran inside the middleware's span
    assert_continues_the_sender(server_span)
    assert server_span.parent is not None and server_span.parent.trace_state.get("vendor") == "x"
    assert server_span.name == "POST"
    assert dict(server_span.attributes or {}) == {
        "http.request.method": "POST", "url.path": "/charges", "url.scheme": "http",
        "http.response.status_code": 201, tracing.IDEMPOTENCY_KEY: "pay-1", tracing.FENCE: 3,
        tracing.OUTCOME: "claimed", tracing.REPLAYED: False, tracing.EPOCH: calls[0].epoch,
    }
    assert server_span.status.status_code is StatusCode.UNSET

    assert_continues_the_sender(replay)
    assert replay.kind is SpanKind.SERVER
    assert replay.attributes is not None
    assert (replay.attributes[tracing.OUTCOME], replay.attributes[tracing.REPLAYED]) == ("replayed", True)
    assert replay.attributes["http.response.status_code"] == 201
    assert tracing.EPOCH not in replay.attributes


@pytest.mark.parametrize("traceparent", [
    "00-not-a-trace-id-01",
    "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # the invalid all-zero trace id
    f"00-{TRACE_ID:032x}-{SENDER_SPAN_ID:016x}-01-extra",
    "ff-" + TRACEPARENT[3:],  # version ff is forbidden
])
async def test_a_malformed_traceparent_starts_a_new_trace(serve: Any, spans: Spans, traceparent: str) -> None:
    calls: list[IdempotencyContext] = []
    server = serve(IdempotencyMiddleware(traced_app(spans, calls), MemoryRecordStore(),
                                         tracer_provider=spans.provider))
    async with httpx.AsyncClient(base_url=server.url) as client:
        answer = await client.post("/charges", content=b"{}", headers={
            "content-type": "application/json", "idempotency-key": "k", "traceparent": traceparent})
    assert answer.status_code == 201
    [span] = await spans.until(1, SpanKind.SERVER)
    assert span.parent is None  # a root
    assert span.context.trace_id not in (TRACE_ID, 0)
    assert_child(spans.named("charge")[0], span)


async def test_refusals_a_conflict_and_the_reconcile_probe_are_spans(serve: Any, spans: Spans) -> None:
    calls: list[IdempotencyContext] = []
    server = serve(IdempotencyMiddleware(traced_app(spans, calls), MemoryRecordStore(), secrets=SECRET,
                                         tracer_provider=spans.provider))

    def signed_post(key: str, body: bytes, **extra: str) -> dict[str, Any]:
        return {"content": body, "headers": signed(key, body, time.time(), extra={"traceparent": TRACEPARENT, **extra})}

    async with httpx.AsyncClient(base_url=server.url) as client:
        assert (await client.post("/charges", **signed_post("k", b'{"n": 1}'))).status_code == 201
        assert (await client.post("/charges", **signed_post("k", b'{"n": 2}'))).status_code == 422
        assert (await client.post("/charges", content=b"{}", headers={
            "idempotency-key": "u", "traceparent": TRACEPARENT})).status_code == 401
        probe = json.dumps({"key": "k", "fence": 5}).encode()
        answer = await client.post("/charges", **signed_post("k", probe, **{"outbox-reconcile": "probe",
                                                                            "outbox-fence": "5"}))
        assert (answer.status_code, answer.json()["state"]) == (200, "completed")
        claimed, conflict, unsigned, probed = await spans.until(4, SpanKind.SERVER)
    assert len(calls) == 1
    for span in (claimed, conflict, unsigned, probed):
        assert_continues_the_sender(span)
    assert claimed.attributes is not None and claimed.attributes[tracing.OUTCOME] == "claimed"
    assert dict(conflict.attributes or {}).items() >= {
        tracing.OUTCOME: "conflict", tracing.PROBLEM: "idempotency-key-reused", tracing.REPLAYED: False,
        "http.response.status_code": 422, tracing.IDEMPOTENCY_KEY: "k"}.items()
    assert unsigned.attributes is not None
    assert (unsigned.attributes[tracing.OUTCOME], unsigned.attributes[tracing.PROBLEM]) == ("refused",
                                                                                          "invalid-signature")
    assert dict(probed.attributes or {}).items() >= {
        tracing.OUTCOME: "probe", tracing.RECONCILE_STATE: "completed", tracing.FENCE: 5,
        tracing.IDEMPOTENCY_KEY: "k", "http.response.status_code": 200}.items()


async def test_a_handler_that_raises_is_an_error_span(serve: Any, spans: Spans) -> None:
    async def fails(request: Request) -> Response:
        raise RuntimeError("the charge failed")

    app = Starlette(routes=[Route("/charges", fails, methods=["POST"])])
    server = serve(IdempotencyMiddleware(app, MemoryRecordStore(), tracer_provider=spans.provider))
    async with httpx.AsyncClient(base_url=server.url) as client:
        answer = await client.post("/charges", content=b"{}", headers={"idempotency-key": "k",
                                                                         "traceparent": TRACEPARENT})
    assert answer.status_code == 500
    [span] = await spans.until(1, SpanKind.SERVER)
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None and span.attributes["http.response.status_code"] == 500
    assert any(event.name == "exception" for event in span.events)


# -- WSGI (Flask), over a real wsgiref server --------------------------------------------------


def test_the_wsgi_span_continues_the_senders_trace_and_a_replay_runs_nothing(tmp_path: Path, spans: Spans) -> None:
    calls: list[IdempotencyContext] = []
    flask = Flask("traced")

    @flask.post("/charges")
    def charge() -> Any:
        from flask import request

        with spans.app_tracer.start_as_current_span("charge"):
            calls.append(request.environ["idempotency"])
            return jsonify(charged=len(calls)), 201

    middleware = receivers_wsgi.IdempotencyMiddleware(flask.wsgi_app, MemoryRecordStore(),
                                                      tracer_provider=spans.provider)
    server = make_server("127.0.0.1", 0, middleware, server_class=ThreadingServer, handler_class=QuietHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sent = {"content-type": "application/json", "idempotency-key": "w-1", "outbox-fence": "2",
            "traceparent": TRACEPARENT}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.server_address[1]}") as client:
            assert client.post("/charges", content=b'{"amount": 1}', headers=sent).status_code == 201
            again = client.post("/charges", content=b'{"amount": 1}', headers=sent)
            assert (again.status_code, again.headers["idempotent-replayed"]) == (201, "true")
            fresh = client.post("/charges", content=b'{"amount": 1}', headers={
                **sent, "idempotency-key": "w-2", "traceparent": "00-garbage"})
            assert fresh.status_code == 201
    finally:
        server.shutdown()
        server.server_close()
        middleware.close()
    assert len(calls) == 2
    server_spans = [span for span in spans.finished() if span.kind is SpanKind.SERVER]
    first, replay, root = server_spans  # the buffered answer is sent after its span ended
    handler, _ = spans.named("charge")
    assert_child(handler, first)
    assert_continues_the_sender(first)
    assert dict(first.attributes or {}) == {
        "http.request.method": "POST", "url.path": "/charges", "url.scheme": "http",
        "http.response.status_code": 201, tracing.IDEMPOTENCY_KEY: "w-1", tracing.FENCE: 2,
        tracing.OUTCOME: "claimed", tracing.REPLAYED: False, tracing.EPOCH: calls[0].epoch,
    }
    assert_continues_the_sender(replay)
    assert replay.attributes is not None and replay.attributes[tracing.REPLAYED] is True
    assert root.parent is None and root.context.trace_id != TRACE_ID


# -- the Kafka consumer, over a real broker ----------------------------------------------------


async def test_a_consumer_span_continues_the_records_trace_and_marks_the_duplicate(kafka: Broker,
                                                                                  spans: Spans) -> None:
    await kafka.create_topic(TOPIC, partitions=1)
    value = payload({"invoice": 7})
    traced = [*headers("inv-7", value, fence=4), ("traceparent", TRACEPARENT.encode())]
    await produce(kafka, ("inv-7", value, traced), ("inv-7", value, traced),
                  ("other", payload({}), [*headers("other", payload({})), ("traceparent", b"00-garbage")]))
    ran: list[IdempotencyContext] = []

    async def handle(record: Any, context: IdempotencyContext) -> None:
        with spans.app_tracer.start_as_current_span("book"):
            ran.append(context)

    consumer = IdempotentConsumer(kafka_consumer(kafka), MemoryRecordStore(), handle, retry_seconds=0.05,
                                  tracer_provider=spans.provider)
    async with consumer:
        await until_committed(consumer, 3)
    assert [context.key for context in ran] == ["inv-7", "other"]
    first, duplicate, other = await spans.until(3, SpanKind.CONSUMER)
    book, other_book = spans.named("book")
    assert_child(book, first)
    assert_continues_the_sender(first)
    assert first.name == f"process {TOPIC}"
    assert dict(first.attributes or {}) == {
        "messaging.system": "kafka", "messaging.operation.type": "process", "messaging.operation.name": "process",
        "messaging.destination.name": TOPIC, "messaging.destination.partition.id": "0",
        "messaging.kafka.offset": 0, "messaging.consumer.group.name": GROUP,
        tracing.IDEMPOTENCY_KEY: "inv-7", tracing.FENCE: 4, tracing.OUTCOME: "claimed", tracing.REPLAYED: False,
        tracing.EPOCH: ran[0].epoch,
    }
    assert_continues_the_sender(duplicate)
    assert duplicate.attributes is not None
    assert (duplicate.attributes[tracing.REPLAYED], duplicate.attributes[tracing.OUTCOME]) == (True, "replayed")
    assert duplicate.attributes["messaging.kafka.offset"] == 1
    assert other.parent is None and other.context.trace_id != TRACE_ID  # a malformed traceparent: a new trace
    assert_child(other_book, other)


async def test_a_failing_handler_is_an_error_consumer_span(kafka: Broker, spans: Spans) -> None:
    await kafka.create_topic(TOPIC, partitions=1)
    value = payload({"n": 1})
    await produce(kafka, ("k", value, [*headers("k", value), ("traceparent", TRACEPARENT.encode())]))
    runs: list[int] = []

    async def handle(record: Any, context: IdempotencyContext) -> None:
        runs.append(context.epoch)
        if len(runs) == 1:
            raise RuntimeError("first try fails")

    consumer = IdempotentConsumer(kafka_consumer(kafka), MemoryRecordStore(), handle, retry_seconds=0.05,
                                  tracer_provider=spans.provider)
    async with consumer:
        await until_committed(consumer, 1)
    failed, succeeded = await spans.until(2, SpanKind.CONSUMER)
    assert failed.status.status_code is StatusCode.ERROR
    assert any(event.name == "exception" for event in failed.events)
    assert succeeded.status.status_code is StatusCode.UNSET
    for span in (failed, succeeded):
        assert_continues_the_sender(span)


# -- the global provider -----------------------------------------------------------------------

GLOBAL_PROVIDER = '''
import asyncio

import httpx
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from receivers import IdempotencyMiddleware, MemoryRecordStore


async def app(scope, receive, send):
    await receive()
    await send({"type": "http.response.start", "status": 201, "headers": []})
    await send({"type": "http.response.body", "body": b"done"})


async def post(client, key):
    answer = await client.post("/", content=b"{}", headers={"idempotency-key": key, "traceparent": TRACEPARENT})
    assert answer.status_code == 201


async def main():
    middleware = IdempotencyMiddleware(app, MemoryRecordStore())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(middleware), base_url="http://r") as client:
        await post(client, "before")  # no SDK yet: no span is made
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)  # set after the middleware was made: followed from now on
        await post(client, "after")
    await middleware.idempotency.aclose()
    print([(span.attributes["outbox.idempotency_key"], format(span.context.trace_id, "032x"))
           for span in exporter.get_finished_spans()])


asyncio.run(main())
'''


def test_the_global_provider_is_followed_once_the_application_sets_it(tmp_path: Path) -> None:
    """In a process of its own, since a global provider can be set once per process."""
    script = tmp_path / "global_provider.py"
    script.write_text(f"TRACEPARENT = {TRACEPARENT!r}\n" + GLOBAL_PROVIDER)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str([("after", f"{TRACE_ID:032x}")])
