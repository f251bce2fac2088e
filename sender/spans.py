"""The span of one attempt: a ``send`` span, child of the intent's create span, following
OpenTelemetry's messaging and HTTP client conventions. While it is current, a channel puts its
context on the wire (``outbox.tracing.carrier``), so the receiver continues the same trace."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from outbox import Attempt, Destination, Intent, Outcome
from outbox.tracing import TRACER, restored

from .channel import SendResult

#: What each channel is as a messaging system (``messaging.system``).
SYSTEMS = {"kafka": "kafka", "email": "smtp", "webhook": "webhook"}


@contextmanager
def sending(intent: Intent, destination: Destination, attempt: Attempt) -> Iterator[Span]:
    """The attempt's span, current while the channel sends (a root when the intent keeps no
    context: the worker's own context is not the producer's). Its attributes are made only
    when it records: without an SDK an attempt pays for no more than the no-op span."""
    with trace.use_span(_opened(intent, destination, attempt), end_on_exit=True, record_exception=True,
                        set_status_on_exception=True) as span:
        yield span


@contextmanager
def apart(intent: Intent, destination: Destination, attempt: Attempt) -> Iterator[tuple[Span, Context]]:
    """The span of one attempt of a batch (``sending``'s, not made current: the batch is one
    send) and its context, which the channel puts on that attempt's wire (``Send.context``)."""
    span = _opened(intent, destination, attempt)
    try:
        yield span, trace.set_span_in_context(span)
    except BaseException as exc:
        if span.is_recording():
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        span.end()


def _opened(intent: Intent, destination: Destination, attempt: Attempt) -> Span:
    span = TRACER.start_span(f"send {destination.id}", context=restored(intent.trace_context) or Context(),
                             kind=SpanKind.PRODUCER if intent.channel == "kafka" else SpanKind.CLIENT)
    if span.is_recording():
        span.set_attributes(_started(intent, destination, attempt))
    return span


def finished(span: Span, intent: Intent, destination: Destination, result: SendResult) -> None:
    """Record what the attempt established on its span (an error status unless delivered)."""
    if not span.is_recording():
        return
    attributes: dict[str, Any] = {"outbox.submission": result.submission.value, "outbox.outcome": result.outcome.value}
    if result.stage is not None:
        attributes["outbox.stage"] = result.stage
    if result.external_id is not None:
        attributes["outbox.external_id"] = result.external_id
    if intent.channel == "webhook" and result.status_code is not None:
        attributes["http.response.status_code"] = result.status_code
    if intent.channel == "kafka" and result.external_id:
        _, partition, offset = result.external_id.rsplit("/", 2)
        attributes["messaging.destination.partition.id"] = partition
        attributes["messaging.kafka.offset"] = int(offset)
    span.set_attributes(attributes)
    if result.outcome is not Outcome.DELIVERED:
        span.set_status(Status(StatusCode.ERROR, result.error or result.outcome.value))


def _started(intent: Intent, destination: Destination, attempt: Attempt) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "messaging.operation.type": "send", "messaging.operation.name": "send",
        "messaging.system": SYSTEMS.get(intent.channel, intent.channel),
        "messaging.destination.name": destination.id, "messaging.message.id": intent.action_id,
        "messaging.message.resend_count": attempt.number - 1, "outbox.attempt.number": attempt.number,
        "outbox.attempt_id": attempt.attempt_id, "outbox.fence": attempt.fence, "outbox.scope": intent.scope,
    }
    settings = destination.settings  # (as stored: a row written by hand may lack what is read here)
    if intent.channel == "webhook":
        attributes["http.request.method"] = "POST"
        try:
            if isinstance(url := settings.get("url"), str):
                attributes["url.full"] = public_url(url)
        except ValueError:  # a url the client cannot read either (it refuses to send there)
            pass
    elif intent.channel == "kafka" and isinstance(topic := settings.get("topic"), str):
        attributes["messaging.destination.name"] = topic
        attributes["outbox.destination"] = destination.id
    return attributes


def public_url(url: str) -> str:
    """``url`` without what may be a secret: its user and password, its query and fragment."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
