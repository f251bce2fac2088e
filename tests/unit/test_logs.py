"""Log lines: the intent's identities as fields, in text and in JSON; what came from outside
escaped and cut, in our records and in the libraries' that the process routes."""

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
    assert first.endswith("destination=billing") and rest.startswith("  Traceback") and "  ValueError: boom" in rest
    assert all(below.startswith("  ") for below in rest.split("\n"))  # no line of it passes for a record


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


HOSTILE = "x\nCRITICAL outbox.sender: forged\r\x1b[31mred\x1b[0m\x85\x9b2J\u2028\u2029\x00\x7f\tend"
ESCAPED = "x\\nCRITICAL outbox.sender: forged\\r\\x1b[31mred\\x1b[0m\\x85\\x9b2J\\u2028\\u2029\\x00\\x7f\\tend"


def test_text_lines_escape_every_control_character_of_a_message_and_its_fields():
    line = logs.TextFormatter().format(_with_args("refused %s", HOSTILE, destination=f"d{HOSTILE}"))
    assert line == f"WARNING outbox.sender: refused {ESCAPED} destination=d{ESCAPED}"
    assert logs.escaped("plain: text, 'quoted' \\ é ✓") == "plain: text, 'quoted' \\ é ✓"


def _with_args(message: str, *args, **extra) -> logging.LogRecord:
    made = logging.LogRecord("outbox.sender", logging.WARNING, __file__, 1, message, args, None)
    made.__dict__.update(extra)
    return made


def test_a_traceback_whose_message_holds_a_newline_forges_no_record():
    try:
        raise ValueError(f"bad value {HOSTILE}")
    except ValueError:
        line = logs.TextFormatter().format(record("delivery failed", exc_info=sys.exc_info()))
    first, *below = line.split("\n")
    assert first == "WARNING outbox.sender: delivery failed"
    assert all(part.startswith("  ") for part in below) and "  CRITICAL outbox.sender: forged\\r\\x1b[31m" in line
    assert not logs.CONTROLS.search(line.replace("\n", ""))


def test_each_value_is_cut_and_numbers_keep_their_format():
    line = logs.TextFormatter().format(_with_args("%s took %.2f s, %d tries, %r", "p" * 5000, 1.5, 3, "q" * 5000,
                                                  action_id="a" * 5000))
    assert line.startswith(f"WARNING outbox.sender: {'p' * logs.MAX_VALUE}... (4000 more characters) took 1.50 s, "
                           f"3 tries, '{'q' * (logs.MAX_VALUE - 1)}... (4002 more characters) ")
    assert line.endswith(f" action_id={'a' * logs.MAX_VALUE}... (4000 more characters)")
    mapping = _with_args("%(path)s", {"path": "p" * 5000})
    assert logs.message(mapping) == f"{'p' * logs.MAX_VALUE}... (4000 more characters)"
    unformatted = _with_args("%s", "s" * 50_000)  # cut at MAX_VALUE; a message without arguments at MAX_MESSAGE
    assert len(logs.message(unformatted)) < logs.MAX_VALUE + 40
    assert len(logs.message(_with_args("m" * 50_000))) < logs.MAX_MESSAGE + 40


def test_a_librarys_record_is_escaped_as_ours(restore_root, capsys):
    """OpenTelemetry's own warning quotes a malformed tracestate member as it came: with a newline
    in it, the text format printed a second, forged record line."""
    from opentelemetry.trace.span import TraceState

    logs.configure("info", "text")
    TraceState.from_header([f"a=b,{HOSTILE}"])
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"WARNING opentelemetry.trace.span: Member doesn't match the w3c identifiers format {ESCAPED}"]


def test_json_lines_escape_control_characters_and_cut_values(restore_root, capsys):
    logs.configure("info", "json")
    logging.getLogger("some.library").warning("quoted %s and %s", HOSTILE, "v" * 5000)
    (line,) = capsys.readouterr().err.splitlines()
    assert not logs.CONTROLS.search(line) and "\\u2028" in line  # JSON's escapes, ASCII only
    assert json.loads(line)["message"] == f"quoted {HOSTILE} and {'v' * logs.MAX_VALUE}... (4000 more characters)"
