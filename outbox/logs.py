"""Process logging: lines for people, or one JSON object per line for a log pipeline.

A record about an intent carries its identities as fields (``extra``): ``action_id``,
``attempt_id``, ``fence``, ``worker``, ``destination``. JSON lines hold them as keys, so an
on-call engineer can follow one action across workers; text lines end with them as
``key=value``. Secrets are never handed to a log call, so neither format can print one.
"""

from __future__ import annotations

import logging
from typing import Literal

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

from . import tracing

#: The fields a record about an intent may carry, in the order text lines show them.
FIELDS = ("action_id", "attempt_id", "fence", "worker", "destination")


class TextFormatter(logging.Formatter):
    """``LEVEL logger: message key=value ...`` with the intent fields the record carries."""

    def __init__(self) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = " ".join(f"{name}={value}" for name in FIELDS
                          if (value := record.__dict__.get(name)) is not None)
        if not fields:
            return line
        head, newline, rest = line.partition("\n")  # a traceback stays below the fields
        return f"{head} {fields}{newline}{rest}"


def json_formatter() -> JsonFormatter:
    """``{"level", "logger", "message", ...fields, "time": ISO 8601 UTC}``, one per line
    (without the web server's terminal-coloured copy of each message)."""
    return JsonFormatter("{levelname}{name}{message}", style="{", timestamp="time",
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
