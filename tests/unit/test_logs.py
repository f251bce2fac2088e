"""Log lines: the intent's identities as fields, in text and in JSON."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from outbox import logs

FIELDS = {"action_id": "order-1", "attempt_id": "0193-a", "fence": 3, "worker": "w1", "destination": "billing"}


@pytest.fixture
def restore_root():
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    yield
    root.handlers[:], level = saved
    root.setLevel(level)


def record(message: str = "dead: rejected", exc_info=None, **extra) -> logging.LogRecord:
    made = logging.LogRecord("outbox.sender", logging.WARNING, __file__, 1, message, (), exc_info)
    made.__dict__.update(extra)
    return made


def test_text_lines_end_with_the_fields_the_record_carries():
    line = logs.TextFormatter().format(record(**{**FIELDS, "attempt_id": None}))
    assert line == "WARNING outbox.sender: dead: rejected action_id=order-1 fence=3 worker=w1 destination=billing"
    assert logs.TextFormatter().format(record("worker started")) == "WARNING outbox.sender: worker started"


def test_a_traceback_stays_below_the_fields():
    try:
        raise ValueError("boom")
    except ValueError:
        line = logs.TextFormatter().format(record("delivery failed", exc_info=sys.exc_info(), **FIELDS))
    first, _, rest = line.partition("\n")
    assert first.endswith("destination=billing") and rest.startswith("Traceback") and "ValueError: boom" in rest


def test_json_lines_carry_the_fields_as_keys():
    found = json.loads(logs.json_formatter().format(record(**FIELDS)))
    assert {k: found[k] for k in ("level", "logger", "message")} == {
        "level": "WARNING", "logger": "outbox.sender", "message": "dead: rejected"}
    assert {k: found[k] for k in FIELDS} == FIELDS
    assert found["time"].endswith("+00:00")


def test_configure_sends_every_logger_to_one_handler_in_the_format(restore_root, capsys):
    logs.configure("warning", "json")
    logging.getLogger("some.library").warning("listening", extra={"action_id": "a"})
    logging.getLogger("outbox.sender").info("not shown at warning")
    lines = capsys.readouterr().err.splitlines()
    assert [json.loads(line)["message"] for line in lines] == ["listening"]
    assert len(logging.getLogger().handlers) == 1


def test_json_lines_carry_the_trace_and_span_id_while_a_span_records(restore_root, capsys, spans):
    from opentelemetry import trace

    logs.configure("info", "json")
    logging.getLogger("outbox").info("outside any span")
    with trace.get_tracer("test").start_as_current_span("work") as span:
        logging.getLogger("outbox.sender").info("delivered", extra=FIELDS)
    outside, inside = (json.loads(line) for line in capsys.readouterr().err.splitlines())
    assert "trace_id" not in outside and "span_id" not in outside
    context = span.get_span_context()
    assert inside["trace_id"] == f"{context.trace_id:032x}" and inside["span_id"] == f"{context.span_id:016x}"
    assert inside["action_id"] == "order-1"
