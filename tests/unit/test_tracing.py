"""outbox.tracing's W3C propagation, create span and setup, and the attempt span's attributes
(sender.spans), with the SDK's in-memory exporter; without an SDK, in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

from outbox import Attempt, Destination, Outcome, Submission, tracing
from outbox.model import Intent, OnUnknown, Status
from sender import spans as attempt_spans
from sender.channel import SendResult

from ..traces import named

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_valid_traceparent_is_read_with_its_tracestate():
    context = tracing.parsed({"traceparent": PARENT, "tracestate": "congo=t61rcWkgMzE"})
    assert context is not None
    span_context = trace.get_current_span(context).get_span_context()
    assert (span_context.trace_id, span_context.span_id) == (0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331)
    assert tracing.carrier(context) == {"traceparent": PARENT, "tracestate": "congo=t61rcWkgMzE"}


@pytest.mark.parametrize("carrier", [
    None, {}, {"tracestate": "a=b"},
    {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331"},  # no flags
    {"traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01"},  # the invalid trace id
    {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01"},  # the invalid span id
    {"traceparent": "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},  # a forbidden version
    {"traceparent": "not a traceparent"}, {"traceparent": ""}, {"traceparent": "é" * 60},
])
def test_an_absent_or_malformed_traceparent_is_none(carrier):
    assert tracing.parsed(carrier) is None
    assert tracing.restored(json.dumps(carrier) if carrier else None) is None


@pytest.mark.parametrize("state", [
    "congo=t61rcWkgMzE", "rojo=00f067aa0ba902b7, congo=t61rcWkgMzE", "a=1,,\t,b=2 ,",  # empty members, whitespace
    "fw529a3039@dt=aaaa,rojo=00f0<b>", "k=" + "v" * 256, ",".join(f"k{n}=v" for n in range(32)),
])
def test_a_well_formed_tracestate_is_kept(state):
    context = tracing.parsed({"traceparent": PARENT, "tracestate": state})
    expected = ",".join(member.strip(" \t") for member in state.split(",") if member.strip(" \t"))
    assert tracing.carrier(context) == {"traceparent": PARENT, "tracestate": expected}


@pytest.mark.parametrize("state", [
    "a=b,x\nCRITICAL outbox.sender: forged", "a=b\x1b[31m", "a=\x85", "a=b\u2028", "a=b\r",
    "Upper=1", "a=1,a=2", "a=", "a=b=c", "a=b " + "x" * 9000, ",".join(f"k{n}=v" for n in range(33)),
    "k=" + "v" * 257, "@x=1",
])
def test_a_malformed_tracestate_is_dropped_unread_and_the_traceparent_kept(state, caplog):
    """The propagator's parser logged a warning quoting the member it refused, as it came."""
    with caplog.at_level("DEBUG"):
        context = tracing.parsed({"traceparent": PARENT, "tracestate": state})
    assert tracing.carrier(context) == {"traceparent": PARENT}
    assert caplog.records == []


@pytest.mark.parametrize("parent", [
    PARENT + "\n", PARENT + "\nCRITICAL outbox.sender: forged", PARENT + "-", "00-" + PARENT[3:].upper(),
    PARENT + "x" * 600,  # the propagator warned of its length
    "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-\x1b[31m",
])
def test_a_traceparent_is_matched_whole(parent, caplog):
    with caplog.at_level("DEBUG"):
        assert tracing.parsed({"traceparent": parent, "tracestate": "a=b"}) is None
    assert caplog.records == []


def test_a_later_version_may_add_fields_and_whitespace_around_is_ignored():
    later = "cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what-comes-next"
    assert tracing.parsed({"traceparent": later}) is not None
    assert tracing.carrier(tracing.parsed({"traceparent": f" {PARENT}\t"})) == {"traceparent": PARENT}


