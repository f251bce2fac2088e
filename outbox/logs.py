"""Process logging: lines for people, or one JSON object per line for a log pipeline.

A record about an intent carries its identities as fields (``extra``): ``action_id``,
``attempt_id``, ``fence``, ``worker``, ``destination``. JSON lines hold them as keys, so an
on-call engineer can follow one action across workers; text lines end with them as
``key=value``. Secrets are never handed to a log call, so neither format can print one.

What a record says may come from outside: a request's path, a producer's header, a receiver's or
a mail server's words, quoted by our records and by the libraries' (uvicorn, OpenTelemetry) that
``configure`` routes here. So a line can be trusted to be one record: text lines escape every
control character (``escaped``: CR, LF, ESC, the other C0 and C1 controls, the Unicode line and
paragraph separators, DEL) and indent a traceback's lines below the record's, JSON lines escape
them as JSON does; and in both, each value put into a message is cut at ``MAX_VALUE`` characters
(``message``): a request's path of 60 KB is not a line of 60 KB.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any, Literal

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

from . import tracing

#: The fields a record about an intent may carry, in the order text lines show them.
FIELDS = ("action_id", "attempt_id", "fence", "worker", "destination")
#: The most characters of one value (an argument of a message, a field) a line shows.
MAX_VALUE = 1000
#: The most characters of a message a line shows (one built without arguments included).
MAX_MESSAGE = 10 * MAX_VALUE
#: Characters a text line never holds as they are: C0, DEL, C1, LINE and PARAGRAPH SEPARATOR.
CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(found: re.Match[str]) -> str:
    char = found.group()
    return _NAMED.get(char) or (f"\\x{ord(char):02x}" if ord(char) <= 0xFF else f"\\u{ord(char):04x}")


def escaped(text: str) -> str:
    """``text`` with each control character written as Python writes it in a string literal
    (``\\n``, ``\\x1b``, ``\\u2028``): it stays on one line and moves no terminal's cursor."""
    return CONTROLS.sub(_escape, text) if CONTROLS.search(text) else text


def cut(text: str, limit: int = MAX_VALUE) -> str:
    """``text``, or its first ``limit`` characters and how many more there were."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


class _Bounded:
    """A message's argument as ``%s`` and ``%r`` show it, cut (``cut``)."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def __str__(self) -> str:
        return cut(str(self.value))

    def __repr__(self) -> str:
        return cut(repr(self.value))


def _bounded(value: object) -> object:
    return value if isinstance(value, int | float) else _Bounded(value)  # numbers keep %d and %.3f


def message(record: logging.LogRecord) -> str:
    """``record``'s message with each argument cut at MAX_VALUE characters, and the whole at
    MAX_MESSAGE (a library's message built without arguments); not yet escaped."""
    args = record.args
    if args:
        bounded: Any = ({key: _bounded(value) for key, value in args.items()} if isinstance(args, Mapping)
                        else tuple(_bounded(value) for value in args))
        try:
            return cut(str(record.msg) % bounded, MAX_MESSAGE)
        except (TypeError, ValueError):  # a format only the value itself fills (%c, %d of a Decimal)
            pass
    return cut(record.getMessage(), MAX_MESSAGE)


class TextFormatter(logging.Formatter):
    """``LEVEL logger: message key=value ...`` with the intent fields the record carries, all on
    one line (``escaped``, each value ``cut``); a traceback follows, each of its lines indented
    by two spaces, so that no line of it can pass for a record."""

    def format(self, record: logging.LogRecord) -> str:
        fields = "".join(f" {name}={cut(str(value))}" for name in FIELDS
                         if (value := record.__dict__.get(name)) is not None)
        line = escaped(f"{record.levelname} {record.name}: {message(record)}{fields}")
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        below = [text for text in (record.exc_text, record.stack_info and self.formatStack(record.stack_info))
                 if text]
        return "\n".join([line, *(f"  {escaped(part)}" for text in below for part in text.split("\n"))])


class _JsonFormatter(JsonFormatter):
    """python-json-logger's, with the message's arguments cut as text lines cut them."""

    def add_fields(self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]) -> None:
        super().add_fields(log_data, record, message_dict)
        if "message" in log_data and not isinstance(record.msg, dict):
            log_data["message"] = message(record)


def json_formatter() -> JsonFormatter:
    """``{"level", "logger", "message", ...fields, "time": ISO 8601 UTC}``, one per line
    (without the web server's terminal-coloured copy of each message): JSON escapes control
    characters (and, ASCII only, the line separators), and arguments are cut as in text lines."""
    return _JsonFormatter("{levelname}{name}{message}", style="{", timestamp="time",
                          rename_fields={"levelname": "level", "name": "logger"},
                          reserved_attrs=[*RESERVED_ATTRS, "color_message"])


def traced(record: logging.LogRecord) -> bool:
    """Give ``record`` the ``trace_id`` and ``span_id`` of the span recording where it was
    logged, if one is (a log filter: it keeps every record)."""
    record.__dict__.update(tracing.span_ids())
    return True


def configure(level: str, fmt: Literal["text", "json"]) -> None:
    """Send every logger's records (the web server's too) to stderr in ``fmt`` (JSON lines with
    the trace's ids while a span records: ``traced``)."""
    handler = logging.StreamHandler()
    handler.setFormatter(json_formatter() if fmt == "json" else TextFormatter())
    if fmt == "json":
        handler.addFilter(traced)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
