"""Options and parameter types several commands take: a time as the API reads it, and the
settings an option defaults from (named in ``--help``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import click


class Timestamp(click.ParamType):
    """A time as the API takes it (``outbox.timestamps``): RFC 3339 with an offset, fractions of
    a second allowed, so what the CLI and the API print (``2026-11-30T08:30:07.167183Z``) is
    accepted back."""

    name = "timestamp"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> datetime:
        from .. import timestamps

        try:
            return timestamps.read(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


TIMESTAMP = Timestamp()


def env(name: str) -> dict[str, Any]:
    """An option's default from ``OUTBOX_<NAME>``, shown in ``--help``."""
    return {"envvar": f"OUTBOX_{name.upper()}", "show_envvar": True}


def log_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--log-level and --log-format, for the commands that keep running."""
    command = click.option("--log-format", type=click.Choice(["text", "json"], case_sensitive=False),
                           help="text, or json: one object per line [default: text]",
                           **env("log_format"))(command)
    return click.option("--log-level", help="debug, info, warning, error [default: info]",
                        **env("log_level"))(command)
