"""One trace across processes: a producer's span (made here with the SDK) sent as traceparent by
the Python client to a real ``outbox serve --no-worker``, a separate ``outbox worker`` making the
attempts, a real uvicorn receiver that fails once; both outbox processes set up their SDK from
``OTEL_*`` alone and export OTLP/HTTP to a small collector run here (an HTTP server on loopback
decoding ``ExportTraceServiceRequest`` protobufs)."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry import trace

from outbox import DestinationSpec, Outbox, Role
from outbox.client import AsyncClient

from ..conftest import SECRET, eventually
from ..receiver import Receiver, Reply
from .conftest import clean_env, outbox_worker
from .test_service import Service

pytestmark = pytest.mark.acceptance


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
