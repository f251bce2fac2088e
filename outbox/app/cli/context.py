"""What every command shares: the settings it runs with, how it prints, and the wrapper that
runs an async command on an open ``Outbox`` and turns outbox errors into an exit status.

The command modules import only click and the core's light modules at their top; what a command
needs to run (the store, pydantic, the settings, the web framework) is imported when it runs,
so that ``outbox --help`` and shell completion start at once."""

from __future__ import annotations

import getpass
import importlib
import json
import sys
from collections.abc import Awaitable, Callable, Mapping
from functools import wraps
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ...errors import InvalidInput, NoDatabase, OutboxError

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError

    from ...settings import Settings

T = TypeVar("T")
M = TypeVar("M", bound="BaseModel")


class Context:
    """What every command shares: settings overrides and the output mode."""

    def __init__(self, overrides: dict[str, Any], as_json: bool) -> None:
        self.overrides = overrides
        self.as_json = as_json

    def settings(self, **options: Any) -> Settings:
        """The settings with this command's options (those given: not None); a bad value is a
        usage error naming the variable it came from, not a traceback."""
        from pydantic import ValidationError

        from ...settings import Settings

        given = {name: value for name, value in options.items() if value is not None}
        try:
            return Settings(**self.overrides, **given)
        except ValidationError as exc:
            raise click.UsageError(_invalid_settings(exc)) from None

    def emit(self, value: Any, text: str | Callable[[], str]) -> None:
        """Print ``value`` as JSON under --json, else the human text."""
        if self.as_json:
            click.echo(json.dumps(value, indent=2))
        else:
            click.echo(text() if callable(text) else text)


def fields(data: Mapping[str, Any], width: int) -> list[str]:
    """A record as ``name value`` lines, the names padded to ``width``."""
    return [f"{name:<{width}} {_shown(value)}" for name, value in data.items()]


def _shown(value: Any) -> str:
    """A value as the JSON output writes it (``-`` for null), never as Python prints it (None, False)."""
    if value is None:
        return "-"
    return json.dumps(value) if isinstance(value, bool | dict | list) else str(value)


def _json_flag(click_ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        click_ctx.find_object(Context).as_json = True  # type: ignore[union-attr]


#: --json after the command too (``outbox list --json``), as well as before it.
JSON = click.option("--json", is_flag=True, expose_value=False, callback=_json_flag,
                    help="Machine-readable JSON output (also accepted before the command).")

#: What a command that finds no database says, besides the URL: where the URL came from.
NO_DATABASE = ("; only serve, worker and migrate create one: run this where the database is, or name it with "
               "--database-url, OUTBOX_DATABASE_URL or database_url in ./outbox.toml")


def run(fn: Callable[..., Awaitable[T]], *, create: bool = False, migrate: bool = True) -> Callable[..., T]:
    """Run an async command with an open Outbox; outbox errors exit 1 with their message. The
    database must exist unless ``create``: a command run from another directory must not make
    a new empty one there and answer from it. Without ``migrate`` the command migrates it."""

    @JSON
    @click.pass_obj
    @wraps(fn)
    def command(ctx: Context, *args: Any, **kwargs: Any) -> T:
        import asyncio

        from ...outbox import Outbox

        async def main() -> T:
            async with await Outbox.open(settings=ctx.settings(), create=create, migrate=migrate) as box:
                return await fn(ctx, box, *args, **kwargs)

        try:
            return asyncio.run(main())
        except OutboxError as exc:
            message = exc.message + (NO_DATABASE if isinstance(exc, NoDatabase) else "")
            if ctx.as_json:
                click.echo(json.dumps({"error": type(exc).__name__, "detail": message}), err=True)
            else:
                click.echo(f"error: {message}", err=True)
            sys.exit(1)

    return command


def run_migrating(fn: Callable[..., Awaitable[T]]) -> Callable[..., T]:
    """``run`` for migrate: it makes the database when there is none, and applies the migrations
    itself, so that it can say which it applied."""
    return run(fn, create=True, migrate=False)


def shapes() -> ModuleType:
    """The records' JSON presenters (``outbox.shapes``), imported the first time a command prints
    one: they load pydantic, which ``outbox --help`` and shell completion must not."""
    return importlib.import_module("outbox.shapes")


def cli_actor() -> str:
    """How events name whoever acts from the command line: ``cli:<user>``, for every command."""
    return f"cli:{getpass.getuser()}"


def validated(model: type[M], **given: Any) -> M:
    """``model`` built from options, or InvalidInput with one line per problem (pydantic's own
    text carries input values and links that mean nothing on a command line)."""
    from pydantic import ValidationError

    try:
        return model(**given)
    except ValidationError as exc:
        raise InvalidInput("; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors())) from None


def _invalid_settings(exc: ValidationError) -> str:
    """Each bad setting as ``OUTBOX_NAME`` (or ``name`` in outbox.toml), its value (unless it is a
    secret) and why."""
    from typing import get_args

    from pydantic import SecretStr

    from ...settings import Settings

    lines = []
    for error in exc.errors():
        name = ".".join(str(part) for part in error["loc"])
        field = Settings.model_fields.get(str(error["loc"][0])) if error["loc"] else None
        secret = field is not None and SecretStr in (field.annotation, *get_args(field.annotation))
        value = "(not shown: a secret)" if secret else repr(error.get("input"))
        lines.append(f"OUTBOX_{name.upper()} (or {name} in outbox.toml) = {value}: {error['msg']}")
    return "invalid settings:\n  " + "\n  ".join(lines)
