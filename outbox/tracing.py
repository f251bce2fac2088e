"""Tracing with OpenTelemetry: the tracer, the W3C trace context kept with an intent, and the
SDK's setup for ``outbox serve`` and ``outbox worker``.

Only ``opentelemetry-api`` is needed at run time, and without an SDK every span is a no-op that
still carries its parent's context: a producer's ``traceparent`` reaches the receivers all the
same. An intent keeps the context of its ``create`` span (``traceparent`` and ``tracestate``,
as JSON), so each attempt's ``send`` span, made later by whichever worker, is its child.
Propagation is the API's W3C propagator, never hand parsing: a malformed ``traceparent`` is
dropped (stored as none), never an error. What a producer sent is first checked whole against
the W3C grammar (``TRACEPARENT``, ``TRACESTATE_MEMBER``), so the propagator only ever reads a
well-formed value: a malformed ``tracestate`` is dropped with no word said (the propagator would
log a warning quoting it, and it came from outside), and the ``traceparent`` still counts.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger("outbox")

#: The outbox's tracer (a proxy: it follows the provider set later, by ``configure`` or the app).
TRACER = trace.get_tracer("outbox")
#: The W3C Trace Context headers an intent's context is kept and sent as.
FIELDS = ("traceparent", "tracestate")
_W3C = TraceContextTextMapPropagator()

#: A ``traceparent`` (W3C Trace Context, section 3.2): version 00 exactly, a later one (not ff)
#: with what it may add after a dash.
TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}"
                         r"|(?!ff)[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(?:-[\x21-\x7e]*)?")
#: One ``tracestate`` list member (section 3.3.1): a simple or multi-tenant key, ``=``, a value.
TRACESTATE_MEMBER = re.compile(r"(?:[a-z][a-z0-9_\-*/]{0,255}|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13})"
                               r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]")
#: The most list members a ``tracestate`` has (section 3.3.1.1).
TRACESTATE_MEMBERS = 32
#: The longest ``tracestate`` read (the propagator's own bound, past which it drops one).
TRACESTATE_LENGTH = 8192


def well_formed_state(value: str) -> bool:
    """Whether ``value`` is a W3C ``tracestate``: at most 32 list members, each one by the grammar
    (empty ones allowed, as optional whitespace around the commas), no key twice."""
    if len(value) > TRACESTATE_LENGTH:
        return False
    members = [member for part in value.split(",") if (member := part.strip(" \t"))]
    keys = {member.partition("=")[0] for member in members}
    return (len(members) <= TRACESTATE_MEMBERS and len(keys) == len(members)
            and all(TRACESTATE_MEMBER.fullmatch(member) for member in members))


def parsed(carrier: Mapping[str, str] | None) -> Context | None:
    """The context of a valid W3C ``traceparent`` (with its ``tracestate``, when that is
    well formed) in ``carrier``, or None when it is absent or malformed."""
    if not carrier or (parent := carrier.get("traceparent")) is None:
        return None
    if not TRACEPARENT.fullmatch(parent := parent.strip(" \t")):
        return None
    checked = {"traceparent": parent}
    if (state := carrier.get("tracestate")) is not None and well_formed_state(state):
        checked["tracestate"] = state
    context = _W3C.extract(checked)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def sdk_set() -> bool:
    """Whether a tracer provider is set (an SDK, or an app's own): without one every span is a
    no-op carrying its parent's context, which the outbox then carries itself without making it."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def carrier(context: Context | None = None) -> dict[str, str]:
    """``traceparent`` (and ``tracestate`` when there is one) for ``context`` (None: the
    current one); empty when it holds no valid span."""
    headers: dict[str, str] = {}
    _W3C.inject(headers, context=context)
    return headers


def stored_fields(stored: str | None) -> dict[str, str]:
    """The W3C fields an intent keeps (``stored``: JSON text, as ``created`` returned it), its
    ``traceparent`` and ``tracestate`` when there is one; empty when it keeps none, or keeps
    anything else (written into the database by hand), which then fails no read of the intent,
    its listing, nor its send."""
    try:
        found = json.loads(stored) if stored else None
    except ValueError:
        return {}
    if not isinstance(found, dict) or not isinstance(found.get("traceparent"), str):
        return {}
    return {name: value for name in FIELDS if isinstance(value := found.get(name), str)}


def restored(stored: str | None) -> Context | None:
    """The context an intent keeps (``stored``, as ``created`` returned it), or None."""
    return parsed(stored_fields(stored))


def kept(intent: Any) -> dict[str, str]:
    """The trace context an intent keeps (its create span's ``traceparent``, and ``tracestate``
    when there is one), as the console shows it; empty when it keeps none."""
    return stored_fields(intent.trace_context)


def link_to(stored: str | None) -> list[Link]:
    """A link to the span an intent keeps, for work done on it outside its trace (an operator's)."""
    context = restored(stored)
    return [Link(trace.get_current_span(context).get_span_context())] if context is not None else []


def created(destination: str, action_id: str, parent: Mapping[str, str] | None = None, *,
            system: str = "outbox") -> str | None:
    """Record the ``create`` span of an intent, child of the producer's context (``parent``: the
    producer's headers, a malformed or absent ``traceparent`` making it a root; None: the
    current context); returns the context to keep with the intent (JSON), or None when there is
    none (no SDK and no producer's context).

    Without a tracer provider set (no SDK), the span would be a no-op carrying its parent's
    context, so that context is kept as it is, and no span is made: a batch of 500 would
    otherwise pay a few milliseconds for nothing."""
    context = (parsed(parent) or Context()) if parent is not None else None
    if not sdk_set():
        kept = carrier(context)
        return json.dumps(kept, separators=(",", ":")) if kept else None
    with TRACER.start_as_current_span(
        f"create {destination}", context=context, kind=SpanKind.PRODUCER,
        attributes={"messaging.operation.type": "create", "messaging.operation.name": "create",
                    "messaging.system": system, "messaging.destination.name": destination,
                    "messaging.message.id": action_id},
    ):
        kept = carrier()
    return json.dumps(kept, separators=(",", ":")) if kept else None


@contextmanager
def operator_span(action: str, action_id: str, stored: str | None, actor: str) -> Iterator[Span]:
    """A span for an operator's ``action`` (replay, resolve, cancel, approve) on an intent,
    linked to the intent's trace (its own is the operator's request, not the producer's)."""
    with TRACER.start_as_current_span(
        f"{action} {action_id}", kind=SpanKind.INTERNAL, links=link_to(stored),
        attributes={"outbox.operation": action, "messaging.message.id": action_id, "outbox.actor": actor},
    ) as span:
        yield span


# -- setup -------------------------------------------------------------------------------------


def asked(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the ``OTEL_*`` variables ask for traces to be exported: an exporter named (not
    ``none``) or an OTLP endpoint given, and the SDK not disabled (``OTEL_SDK_DISABLED``)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def configure(environ: Mapping[str, str] | None = None) -> Callable[[], None] | None:
    """Install the SDK's tracer provider as the ``OTEL_*`` variables say, when they ask for it
    (``asked``) and the ``tracing`` extra is installed; returns what flushes and stops it at
    exit, or None (then nothing of the SDK is imported and every span stays a no-op).

    Exporters: ``otlp`` (OTLP over HTTP/protobuf, the default; ``OTEL_EXPORTER_OTLP_*`` say
    where) and ``console``. ``OTEL_SERVICE_NAME`` defaults to ``outbox``."""
    env = os.environ if environ is None else environ
    if not asked(env):
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
    except ImportError:
        log.warning("OTEL_* variables ask for traces, but the SDK is not installed "
                    "(pip install 'outbox-delivery[tracing]'); spans are not exported")
        return None
    names = [name.strip().lower() for name in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if name.strip()]
    exporters: list[SpanExporter] = []
    for name in names:
        if name == "console":
            exporters.append(ConsoleSpanExporter())
        elif name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            exporters.append(OTLPSpanExporter())
        else:
            log.warning("OTEL_TRACES_EXPORTER names %r, which the outbox does not export to (otlp, console)", name)
    provider = TracerProvider(resource=Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or "outbox"}))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider.shutdown


def span_ids() -> dict[str, Any]:
    """``trace_id`` and ``span_id`` (hex) of the current span while one is recording, else empty."""
    span = trace.get_current_span()
    if not span.is_recording():
        return {}
    context = span.get_span_context()
    return {"trace_id": format(context.trace_id, "032x"), "span_id": format(context.span_id, "016x")}
