"""The receivers' spans (OpenTelemetry, API only): each request the middleware decides on and each
message a consumer (Kafka, RabbitMQ, NATS) settles continues the sender's trace.

The W3C trace context (``traceparent``/``tracestate``) is read from the request's or the record's
headers with the application's propagator (``opentelemetry.propagate``), so a missing or
malformed one simply starts a new trace. Until the application installs an SDK (sets a tracer
provider, or passes one) none of this is done at all, so it costs a receiver nothing. The
attribute names below are the README's.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import (
    NoOpTracerProvider,
    ProxyTracerProvider,
    Span,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
    TracerProvider,
)

from .messages import Readable
from .records import Busy, Claimed, Mismatch, Replay, StaleFence
from .wire import Problem

if TYPE_CHECKING:
    from .kafka_records import FetchedRecord
    from .records import ClaimResult

#: The instrumentation scope of every span the receivers make.
SCOPE = "receivers"

IDEMPOTENCY_KEY = "outbox.idempotency_key"
OUTCOME = "outbox.idempotency.outcome"
#: The problem kind (``wire.Problem``, the end of the problem's ``type``) of a refusal.
PROBLEM = "outbox.idempotency.problem"
FENCE = "outbox.fence"
#: The record's epoch under which the handler ran (a takeover raises it).
EPOCH = "outbox.epoch"
#: True when the answer came from the record and the handler did not run (an HTTP replay, a
#: Kafka record whose key had completed: a duplicate).
REPLAYED = "outbox.replayed"
#: A reconcile probe's answer: the key's state (``absent``, ``in_progress``, ``completed``).
RECONCILE_STATE = "outbox.reconcile.state"


class Outcome(str, enum.Enum):
    """What the middleware or the consumer did with a request or a record."""

    CLAIMED = "claimed"  # the key was claimed and the handler ran
    REPLAYED = "replayed"  # completed before: the stored answer, handler not run
    CONFLICT = "conflict"  # the key was used for another request or payload (422)
    BUSY = "busy"  # another request holds the key under a valid lease (409, retry later)
    STALE_FENCE = "stale_fence"  # a newer attempt's fence was seen (409, handler not run)
    REFUSED = "refused"  # refused before claiming: key, fence, size, signature, body (4xx)
    UNAVAILABLE = "unavailable"  # the record store could not be used (503, handler not run)
    PROBE = "probe"  # a reconcile probe answered with the key's state
    PASSED = "passed"  # no key where none is required: handed to the app unprotected


#: Problems whose outcome is not REFUSED.
_PROBLEM_OUTCOMES = {
    Problem.KEY_REUSED: Outcome.CONFLICT,
    Problem.IN_PROGRESS: Outcome.BUSY,
    Problem.STALE_FENCE: Outcome.STALE_FENCE,
    Problem.STORE_UNAVAILABLE: Outcome.UNAVAILABLE,
}


def outcome_of_problem(kind: str) -> Outcome:
    """The outcome a problem answer of ``kind`` stands for."""
    return _PROBLEM_OUTCOMES.get(kind, Outcome.REFUSED)


def tracer(provider: TracerProvider | None) -> Tracer:
    """The receivers' tracer from ``provider``; None: the global provider (a proxy until the
    application installs an SDK, which it then follows)."""
    return trace.get_tracer(SCOPE, tracer_provider=provider)


def recording(provider: TracerProvider | None) -> bool:
    """Whether spans are made: ``provider`` or, None, the global one is an SDK's. Asked for each
    request or round of records, since the application may set its provider after the receiver
    started."""
    found = trace.get_tracer_provider() if provider is None else provider
    return not isinstance(found, ProxyTracerProvider | NoOpTracerProvider)


class _Headers(Getter[Sequence[tuple[str, Any]]]):
    """Reads a header list of (lower-case name, value) pairs; Kafka's values are bytes."""

    def get(self, carrier: Sequence[tuple[str, Any]], key: str) -> list[str] | None:
        found = [v.decode("latin-1") if isinstance(v, bytes) else v for k, v in carrier
                 if v is not None and k.lower() == key]  # a Kafka header's value may be null
        return found or None

    def keys(self, carrier: Sequence[tuple[str, Any]]) -> list[str]:
        return [k for k, _ in carrier]


