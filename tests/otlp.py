"""An OTLP/HTTP trace collector for the tests: an ASGI app taking ``POST /v1/traces`` (the
protobuf ``ExportTraceServiceRequest`` the SDK's exporter posts) and keeping every span, so a
test can follow one trace across the processes that exported to it."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from receivers.asgi import read_body


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
        body = await read_body(receive, 64 << 20) or b""
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
