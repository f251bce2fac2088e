"""The ``outbox`` command: run the service and administer the outbox it serves.

Every command works directly on the database (``OUTBOX_DATABASE_URL``), so the one who runs it
on the host is trusted as an admin; remote callers use the HTTP API with a token.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import logging
import sys
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from functools import wraps
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar, get_args

import click
from pydantic import BaseModel, SecretStr, ValidationError

from . import channels, keyring, logs, operations, timestamps
from .clock import iso
from .destinations import DestinationSpec
from .errors import InvalidInput, NoDatabase, OutboxError
from .grants import GrantSpec
from .model import OnUnknown, Role, Status
from .outbox import Outbox
from .settings import Settings
from .shapes import history_json, intent_json
from .store import IntentQuery

if TYPE_CHECKING:
    from fastapi import FastAPI

T = TypeVar("T")


class Context:
    """What every command shares: settings overrides and the output mode."""

    def __init__(self, overrides: dict[str, Any], as_json: bool) -> None:
        self.overrides = overrides
        self.as_json = as_json

    def settings(self, **options: Any) -> Settings:
        """The settings with this command's options (those given: not None); a bad value is a
        usage error naming the variable it came from, not a traceback."""
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


def _fields(data: Mapping[str, Any], width: int) -> list[str]:
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


def _run(fn: Callable[..., Awaitable[T]], *, create: bool = False, migrate: bool = True) -> Callable[..., T]:
    """Run an async command with an open Outbox; outbox errors exit 1 with their message. The
    database must exist unless ``create``: a command run from another directory must not make
    a new empty one there and answer from it. Without ``migrate`` the command migrates it."""

    @JSON
    @click.pass_obj
    @wraps(fn)
    def command(ctx: Context, *args: Any, **kwargs: Any) -> T:
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


def _run_migrating(fn: Callable[..., Awaitable[T]]) -> Callable[..., T]:
    """``_run`` for migrate: it makes the database when there is none, and applies the migrations
    itself, so that it can say which it applied."""
    return _run(fn, create=True, migrate=False)


class Timestamp(click.ParamType):
    """A time as the API takes it (``outbox.timestamps``): RFC 3339 with an offset, fractions of
    a second allowed, so what the CLI and the API print (``2026-11-30T08:30:07.167183Z``) is
    accepted back."""

    name = "timestamp"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> datetime:
        try:
            return timestamps.read(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


TIMESTAMP = Timestamp()


def _cli_actor() -> str:
    """How events name whoever acts from the command line: ``cli:<user>``, for every command."""
    return f"cli:{getpass.getuser()}"


def _invalid_settings(exc: ValidationError) -> str:
    """Each bad setting as ``OUTBOX_NAME`` (or ``name`` in outbox.toml), its value (unless it is a
    secret) and why."""
    lines = []
    for error in exc.errors():
        name = ".".join(str(part) for part in error["loc"])
        field = Settings.model_fields.get(str(error["loc"][0])) if error["loc"] else None
        secret = field is not None and SecretStr in (field.annotation, *get_args(field.annotation))
        value = "(not shown: a secret)" if secret else repr(error.get("input"))
        lines.append(f"OUTBOX_{name.upper()} (or {name} in outbox.toml) = {value}: {error['msg']}")
    return "invalid settings:\n  " + "\n  ".join(lines)


def _env(name: str) -> dict[str, Any]:
    return {"envvar": f"OUTBOX_{name.upper()}", "show_envvar": True}


def _log_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--log-level and --log-format, for the commands that keep running."""
    command = click.option("--log-format", type=click.Choice(["text", "json"], case_sensitive=False),
                           help="text, or json: one object per line [default: text]",
                           **_env("log_format"))(command)
    return click.option("--log-level", help="debug, info, warning, error [default: info]",
                        **_env("log_level"))(command)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--database-url", help="sqlite:///path.db or postgresql://user@host/db [default: sqlite:///./outbox.db]",
              **_env("database_url"))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")
