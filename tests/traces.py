"""The SDK in this test process, for the tests that ask (the ``spans`` fixture): while one runs,
every span ends in an in-memory exporter it reads; before and after, spans are the API's no-ops,
exactly as without an SDK, so no other test sees a ``traceparent`` it did not ask for.

The global tracer provider can be set only once per process (and the outbox's proxy tracer keeps
what it resolved), so the one set here is a switch between the SDK's tracers and no-op ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_EXPORTER = InMemorySpanExporter()
_SDK = TracerProvider()
_SDK.add_span_processor(SimpleSpanProcessor(_EXPORTER))
_NOOP = trace.NoOpTracer()
_on = False


class _Switched(trace.Tracer):
    """The SDK's tracer while a test records spans, else the no-op one."""

    def __init__(self, sdk: trace.Tracer) -> None:
        self._sdk = sdk

    def _now(self) -> trace.Tracer:
        return self._sdk if _on else _NOOP

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        return self._now().start_span(*args, **kwargs)

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        return self._now().start_as_current_span(*args, **kwargs)


class _Provider(trace.TracerProvider):
    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return _Switched(_SDK.get_tracer(*args, **kwargs))


_PROVIDER = _Provider()


def recording() -> Iterator[InMemorySpanExporter]:
    """Record spans into the (emptied) exporter until the generator is closed."""
    global _on
    if trace.get_tracer_provider() is not _PROVIDER:
        trace.set_tracer_provider(_PROVIDER)
    assert trace.get_tracer_provider() is _PROVIDER, "another tracer provider was set in this process"
    _EXPORTER.clear()
    _on = True
    try:
        yield _EXPORTER
    finally:
        _on = False


def named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    """The finished spans whose name starts with ``prefix``, in the order they ended."""
    return [span for span in exporter.get_finished_spans() if span.name.startswith(prefix)]


def traceparent(span: ReadableSpan) -> str:
    """The W3C traceparent that names ``span``."""
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