def test_the_create_span_is_the_producers_child_and_its_context_is_kept(spans):
    kept = tracing.created("billing", "a1", {"traceparent": PARENT, "tracestate": "congo=t61rcWkgMzE"})
    [span] = named(spans, "create ")
    assert span.name == "create billing" and span.kind is SpanKind.PRODUCER
    assert span.parent is not None and f"{span.parent.span_id:016x}" == PARENT.split("-")[2]
    assert f"{span.context.trace_id:032x}" == PARENT.split("-")[1]
    assert dict(span.attributes or {}) == {
        "messaging.operation.type": "create", "messaging.operation.name": "create", "messaging.system": "outbox",
        "messaging.destination.name": "billing", "messaging.message.id": "a1"}
    assert json.loads(kept or "") == {"traceparent": f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-01",
                                      "tracestate": "congo=t61rcWkgMzE"}


def test_a_malformed_parent_makes_the_create_span_a_root(spans):
    tracing.created("billing", "a1", {"traceparent": "00-zz-yy-01"})
    [span] = named(spans, "create ")
    assert span.parent is None


def test_without_headers_the_create_span_is_the_current_spans_child(spans):
    with trace.get_tracer("test").start_as_current_span("producer") as producer:
        tracing.created("billing", "a1")
    [span] = named(spans, "create ")
    assert span.parent is not None and span.parent.span_id == producer.get_span_context().span_id


def _intent(channel: str, trace_context: str | None) -> Intent:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    return Intent(seq=1, action_id="a1", scope="acme", destination="d1", channel=channel, payload_json="{}",
                  payload_digest="sha256:00", status=Status.LEASED, attempts=2, max_attempts=5, next_attempt_at=now,
                  not_before=None, expires_at=None, lease_owner="w", lease_expires_at=now, fence=3, created_at=now,
                  updated_at=now, last_error=None, trace_context=trace_context)


def _destination(channel: str, settings: dict) -> Destination:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    return Destination(id="d1", channel=channel, settings=settings, secrets=(), idempotent=True,
                       retention_seconds=3600, on_unknown=OnUnknown.DECLARED, timeout_seconds=1,
                       requires_approval=False, allow_private_network=True, disabled=False, created_at=now,
                       updated_at=now)


ATTEMPT = Attempt(attempt_id="att-2", number=2, fence=3, worker="w", started_at=datetime(2026, 1, 1, tzinfo=UTC),
                  finished_at=None, submission=None, outcome=None, status_code=None, reply=None, external_id=None,
                  error=None, duration_ms=None)


def test_a_webhook_attempt_is_a_client_span_under_the_create_span(spans):
    kept = json.dumps({"traceparent": PARENT})
    destination = _destination("webhook", {"url": "https://user:pw@hooks.example:8443/in?token=secret#x"})
    intent = _intent("webhook", kept)
    with attempt_spans.sending(intent, destination, ATTEMPT) as span:
        assert tracing.carrier()["traceparent"].split("-")[1] == PARENT.split("-")[1]
        attempt_spans.finished(span, intent, destination, SendResult(
            Submission.SUBMITTED, Outcome.RETRYABLE, status_code=503, error="receiver answered 503"))
    [sent] = named(spans, "send ")
    assert sent.kind is SpanKind.CLIENT and sent.parent is not None
    assert f"{sent.parent.span_id:016x}" == PARENT.split("-")[2]
    attributes = dict(sent.attributes or {})
    assert attributes["url.full"] == "https://hooks.example:8443/in"  # no credentials, no query
    assert attributes["http.request.method"] == "POST" and attributes["http.response.status_code"] == 503
    assert attributes["messaging.message.resend_count"] == 1 and attributes["outbox.attempt.number"] == 2
    assert attributes["outbox.attempt_id"] == "att-2" and attributes["outbox.fence"] == 3
    assert (attributes["outbox.submission"], attributes["outbox.outcome"]) == ("submitted", "retryable")
    assert sent.status.status_code is StatusCode.ERROR and sent.status.description == "receiver answered 503"