@click.version_option(package_name="outbox-delivery")
@click.pass_context
def main(click_ctx: click.Context, database_url: str | None, as_json: bool) -> None:
    """Durable intents delivered at least once, with honest outcomes.

    Settings come from OUTBOX_* environment variables, then ./outbox.toml, then defaults.
    """
    overrides = {"database_url": database_url} if database_url else {}
    click_ctx.obj = Context(overrides, as_json)


# -- service -------------------------------------------------------------------------------


@main.command()
@click.option("--host", help="Listen address [default: 127.0.0.1]", **_env("host"))
@click.option("--port", type=int, help="Listen port [default: 8080]", **_env("port"))
@_log_options
@click.option("--worker/--no-worker", default=None, help="Run an embedded sender [default: --worker]", **_env("worker"))
@click.pass_obj
def serve(ctx: Context, host: str | None, port: int | None, log_level: str | None, log_format: str | None,
          worker: bool | None) -> None:
    """Run the HTTP API and an embedded sender (migrating the database first).

    On first start, when no admin token exists, one is created and printed once.
    """
    from .service import create_service

    settings = ctx.settings(host=host, port=port, log_level=log_level, log_format=log_format, worker=worker)
    logs.configure(settings.log_level, settings.log_format)

    async def bootstrap() -> str | None:
        async with await Outbox.open(settings=settings) as box:
            if await box.store.count_active_tokens(Role.ADMIN.value):
                return None
            token, _ = await box.create_token(Role.ADMIN, label="first start")
            return token

    try:
        token = asyncio.run(bootstrap())
    except OutboxError as exc:
        raise click.ClickException(exc.message) from None
    if token:
        click.echo(
            "\nNo admin token existed, so one was created. It is shown only this once:\n\n"
            f"    {token}\n\n"
            "Keep it secret; create more with `outbox tokens create`.\n",
            err=True,
        )
    _serve(create_service(settings), settings, settings.port, proxy_headers=False)


def _serve(app: FastAPI, settings: Settings, port: int, **options: Any) -> None:
    """Run ``app`` under uvicorn until SIGTERM or SIGINT. The signal itself starts the app's
    shutdown (``api.begin_shutdown``): uvicorn's own waits for open requests to end first."""
    import uvicorn

    from .api import begin_shutdown

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            super().handle_exit(sig, frame)
            begin_shutdown(app)

    config = uvicorn.Config(app, host=settings.host, port=port, log_level=settings.log_level,
                            log_config=None,  # its lines go through logs.configure's handler too
                            **options)
    server = Server(config)
    server.run()
    if not server.started:
        sys.exit(3)  # as uvicorn.run: the server could not start (the log says why)


@main.command()
@click.option("--concurrency", type=int, help="Sends in flight [default: 64]", **_env("worker_concurrency"))
@_log_options
@click.option("--metrics-port", type=int,
              help="Also serve /metrics, /healthz and /readyz on this port [default: none]",
              **_env("metrics_port"))
@click.pass_obj
def worker(ctx: Context, concurrency: int | None, log_level: str | None, log_format: str | None,
           metrics_port: int | None) -> None:
    """Run a sender without the API; SIGTERM drains in-flight sends and stops."""
    import signal

    from sender import Worker

    settings = ctx.settings(worker_concurrency=concurrency, log_level=log_level, log_format=log_format,
                            metrics_port=metrics_port)
    logs.configure(settings.log_level, settings.log_format)
    if settings.metrics_port is not None:
        from .service import create_service

        # the server owns SIGTERM here: it stops the sender, which drains as below
        _serve(create_service(settings.model_copy(update={"worker": True}), probes_only=True), settings,
               settings.metrics_port, access_log=False)
        return

    async def run() -> None:
        async with await Outbox.open(settings=settings) as box:
            sender = Worker(box)
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, sender.stop)
            await sender.run()

    try:
        asyncio.run(run())
    except OutboxError as exc:
        raise click.ClickException(exc.message) from None


