"""The README's receiver tracing example, run as printed: its spans reach an OTLP/HTTP collector
on loopback (a plain HTTP server that decodes what the exporter posts), in the sender's trace."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from receivers import IdempotencyMiddleware

from . import test_readme as readme
from .test_readme import signed

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SENDER_SPAN_ID = "00f067aa0ba902b7"


class Collector:
    """Receives OTLP/HTTP trace exports (protobuf) on 127.0.0.1 and keeps the spans."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.received = threading.Event()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                export = ExportTraceServiceRequest.FromString(self.rfile.read(int(self.headers["content-length"])))
                for resource in export.resource_spans:
                    for scope in resource.scope_spans:
                        collector.spans += [(resource.resource, span) for span in scope.spans]
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()
                collector.received.set()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"


@pytest.fixture
def collector() -> Iterator[Collector]:
    made = Collector()
    thread = threading.Thread(target=made.server.serve_forever, daemon=True)
    thread.start()
    yield made
    made.server.shutdown()
    made.server.server_close()


async def test_the_tracing_example_exports_the_receivers_span_in_the_senders_trace(
        tmp_path: Path, collector: Collector, monkeypatch: pytest.MonkeyPatch) -> None:
    printed = readme.python_blocks()
    assert "http://127.0.0.1:4318/v1/traces" in printed["receiver-tracing"]
    # only the collector's port is this run's
    monkeypatch.setattr(readme, "python_blocks", lambda: {**printed, "receiver-tracing": printed[
        "receiver-tracing"].replace("http://127.0.0.1:4318/v1/traces", collector.url)})
    example = readme.load("receiver-tracing", tmp_path)
    body = b'{"invoice": 42}'
    headers = {**signed(example["SECRET"], "invoice-42", body), "traceparent": f"00-{TRACE_ID}-{SENDER_SPAN_ID}-01"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(example["app"]), base_url="http://receiver") as client:
        answer = await client.post("/webhooks/billing", content=body, headers=headers)
    assert answer.status_code == 200
    example["provider"].force_flush()
    assert collector.received.wait(10)
    [(resource, span)] = collector.spans
    assert span.trace_id.hex() == TRACE_ID and span.parent_span_id.hex() == SENDER_SPAN_ID
    attributes = {a.key: a.value for a in span.attributes}
    assert attributes["outbox.idempotency_key"].string_value == "invoice-42"
    assert attributes["outbox.idempotency.outcome"].string_value == "claimed"
    assert attributes["http.response.status_code"].int_value == 200
    assert {a.key: a.value.string_value for a in resource.attributes}["service.name"] == "billing-receiver"
    layer = example["app"].middleware_stack
    while not isinstance(layer, IdempotencyMiddleware):
        layer = layer.app
    await layer.idempotency.aclose()
    example["provider"].shutdown()
