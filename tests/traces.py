"""The SDK in this test process: every span ends in an in-memory exporter the tests read.

The global tracer provider can be set once per process, so it is set by the first test that
asks (``memory()``) and the exporter is emptied for each test instead.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_EXPORTER = InMemorySpanExporter()
_PROVIDER = TracerProvider()
_PROVIDER.add_span_processor(SimpleSpanProcessor(_EXPORTER))


def memory() -> InMemorySpanExporter:
    """The exporter every finished span of this process reaches, emptied."""
    if trace.get_tracer_provider() is not _PROVIDER:
        trace.set_tracer_provider(_PROVIDER)
    assert trace.get_tracer_provider() is _PROVIDER, "another tracer provider was set in this process"
    _EXPORTER.clear()
    return _EXPORTER


def named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    """The finished spans whose name starts with ``prefix``, in the order they ended."""
    return [span for span in exporter.get_finished_spans() if span.name.startswith(prefix)]


def traceparent(span: ReadableSpan) -> str:
    """The W3C traceparent that names ``span``."""
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-01"