@main.command()
def demo() -> None:
    """Deliver a few intents to a local receiver and show what happened (no setup needed)."""
    from sender.demo import run_demo

    logging.basicConfig(level=logging.ERROR)  # the demo narrates what matters itself
    sys.exit(asyncio.run(run_demo(click.echo)))


@main.command()
@_run_migrating
async def migrate(ctx: Context, box: Outbox) -> None:
    """Apply pending schema migrations (serve also does this on start)."""
    applied = await box.store.migrate()
    await keyring.unlock(box.store, box.settings)  # checks the key, makes it on first start, seals plain secrets
    ctx.emit({"database_url": box.settings.database_url, "status": "migrated", "applied": applied},
             f"applied {len(applied)} migration{'' if len(applied) == 1 else 's'}: {', '.join(applied)}" if applied
             else "database is up to date: no migration to apply")


# -- tokens --------------------------------------------------------------------------------


@main.group()
def tokens() -> None:
    """Create, list and revoke API tokens."""


@tokens.command("create")
@click.option("--role", type=click.Choice([r.value for r in Role]), required=True)
@click.option("--scope", "scopes", multiple=True, help="A scope a producer may act in; repeat; '*' for all.")
@click.option("--label", help="What the token is for.")
@_run
async def tokens_create(ctx: Context, box: Outbox, role: str, scopes: tuple[str, ...], label: str | None) -> None:
    """Create a token and print it once (only its hash is stored)."""
    token, info = await box.create_token(Role(role), scopes, label, actor=_cli_actor())
    ctx.emit({"token": token, **info.public()}, token)


@tokens.command("list")
@_run
async def tokens_list(ctx: Context, box: Outbox) -> None:
    """List tokens (never their text)."""
    items = await box.list_tokens()
    ctx.emit(
        [i.public() for i in items],
        lambda: "\n".join(
            [f"{'ID':<8}  {'ROLE':<8}  {'SCOPES':<20}  {'STATE':<7}  LABEL"]
            + [f"{i.id:<8}  {i.role.value:<8}  {','.join(i.scopes) or '-':<20}  "
               f"{'revoked' if i.revoked_at else 'active':<7}  {i.label or ''}".rstrip() for i in items]
        ) if items else "no tokens",
    )


@tokens.command("revoke")
@click.argument("token_id")
@_run
async def tokens_revoke(ctx: Context, box: Outbox, token_id: str) -> None:
    """Revoke a token by its id; it stops working at once.

    The last admin token too (the API refuses that): on the host another can always be made.
    """
    info = await box.revoke_token(token_id, actor=_cli_actor(), keep_an_admin=False)
    ctx.emit(info.public(), f"revoked {info.id}")
    if info.role is Role.ADMIN and not await box.store.count_active_tokens(Role.ADMIN.value):
        click.echo("warning: no active admin token is left, so no one can manage tokens over the API; "
                   "create one with `outbox tokens create --role admin` (`outbox serve` also makes one "
                   "when it starts without any)", err=True)


# -- intents -------------------------------------------------------------------------------


def _payload(text: str) -> Any:
    if text == "-":
        text = sys.stdin.read()
    elif text.startswith("@"):
        try:
            with open(text[1:], encoding="utf-8") as handle:
                text = handle.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"--payload {text}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"--payload is not JSON: {exc}") from None


@main.command()
@click.option("--destination", required=True, help="A registered destination id.")
@click.option("--scope", required=True, help="Tenant/account on whose authority the effect is made.")
@click.option("--payload", required=True, help="JSON text, @file, or - for standard input.")
@click.option("--action-id", help="Your operation id [default: a new UUIDv7].")
@click.option("--not-before", type=TIMESTAMP, help="Do not send earlier (RFC 3339, with timezone).")
@click.option("--expires-at", type=TIMESTAMP, help="Dead-letter if not sent by then (RFC 3339, with timezone).")
@click.option("--max-attempts", type=int, help="Attempts before a dead letter, 1-1000 [default: 24, "
                                               "OUTBOX_DEFAULT_MAX_ATTEMPTS].")