_HEADERS = _Headers()


def server_span(tracer: Tracer, method: str, path: str, scheme: str, headers: Sequence[tuple[str, str]]) -> Span:
    """A SERVER span (HTTP server conventions), the child of the request's trace context."""
    parent = propagate.extract(headers, getter=_HEADERS)
    return tracer.start_span(method, context=parent, kind=SpanKind.SERVER, attributes={
        "http.request.method": method, "url.path": path, "url.scheme": scheme})


def identify(span: Span, key: str | None, fence: int | None) -> None:
    """Tell a request's span the key and fence it names."""
    if key is not None:
        span.set_attribute(IDEMPOTENCY_KEY, key)
    if fence is not None:
        span.set_attribute(FENCE, fence)


def decided(span: Span, outcome: str, *, epoch: int | None = None, problem: str | None = None) -> None:
    """Tell a request's span what the middleware decided (``epoch``: the claim's)."""
    span.set_attributes({OUTCOME: outcome, REPLAYED: outcome == Outcome.REPLAYED.value})
    if epoch is not None:
        span.set_attribute(EPOCH, epoch)
    if problem is not None:
        span.set_attribute(PROBLEM, problem)


def responded(span: Span, status: int) -> None:
    """Record the response's status; a 5xx is the span's error (HTTP server conventions)."""
    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        span.set_attribute("error.type", str(status))
        span.set_status(Status(StatusCode.ERROR))


def failed(span: Span, exc: Exception) -> None:
    """Record an exception the handler raised and that was caught (as ``trace.use_span`` records
    one that is not)."""
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


class Settled(Readable, Protocol):
    """A message as a consumer settles it (``kafka_records.FetchedRecord``, ``consuming.Fetched``)."""

    answer: ClaimResult | None


@contextmanager
def consumer_span(tracer: Tracer, group: str, item: FetchedRecord) -> Iterator[Span]:
    """A CONSUMER span (messaging conventions, ``process``) for one Kafka record, the child of
    the trace context in its headers, current while the record is settled (made only while
    ``recording``: the consumer asks once per round of records, not per record)."""
    record = item.record
    with message_span(tracer, f"process {record.topic}", record.headers or (), item, {
        "messaging.system": "kafka", "messaging.operation.type": "process", "messaging.operation.name": "process",
        "messaging.destination.name": record.topic, "messaging.destination.partition.id": str(record.partition),
        "messaging.kafka.offset": record.offset, "messaging.consumer.group.name": group,
    }) as span:
        yield span


@contextmanager
def message_span(tracer: Tracer, name: str, headers: Sequence[tuple[str, Any]], item: Settled,
                 attributes: dict[str, Any]) -> Iterator[Span]:
    """A CONSUMER span named ``name`` for one message of any broker, the child of the trace
    context in its ``headers`` ((name, value) pairs), with the broker's ``attributes`` and what the
    consumer decided, current while the message is settled."""
    parent = propagate.extract(headers, getter=_HEADERS)
    answer = item.answer
    outcome = (Outcome.CLAIMED if isinstance(answer, Claimed) else Outcome.REPLAYED if isinstance(answer, Replay)
               else Outcome.CONFLICT if isinstance(answer, Mismatch) else Outcome.BUSY if isinstance(answer, Busy)
               else Outcome.STALE_FENCE if isinstance(answer, StaleFence) else Outcome.REFUSED)
    attributes[OUTCOME] = outcome.value
    attributes[REPLAYED] = outcome is Outcome.REPLAYED
    if item.key is not None:
        attributes[IDEMPOTENCY_KEY] = item.key
    if item.request is not None and item.request.fence is not None:
        attributes[FENCE] = item.request.fence
    if isinstance(answer, Claimed):
        attributes[EPOCH] = answer.epoch
    if item.refused is not None:
        attributes[PROBLEM] = item.refused.reason.value
    span = tracer.start_span(name, context=parent, kind=SpanKind.CONSUMER, attributes=attributes)
    with trace.use_span(span, end_on_exit=True):
        yield span
