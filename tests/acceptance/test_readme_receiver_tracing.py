"""The README's receiver tracing example, run as printed: its span reaches an OTLP/HTTP collector
on loopback (``tests.otlp``), in the sender's trace."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from receivers import IdempotencyMiddleware

from ..conftest import eventually
from ..otlp import Collector
from . import test_readme as readme
from .test_readme import signed

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SENDER_SPAN_ID = "00f067aa0ba902b7"


async def test_the_tracing_example_exports_the_receivers_span_in_the_senders_trace(
        tmp_path: Path, collector: tuple[Collector, str], monkeypatch: pytest.MonkeyPatch) -> None:
    app, url = collector
    printed = readme.python_blocks()
    assert "http://127.0.0.1:4318/v1/traces" in printed["receiver-tracing"]
    # only the collector's port is this run's
    monkeypatch.setattr(readme, "python_blocks", lambda: {**printed, "receiver-tracing": printed[
        "receiver-tracing"].replace("http://127.0.0.1:4318", url)})
    example = readme.load("receiver-tracing", tmp_path)
    body = b'{"invoice": 42}'
    headers = {**signed(example["SECRET"], "invoice-42", body), "traceparent": f"00-{TRACE_ID}-{SENDER_SPAN_ID}-01"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(example["app"]), base_url="http://receiver") as client:
        answer = await client.post("/webhooks/billing", content=body, headers=headers)
    assert answer.status_code == 200
    example["provider"].force_flush()
    assert await eventually(lambda: app.spans, timeout=10)
    [span] = app.spans
    assert span.trace_id == TRACE_ID and span.parent_id == SENDER_SPAN_ID
    assert span.attributes["outbox.idempotency_key"] == "invoice-42"
    assert span.attributes["outbox.idempotency.outcome"] == "claimed"
    assert span.attributes["http.response.status_code"] == 200
    assert span.service == "billing-receiver"
    layer = example["app"].middleware_stack
    while not isinstance(layer, IdempotencyMiddleware):
        layer = layer.app
    await layer.idempotency.aclose()
    example["provider"].shutdown()