@click.option("--ordering-key", help="Deliver in enqueue order with the intents of this key (destinations with "
                                     "ordering=key).")
@_run
async def enqueue(
    ctx: Context,
    box: Outbox,
    destination: str,
    scope: str,
    payload: str,
    action_id: str | None,
    not_before: datetime | None,
    expires_at: datetime | None,
    max_attempts: int | None,
    ordering_key: str | None,
) -> None:
    """Record an intent (idempotent on --action-id)."""
    result = await box.enqueue(
        destination=destination,
        scope=scope,
        payload=_payload(payload),
        action_id=action_id,
        not_before=not_before,
        expires_at=expires_at,
        max_attempts=max_attempts,
        ordering_key=ordering_key,
        actor=_cli_actor(),
    )
    ctx.emit(
        {**intent_json(result.intent), "created": result.created},
        f"{'enqueued' if result.created else 'already enqueued'} {result.intent.action_id} "
        f"({result.intent.status.value})",
    )


#: Action ids are unique per scope: the scope is needed only when one is used in several.
SCOPE = click.option("--scope", help="The intent's scope; needed only when its action id is used in several scopes.")


@main.command()
@click.argument("action_id")
@SCOPE
@_run
async def show(ctx: Context, box: Outbox, action_id: str, scope: str | None) -> None:
    """Show an intent with its attempts and events."""
    intent, history = await box.show(action_id, scope=scope)
    behind = await box.waiting_behind(intent)
    data = {**intent_json(intent), "waiting_behind": behind.json() if behind else None, **history_json(history)}

    def text() -> str:
        fields: dict[str, Any] = {}
        for name, value in data.items():
            if name not in ("attempts", "events", "waiting_behind"):
                fields[name] = value
            if name == "status" and behind:
                fields["waiting"] = behind.text(intent)
        lines = _fields(fields, 16)
        lines.append("attempts:" if data["attempts"] else "attempts: none")
        lines += ["  " + " ".join(str(part) for part in (f"#{a['number']}", a["attempt_id"], a["submission"],
                                                         a["outcome"], a["status_code"], a["error"]) if part)
                  for a in data["attempts"]]
        lines.append("events:")
        lines += [f"  {e['at']} {e['kind']:<16} {e['actor']} {e['reason'] or ''}".rstrip()
                  for e in data["events"]]
        return "\n".join(lines)

    ctx.emit(data, text)


@main.command("list")
@click.option("--status", "statuses", multiple=True, type=click.Choice([s.value for s in Status]),
              help="Repeat for several.")
@click.option("--scope", "scopes", multiple=True, help="Repeat for several.")
@click.option("--destination")
@click.option("--channel", help="An installed channel's name.")
@click.option("--created-after", type=TIMESTAMP, help="RFC 3339, with timezone.")
@click.option("--created-before", type=TIMESTAMP, help="RFC 3339, with timezone.")
@click.option("--limit", type=click.IntRange(1, 500), default=50, show_default=True)
@click.option("--cursor", help="The next page: the last page's next_cursor (as the API's cursor).")
@click.option("--before-seq", type=int, hidden=True)  # the cursor's former, undocumented form
@_run
async def list_(
    ctx: Context,
    box: Outbox,
    statuses: tuple[str, ...],
    scopes: tuple[str, ...],
    destination: str | None,
    channel: str | None,
    created_after: datetime | None,
    created_before: datetime | None,
    limit: int,
    cursor: str | None,
    before_seq: int | None,
) -> None:
    """List intents, newest first."""
    from .cursor import decode_cursor, encode_cursor

    if cursor is not None:
        try:
            before_seq = decode_cursor(cursor)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--cursor") from None
    page = await box.list_intents(
        IntentQuery(
            statuses=[Status(s) for s in statuses] or None,
            scopes=list(scopes) or None,
            destination=destination,
            channel=channel,
            created_after=created_after,
            created_before=created_before,
            before_seq=before_seq,
            limit=limit,
        )
    )
    next_cursor = encode_cursor(page.next_seq) if page.next_seq else None
    ctx.emit(
        {"items": [intent_json(i) for i in page.intents], "next_cursor": next_cursor},
        lambda: "\n".join(
            [f"{'ACTION_ID':<38} {'STATUS':<9} {'DESTINATION':<16} {'SCOPE':<16} ATTEMPTS"]
            + [f"{i.action_id:<38} {i.status.value:<9} {i.destination:<16} {i.scope:<16} "
               f"{i.attempts}/{i.max_attempts}" for i in page.intents]
            + ([f"more: --cursor {next_cursor}"] if next_cursor else [])
        ) if page.intents else "no intents",
    )


