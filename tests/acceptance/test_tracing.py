"""One trace across processes: a producer's span (made here with the SDK) sent as traceparent by
the Python client to a real ``outbox serve --no-worker``, a separate ``outbox worker`` making the
attempts, a real uvicorn receiver that fails once; both outbox processes set up their SDK from
``OTEL_*`` alone and export OTLP/HTTP to a small collector run here (an HTTP server on loopback
decoding ``ExportTraceServiceRequest`` protobufs)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from outbox import DestinationSpec, Outbox, Role
from outbox.client import AsyncClient

from ..conftest import SECRET, eventually
from ..receiver import Receiver, Reply
from .conftest import clean_env, outbox_worker, served_in_thread
from .test_service import Service

pytestmark = pytest.mark.acceptance


@dataclass(frozen=True)
class Exported:
    """One span as a process exported it."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]


class Collector:
    """``POST /v1/traces``: OTLP/HTTP protobuf, every span kept (thread-safe)."""

    def __init__(self) -> None:
        self.spans: list[Exported] = []
        self._lock = threading.Lock()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        status = 404
        if scope["method"] == "POST" and scope["path"] == "/v1/traces":
            self._keep(ExportTraceServiceRequest.FromString(body))
            status = 200
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/x-protobuf")]})
        await send({"type": "http.response.body", "body": b""})

    def _keep(self, request: ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            resource = {kv.key: kv.value.string_value for kv in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    attributes = {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in span.attributes}
                    with self._lock:
                        self.spans.append(Exported(resource["service.name"], span.name, span.trace_id.hex(),
                                                   span.span_id.hex(), span.parent_span_id.hex(), attributes))

    def named(self, prefix: str) -> list[Exported]:
        with self._lock:
            return [span for span in self.spans if span.name.startswith(prefix)]


@pytest.fixture
def collector() -> Iterator[tuple[Collector, str]]:
    app = Collector()
    with served_in_thread(app, "collector") as url:
        yield app, url


async def test_one_trace_from_the_producer_through_serve_and_a_separate_worker_to_the_receiver(
        tmp_path: Path, spans, collector, receiver: Receiver):
    app, collector_url = collector
    receiver.script("/hook", Reply(500), Reply(200))
    db = f"sqlite:///{tmp_path / 'traced.db'}"
    async with await Outbox.open(db) as box:
        await box.put_destination("hook", DestinationSpec(url=f"{receiver.url}/hook", secret=SECRET,
                                                          allow_private_network=True, retry_schedule=[0.2]))
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
            assert await eventually(lambda: len(app.named("send ")) >= 2, timeout=10), app.spans
    finally:
        service.stop()
    ours = producer.get_span_context()
    [create] = app.named("create ")
    assert (create.service, create.trace_id, create.parent_id) == (
        "outbox-api", f"{ours.trace_id:032x}", f"{ours.span_id:016x}")
    sends = sorted(app.named("send "), key=lambda span: span.attributes["outbox.attempt.number"])
    assert [(s.service, s.trace_id, s.parent_id) for s in sends] == [
        ("outbox-worker", create.trace_id, create.span_id)] * 2
    assert [s.attributes["http.response.status_code"] for s in sends] == [500, 200]
    seen = [request.headers["traceparent"] for request in receiver.requests("/hook")]
    assert [value.split("-")[1:3] for value in seen] == [[s.trace_id, s.span_id] for s in sends]