def test_a_kafka_attempt_is_a_producer_span_naming_the_topic_partition_and_offset(spans):
    destination = _destination("kafka", {"topic": "orders", "bootstrap_servers": ["127.0.0.1:9092"]})
    intent = _intent("kafka", None)
    with attempt_spans.sending(intent, destination, ATTEMPT) as span:
        attempt_spans.finished(span, intent, destination, SendResult(
            Submission.SUBMITTED, Outcome.DELIVERED, external_id="orders/2/41"))
    [sent] = named(spans, "send ")
    assert sent.kind is SpanKind.PRODUCER and sent.parent is None  # no context kept: a root
    attributes = dict(sent.attributes or {})
    assert attributes["messaging.system"] == "kafka" and attributes["messaging.destination.name"] == "orders"
    assert attributes["messaging.destination.partition.id"] == "2" and attributes["messaging.kafka.offset"] == 41
    assert attributes["outbox.external_id"] == "orders/2/41" and sent.status.status_code is StatusCode.UNSET


def test_an_email_attempt_records_the_stage_reached(spans):
    destination = _destination("email", {"host": "127.0.0.1"})
    intent = _intent("email", None)
    with attempt_spans.sending(intent, destination, ATTEMPT) as span:
        attempt_spans.finished(span, intent, destination, SendResult(
            Submission.NOT_SUBMITTED, Outcome.RETRYABLE, stage="rcpt", error="451 try later"))
    [sent] = named(spans, "send ")
    assert sent.kind is SpanKind.CLIENT and dict(sent.attributes or {})["outbox.stage"] == "rcpt"
    assert dict(sent.attributes or {})["messaging.system"] == "smtp"


@pytest.mark.parametrize(("environ", "asked"), [
    ({}, False),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, False),
    ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "TRUE"}, False),
])
def test_tracing_is_asked_for_by_the_otel_variables(environ, asked):
    assert tracing.asked(environ) is asked


WITHOUT_SDK = """
import json, sys
import outbox, sender, outbox.app.api, outbox.app.cli, outbox.client
from sender import spans
from outbox import tracing
assert tracing.configure() is None
kept = tracing.created("billing", "a1", {"traceparent": sys.argv[1]})
print(json.dumps({"kept": kept, "sdk": sorted(m for m in sys.modules if m.startswith("opentelemetry.sdk"))}))
"""


def test_without_the_sdk_nothing_of_it_is_imported_and_the_producers_context_still_travels():
    env = {"PATH": "/usr/bin:/bin", "OTEL_SERVICE_NAME": "x"}  # no OTEL_* variable asks for traces
    done = subprocess.run([sys.executable, "-c", WITHOUT_SDK, PARENT], capture_output=True, text=True, env=env,
                          check=True, timeout=60)
    found = json.loads(done.stdout)
    assert found["sdk"] == []
    assert json.loads(found["kept"]) == {"traceparent": PARENT}  # the no-op span carries its parent's context


WITHOUT_SDK_SEND = """
import json, sys
from opentelemetry.context import attach, detach
from outbox import tracing
from tests.unit.test_tracing import ATTEMPT, _destination, _intent
from sender import spans
destination = _destination("webhook", {"url": "https://hooks.example/in"})
token = attach(tracing.parsed({"traceparent": sys.argv[2]}))  # the worker's own context holds a span
seen = []
for kept in (json.dumps({"traceparent": sys.argv[1]}), None, '{"traceparent": "not one"}'):
    with spans.sending(_intent("webhook", kept), destination, ATTEMPT) as span:
        seen.append(tracing.carrier())
    assert not span.is_recording()
seen.append(tracing.carrier())
detach(token)
print(json.dumps({"seen": seen, "sdk": tracing.sdk_set()}))
"""


def test_without_the_sdk_an_attempt_carries_its_intents_context_and_never_the_workers():
    own = "00-11111111111111111111111111111111-2222222222222222-01"
    done = subprocess.run([sys.executable, "-c", WITHOUT_SDK_SEND, PARENT, own], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin"}, cwd=Path(__file__).parents[2], check=True, timeout=60)
    found = json.loads(done.stdout)
    assert found == {"seen": [{"traceparent": PARENT}, {}, {}, {"traceparent": own}], "sdk": False}