# -- operators -----------------------------------------------------------------------------


def _operator(reason: str) -> operations.Actor:
    try:
        return operations.Actor(_cli_actor(), reason)
    except OutboxError as exc:
        raise click.UsageError(exc.message) from None


REASON = click.option("--reason", required=True, help="Why (recorded with the action).")


@main.command()
@click.argument("action_id", required=False)
@click.option("--status", "statuses", multiple=True,
              type=click.Choice(sorted(s.value for s in operations.REPLAYABLE)),
              help="Bulk: replay intents in this status (repeat; default dead, revoked and unknown).")
@click.option("--destination", help="Bulk: only this destination.")
@click.option("--scope", "scopes", multiple=True,
              help="The intent's scope (needed only when its action id is used in several); bulk: only these "
                   "scopes (repeat).")
@click.option("--dry-run", is_flag=True, help="Bulk: say how many and which, change nothing.")
@click.option("--accept-duplicate-risk", is_flag=True,
              help="Replay even where an earlier attempt may have taken effect and the destination does not dedupe.")
@REASON
@_run
async def replay(ctx: Context, box: Outbox, action_id: str | None, statuses: tuple[str, ...],
                 destination: str | None, scopes: tuple[str, ...], dry_run: bool,
                 accept_duplicate_risk: bool, reason: str) -> None:
    """Send an intent again (same action_id), or every intent matching the filters (bulk).

    A bulk replay can be interrupted and run again: what was replayed no longer matches.
    """
    from sender.authority import authorizer

    who = _operator(reason)
    if action_id:
        if statuses or destination or len(scopes) > 1 or dry_run:
            raise click.UsageError("give an ACTION_ID (and at most one --scope) or bulk filters, not both")
        intent = await operations.replay(box, action_id, who, scope=scopes[0] if scopes else None,
                                         authorize=authorizer(box),
                                         accept_duplicate_risk=accept_duplicate_risk)
        ctx.emit(intent_json(intent), f"replayed {action_id} (now {intent.status.value}, "
                                      f"{intent.max_attempts - intent.attempts} more attempts)")
        return
    query = IntentQuery(statuses=[Status(s) for s in statuses] or None, scopes=list(scopes) or None,
                        destination=destination)
    found = [i async for i in operations.matching(box, operations.replay_filter(query))]
    if dry_run:
        ctx.emit({"dry_run": True, "matched": len(found), "action_ids": [i.action_id for i in found]},
                 lambda: "\n".join([f"{i.action_id}  {i.status.value}  {i.destination}  {i.last_error or ''}"
                                    for i in found] + [f"{len(found)} intent(s) would be replayed"]))
        return
    with click.progressbar(length=len(found), label="replaying", file=sys.stderr,
                           hidden=ctx.as_json or not found) as bar:
        result = await operations.bulk_replay(box, query, who, dry_run=False, authorize=authorizer(box),
                                              accept_duplicate_risk=accept_duplicate_risk,
                                              progress=lambda _: bar.update(1))
    ctx.emit({"dry_run": False, "matched": len(result.matched), "replayed": len(result.replayed),
              "refused": result.refused},
             lambda: "\n".join([f"refused {k}: {v}" for k, v in result.refused.items()]
                               + [f"replayed {len(result.replayed)} of {len(result.matched)}"]))
    if result.refused:
        sys.exit(1)


@main.command()
@click.argument("action_id")
@click.option("--as", "resolution", required=True, type=click.Choice([r.value for r in operations.Resolution]),
              help="delivered (it took effect), retry (it did not), dead (give up).")
@click.option("--external-id", help="The receiver's id for the work, as evidence.")
@SCOPE
@REASON
@_run
async def resolve(ctx: Context, box: Outbox, action_id: str, resolution: str, external_id: str | None,
                  scope: str | None, reason: str) -> None:
    """Settle an unknown intent with your evidence."""
    intent = await operations.resolve(box, action_id, operations.Resolution(resolution), _operator(reason),
                                      scope=scope, external_id=external_id)
    ctx.emit(intent_json(intent), f"resolved {action_id}: {intent.status.value}")


@main.command()
@click.argument("action_id")
@SCOPE
@REASON
@_run
async def cancel(ctx: Context, box: Outbox, action_id: str, scope: str | None, reason: str) -> None:
    """Withdraw an intent that is not being sent right now."""
    intent = await operations.cancel(box, action_id, _operator(reason), scope=scope)
    ctx.emit(intent_json(intent), f"cancelled {action_id}")


@main.command()
@click.argument("action_id")
@click.option("--digest", required=True, help="The payload_digest you reviewed (see `outbox show`).")
@click.option("--valid-seconds", type=float, default=3600, show_default=True, help="How long the approval lasts.")
@SCOPE
@REASON
@_run
async def approve(ctx: Context, box: Outbox, action_id: str, digest: str, valid_seconds: float,
                  scope: str | None, reason: str) -> None:
    """Approve a held intent's exact payload, for a limited time."""
    intent = await operations.approve(box, action_id, _operator(reason), payload_digest=digest,
                                      valid_seconds=valid_seconds, scope=scope)
    ctx.emit(intent_json(intent), f"approved {action_id} until {iso(intent.approval_expires_at)}")


@main.command()
@click.argument("action_id")
@SCOPE
@REASON
@_run
async def reject(ctx: Context, box: Outbox, action_id: str, scope: str | None, reason: str) -> None:
    """Refuse a held intent; it is never sent."""
    intent = await operations.reject(box, action_id, _operator(reason), scope=scope)
    ctx.emit(intent_json(intent), f"rejected {action_id}")


@main.command()
@click.option("--older-than-days", type=float, help="Default: the retention setting (7 days).")
@click.option("--dry-run", is_flag=True, help="List what would go, delete nothing.")
@_run
async def prune(ctx: Context, box: Outbox, older_than_days: float | None, dry_run: bool) -> None:
    """Delete delivered and cancelled intents past their retention (dead and unknown stay)."""
    age = timedelta(days=older_than_days) if older_than_days is not None else \
        timedelta(seconds=box.settings.delivered_retention_seconds)
    gone = await operations.prune(box, older_than=age, dry_run=dry_run)
    ctx.emit({"dry_run": dry_run, "pruned": len(gone), "action_ids": gone},
             f"{'would prune' if dry_run else 'pruned'} {len(gone)} intent(s)")


# -- grants --------------------------------------------------------------------------------


@main.group()
def grants() -> None:
    """Grant, list and withdraw authority (scope x destination) for the built-in provider."""


@grants.command("put")
@click.argument("grant_id")
@click.option("--scope", required=True, help="The scope allowed.")
@click.option("--destination", required=True, help="A destination id, or '*' for every one.")
@click.option("--expires-at", type=TIMESTAMP, help="No sends after this (RFC 3339, with timezone).")
@click.option("--note", help="Why it was granted.")
@_run
async def grants_put(ctx: Context, box: Outbox, grant_id: str, scope: str, destination: str,
                     expires_at: datetime | None, note: str | None) -> None:
    """Create or replace a grant (its revision goes up)."""
    spec = _validated(GrantSpec, scope=scope, destination=destination, expires_at=expires_at, note=note)
    grant, created = await box.put_grant(grant_id, spec)
    ctx.emit(grant.public(), f"{'granted' if created else 'replaced'} {grant.id}: "
                             f"{grant.scope} -> {grant.destination} (revision {grant.revision})")


@grants.command("list")
@_run
async def grants_list(ctx: Context, box: Outbox) -> None:
    """List grants."""
    items = await box.list_grants()
    ctx.emit([g.public() for g in items], lambda: "\n".join(
        f"{g.id:<20} {g.scope:<16} -> {g.destination:<16} r{g.revision}"
        f"{'  until ' + str(iso(g.expires_at)) if g.expires_at else ''}" for g in items) or "no grants")


@grants.command("delete")
@click.argument("grant_id")
@_run
async def grants_delete(ctx: Context, box: Outbox, grant_id: str) -> None:
    """Withdraw a grant: later sends it allowed become revoked."""
    await box.delete_grant(grant_id)
    ctx.emit({"id": grant_id, "deleted": True}, f"deleted {grant_id}")


# -- destinations --------------------------------------------------------------------------


M = TypeVar("M", bound=BaseModel)


def _validated(model: type[M], **fields: Any) -> M:
    """``model`` built from options, or InvalidInput with one line per problem (pydantic's own
    text carries input values and links that mean nothing on a command line)."""
    try:
        return model(**fields)
    except ValidationError as exc:
        raise InvalidInput("; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors())) from None


@main.group()
def destinations() -> None:
    """Register, inspect and remove destinations."""


def _setting(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` as a setting: the value read as JSON if it is JSON (587, true, ["a"]), else as text."""
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise InvalidInput(f"--set takes NAME=VALUE, not {text!r}")
    try:
        return name, json.loads(value)
    except ValueError:
        return name, value


def _settings_line(settings: Mapping[str, Any]) -> str:
    """A destination's own settings on one line: each one given, as name=value."""
    return " ".join(f"{name}={value}" for name, value in settings.items() if value not in (None, {}, [], ""))


#: Shared settings without an option of their own: given as --set NAME=VALUE, as a channel's are.
SET_ONLY = frozenset({"ordering", "ordering_on_dead"})


@destinations.command("put")
@click.argument("destination_id")
@click.option("--channel", default=channels.DEFAULT, show_default=True, help="The channel that delivers to it.")
@click.option("--url", help="A webhook's URL (the same as --set url=URL).")
@click.option("--set", "settings", multiple=True, metavar="NAME=VALUE",
              help="One of the channel's own settings, or ordering=key|none and ordering_on_dead=block|skip; "
                   "a JSON value (587, true) or else text. Repeat for several.")
@click.option("--secret", help="The channel's secret, e.g. a webhook's whsec_ signing secret [default: keep the "
                               "current one, or generate and print one if the channel makes its own].")
@click.option("--idempotent/--not-idempotent", default=False, show_default=True,
              help="The receiver deduplicates on Idempotency-Key.")
@click.option("--retention-seconds", type=int, default=86_400, show_default=True,
              help="How long the receiver keeps keys.")
@click.option("--on-unknown", type=click.Choice([p.value for p in OnUnknown]),
              help="[default: the channel's: declared for webhooks, never for email]")
@click.option("--timeout-seconds", type=float, default=10.0, show_default=True)
@click.option("--requires-approval", is_flag=True, help="Hold intents until an operator approves them.")
@click.option("--allow-private-network", is_flag=True,
              help="Allow loopback/private addresses (turns off the SSRF guard).")
@click.option("--disabled", is_flag=True, help="Register it disabled.")
@click.option("--reconcile", is_flag=True, help="The receiver answers the reconcile probe (our middleware).")
@click.option("--drop-previous-secrets", is_flag=True,
              help="Keep only the newest secret: the end of a rotation, once the receiver has the new one.")
@_run
async def destinations_put(
    ctx: Context, box: Outbox, destination_id: str, channel: str, url: str | None, settings: tuple[str, ...],
    secret: str | None, **spec: Any,
) -> None:
    """Register or replace a destination: the shared options, and the channel's own settings
    (a webhook's --url) as --set NAME=VALUE."""
    kind = channels.get(channel)
    own = dict(map(_setting, settings)) | ({"url": url} if url is not None else {})
    generated = None
    if secret is None and kind.new_secret is not None and await box.store.get_destination(destination_id) is None:
        secret = generated = kind.new_secret()
    if shared := sorted(own.keys() & {*DestinationSpec.model_fields, "channel", "secret"} - SET_ONLY):
        raise InvalidInput(f"--set {shared[0]}=... names a shared option; use --{shared[0].replace('_', '-')}")
    chosen = {name: value for name, value in spec.items() if value is not None}  # unset: the channel's default
    parsed = _validated(kind.spec, **own, **chosen, channel=channel, secret=secret)
    destination, created = await box.put_destination(destination_id, parsed)
    data = {**destination.public(), "created": created}
    if generated:
        data["generated_secret"] = generated
    where = _settings_line(destination.settings)
    ctx.emit(
        data,
        f"{'registered' if created else 'replaced'} {destination.id} -> {where}"
        + (f"\nsigning secret (shown once; give it to the receiver): {generated}" if generated else ""),
    )


@destinations.command("show")
@click.argument("destination_id")
@_run
async def destinations_show(ctx: Context, box: Outbox, destination_id: str) -> None:
    """Show a destination (never its secrets)."""
    data = (await box.get_destination(destination_id)).public()
    ctx.emit(data, "\n".join(_fields(data, 22)))


@destinations.command("list")
@_run
async def destinations_list(ctx: Context, box: Outbox) -> None:
    """List destinations."""
    items = await box.list_destinations()
    ctx.emit(
        [d.public() for d in items],
        lambda: "\n".join(
            f"{d.id:<20} {d.channel:<8} {_settings_line(d.settings)}"
            f"{'  (disabled)' if d.disabled else ''}" for d in items
        ) or "no destinations",
    )


@destinations.command("delete")
@click.argument("destination_id")
@_run
async def destinations_delete(ctx: Context, box: Outbox, destination_id: str) -> None:
    """Remove a destination that no intent refers to."""
    await box.delete_destination(destination_id)
    ctx.emit({"id": destination_id, "deleted": True}, f"deleted {destination_id}")


# -- secrets at rest -----------------------------------------------------------------------


@main.group("secrets")
def secrets_group() -> None:
    """The key that seals destination secrets in the database (see the README's Security)."""


@secrets_group.command("generate-key")
def secrets_generate_key() -> None:
    """Print a new random key, for a key file (OUTBOX_SECRETS_KEY_FILE): one key a line."""
    click.echo(keyring.generate_key())


@secrets_group.command("rotate")
@_run
async def secrets_rotate(ctx: Context, box: Outbox) -> None:
    """Seal every destination's secrets under the first key of the key file, in one transaction.

    On SQLite's own key file (beside the database) a new key is made for it, and the old one
    dropped once everything is sealed under the new one. With OUTBOX_SECRETS_KEY_FILE, put the
    new key first in that file (`outbox secrets generate-key`) for every process, then rotate.
    """
    done = await keyring.rotate(box.store)
    after = (f"; {done.key_file} now holds only the new key: back it up (older backups of the database open "
             "only with the key file of their time)" if box.store.keyring and box.store.keyring.managed else
             "; every process seals under it now: the old key can leave the key files")
    ctx.emit(done.json(), f"sealed the secrets of {done.resealed} destination(s) under key {done.key}"
                          f" (was {done.previous or 'none'})" + after)


if __name__ == "__main__":
    main()
