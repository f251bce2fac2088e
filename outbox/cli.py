"""The ``outbox`` command: run the service and administer the outbox it serves.

Every command works directly on the database (``OUTBOX_DATABASE_URL``), so the one who runs it
on the host is trusted as an admin; remote callers use the HTTP API with a token.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from functools import wraps
from typing import Any, TypeVar

import click

from .clock import iso
from .destinations import DestinationSpec, new_secret
from .errors import InvalidInput, OutboxError
from .grants import GrantSpec
from .model import Channel, OnUnknown, Role, Status
from .outbox import Outbox, history_json, intent_json
from .settings import Settings
from .store import IntentQuery
from .tokens import TokenInfo

T = TypeVar("T")


class Context:
    """What every command shares: settings overrides and the output mode."""

    def __init__(self, overrides: dict[str, Any], as_json: bool) -> None:
        self.overrides = overrides
        self.as_json = as_json

    @property
    def settings(self) -> Settings:
        return Settings(**self.overrides)

    def emit(self, value: Any, text: str | Callable[[], str]) -> None:
        """Print ``value`` as JSON under --json, else the human text."""
        if self.as_json:
            click.echo(json.dumps(value, indent=2))
        else:
            click.echo(text() if callable(text) else text)


def _run(fn: Callable[..., Awaitable[T]]) -> Callable[..., T]:
    """Run an async command with an open Outbox; outbox errors exit 1 with their message."""

    @click.pass_obj
    @wraps(fn)
    def command(ctx: Context, *args: Any, **kwargs: Any) -> T:
        async def main() -> T:
            async with await Outbox.open(settings=ctx.settings) as box:
                return await fn(ctx, box, *args, **kwargs)

        try:
            return asyncio.run(main())
        except OutboxError as exc:
            if ctx.as_json:
                click.echo(json.dumps({"error": type(exc).__name__, "detail": exc.message}), err=True)
            else:
                click.echo(f"error: {exc.message}", err=True)
            sys.exit(1)

    return command


def _env(name: str) -> dict[str, Any]:
    return {"envvar": f"OUTBOX_{name.upper()}", "show_envvar": True}


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--database-url", help="sqlite:///path.db [default: sqlite:///./outbox.db]", **_env("database_url"))
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
@click.option("--log-level", help="debug, info, warning, error [default: info]", **_env("log_level"))
@click.option("--worker/--no-worker", default=None, help="Run an embedded sender [default: --worker]", **_env("worker"))
@click.pass_obj
def serve(ctx: Context, host: str | None, port: int | None, log_level: str | None, worker: bool | None) -> None:
    """Run the HTTP API and an embedded sender (migrating the database first).

    On first start, when no admin token exists, one is created and printed once.
    """
    import uvicorn

    from .api import create_app

    overrides: dict[str, Any] = {
        k: v for k, v in (("host", host), ("port", port), ("log_level", log_level)) if v
    }
    if worker is not None:
        overrides["worker"] = worker
    settings = Settings(**ctx.overrides, **overrides)
    logging.basicConfig(level=settings.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")

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
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        loop="auto",
        http="auto",
        proxy_headers=False,
    )


@main.command()
@click.option("--concurrency", type=int, help="Sends in flight [default: 64]", **_env("worker_concurrency"))
@click.option("--log-level", help="debug, info, warning, error [default: info]", **_env("log_level"))
@click.pass_obj
def worker(ctx: Context, concurrency: int | None, log_level: str | None) -> None:
    """Run a sender without the API; SIGTERM drains in-flight sends and stops."""
    import signal

    from sender import Worker

    overrides: dict[str, Any] = {"worker_concurrency": concurrency} if concurrency else {}
    if log_level:
        overrides["log_level"] = log_level
    settings = Settings(**ctx.overrides, **overrides)
    logging.basicConfig(level=settings.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")

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
@_run
async def migrate(ctx: Context, box: Outbox) -> None:
    """Apply pending schema migrations (serve also does this on start)."""
    ctx.emit({"database_url": box.settings.database_url, "status": "migrated"}, "database is up to date")


# -- tokens --------------------------------------------------------------------------------


@main.group()
def tokens() -> None:
    """Create, list and revoke API tokens."""


def _token_json(info: TokenInfo) -> dict[str, Any]:
    return {
        "id": info.id,
        "role": info.role.value,
        "scopes": list(info.scopes),
        "label": info.label,
        "created_at": iso(info.created_at),
        "revoked_at": iso(info.revoked_at),
    }


@tokens.command("create")
@click.option("--role", type=click.Choice([r.value for r in Role]), required=True)
@click.option("--scope", "scopes", multiple=True, help="A scope a producer may act in; repeat; '*' for all.")
@click.option("--label", help="What the token is for.")
@_run
async def tokens_create(ctx: Context, box: Outbox, role: str, scopes: tuple[str, ...], label: str | None) -> None:
    """Create a token and print it once (only its hash is stored)."""
    token, info = await box.create_token(Role(role), scopes, label)
    ctx.emit({"token": token, **_token_json(info)}, token)


@tokens.command("list")
@_run
async def tokens_list(ctx: Context, box: Outbox) -> None:
    """List tokens (never their text)."""
    items = await box.list_tokens()
    ctx.emit(
        [_token_json(i) for i in items],
        lambda: "\n".join(
            f"{i.id}  {i.role.value:<8}  {','.join(i.scopes) or '-':<20}  "
            f"{'revoked' if i.revoked_at else 'active':<7}  {i.label or ''}"
            for i in items
        ) or "no tokens",
    )


@tokens.command("revoke")
@click.argument("token_id")
@_run
async def tokens_revoke(ctx: Context, box: Outbox, token_id: str) -> None:
    """Revoke a token by its id; it stops working at once."""
    info = await box.revoke_token(token_id)
    ctx.emit(_token_json(info), f"revoked {info.id}")


# -- intents -------------------------------------------------------------------------------


def _payload(text: str) -> Any:
    if text == "-":
        text = sys.stdin.read()
    elif text.startswith("@"):
        with open(text[1:], encoding="utf-8") as handle:
            text = handle.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"--payload is not JSON: {exc}") from None


@main.command()
@click.option("--destination", required=True, help="A registered destination id.")
@click.option("--scope", required=True, help="Tenant/account on whose authority the effect is made.")
@click.option("--payload", required=True, help="JSON text, @file, or - for standard input.")
@click.option("--action-id", help="Your operation id [default: a new UUIDv7].")
@click.option("--not-before", type=click.DateTime(["%Y-%m-%dT%H:%M:%S%z"]), help="Do not send earlier (with timezone).")
@click.option("--expires-at", type=click.DateTime(["%Y-%m-%dT%H:%M:%S%z"]), help="Dead-letter if not sent by then.")
@click.option("--max-attempts", type=int, help="Attempts before a dead letter.")
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
        actor="cli",
    )
    ctx.emit(
        {**intent_json(result.intent), "created": result.created},
        f"{'enqueued' if result.created else 'already enqueued'} {result.intent.action_id} "
        f"({result.intent.status.value})",
    )


@main.command()
@click.argument("action_id")
@_run
async def show(ctx: Context, box: Outbox, action_id: str) -> None:
    """Show an intent with its attempts and events."""
    intent = await box.get(action_id)
    history = await box.history(action_id)
    data = {**intent_json(intent), **history_json(history)}

    def text() -> str:
        lines = [f"{k:<16} {json.dumps(v) if isinstance(v, dict | list) else v}"
                 for k, v in data.items() if k not in ("attempts", "events")]
        lines.append("attempts:" if data["attempts"] else "attempts: none")
        lines += [f"  #{a['number']} {a['attempt_id']} {a['submission']} {a['outcome']} "
                  f"{a['status_code'] or ''} {a['error'] or ''}".rstrip() for a in data["attempts"]]
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
@click.option("--channel", type=click.Choice([c.value for c in Channel]))
@click.option("--limit", type=click.IntRange(1, 500), default=50, show_default=True)
@click.option("--before-seq", type=int, help="Continue after the last page (its next_seq).")
@_run
async def list_(
    ctx: Context,
    box: Outbox,
    statuses: tuple[str, ...],
    scopes: tuple[str, ...],
    destination: str | None,
    channel: str | None,
    limit: int,
    before_seq: int | None,
) -> None:
    """List intents, newest first."""
    page = await box.list(
        IntentQuery(
            statuses=[Status(s) for s in statuses] or None,
            scopes=list(scopes) or None,
            destination=destination,
            channel=Channel(channel) if channel else None,
            before_seq=before_seq,
            limit=limit,
        )
    )
    data = {"items": [intent_json(i) for i in page.intents], "next_seq": page.next_seq}
    ctx.emit(
        data,
        lambda: "\n".join(
            [f"{i.action_id:<38} {i.status.value:<9} {i.destination:<16} {i.scope:<16} "
             f"{i.attempts}/{i.max_attempts}" for i in page.intents]
            + ([f"more: --before-seq {page.next_seq}"] if page.next_seq else [])
        ) or "no intents",
    )


# -- grants --------------------------------------------------------------------------------


@main.group()
def grants() -> None:
    """Grant, list and withdraw authority (scope x destination) for the built-in provider."""


@grants.command("put")
@click.argument("grant_id")
@click.option("--scope", required=True, help="The scope allowed.")
@click.option("--destination", required=True, help="A destination id, or '*' for every one.")
@click.option("--expires-at", type=click.DateTime(["%Y-%m-%dT%H:%M:%S%z"]), help="No sends after this (with timezone).")
@click.option("--note", help="Why it was granted.")
@_run
async def grants_put(ctx: Context, box: Outbox, grant_id: str, scope: str, destination: str,
                     expires_at: datetime | None, note: str | None) -> None:
    """Create or replace a grant (its revision goes up)."""
    try:
        spec = GrantSpec(scope=scope, destination=destination, expires_at=expires_at, note=note)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
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


@main.group()
def destinations() -> None:
    """Register, inspect and remove destinations."""


@destinations.command("put")
@click.argument("destination_id")
@click.option("--url", required=True, help="Where the webhook is POSTed.")
@click.option("--secret", help="whsec_ signing secret [default: keep the current one, or generate and print one].")
@click.option("--idempotent/--not-idempotent", default=False, show_default=True,
              help="The receiver deduplicates on Idempotency-Key.")
@click.option("--retention-seconds", type=int, default=86_400, show_default=True,
              help="How long the receiver keeps keys.")
@click.option("--on-unknown", type=click.Choice([p.value for p in OnUnknown]), default="declared", show_default=True)
@click.option("--timeout-seconds", type=float, default=10.0, show_default=True)
@click.option("--requires-approval", is_flag=True, help="Hold intents until an operator approves them.")
@click.option("--allow-private-network", is_flag=True,
              help="Allow loopback/private addresses (turns off the SSRF guard).")
@click.option("--disabled", is_flag=True, help="Register it disabled.")
@click.option("--reconcile", is_flag=True, help="The receiver answers the reconcile probe (our middleware).")
@_run
async def destinations_put(ctx: Context, box: Outbox, destination_id: str, secret: str | None, **spec: Any) -> None:
    """Register or replace a destination."""
    generated = None
    if secret is None and await box.store.get_destination(destination_id) is None:
        secret = generated = new_secret()
    try:
        parsed = DestinationSpec(channel="webhook", secret=secret, **spec)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    destination, created = await box.put_destination(destination_id, parsed)
    data = {**destination.public(), "created": created}
    if generated:
        data["generated_secret"] = generated
    ctx.emit(
        data,
        f"{'registered' if created else 'replaced'} {destination.id} -> {destination.url}"
        + (f"\nsigning secret (shown once; give it to the receiver): {generated}" if generated else ""),
    )


@destinations.command("show")
@click.argument("destination_id")
@_run
async def destinations_show(ctx: Context, box: Outbox, destination_id: str) -> None:
    """Show a destination (never its secrets)."""
    data = (await box.get_destination(destination_id)).public()
    ctx.emit(data, "\n".join(f"{k:<22} {v}" for k, v in data.items()))


@destinations.command("list")
@_run
async def destinations_list(ctx: Context, box: Outbox) -> None:
    """List destinations."""
    items = await box.list_destinations()
    ctx.emit(
        [d.public() for d in items],
        lambda: "\n".join(
            f"{d.id:<20} {d.channel.value:<8} {d.url}{'  (disabled)' if d.disabled else ''}" for d in items
        ) or "no destinations",
    )


@destinations.command("delete")
@click.argument("destination_id")
@_run
async def destinations_delete(ctx: Context, box: Outbox, destination_id: str) -> None:
    """Remove a destination that no intent refers to."""
    await box.delete_destination(destination_id)
    ctx.emit({"id": destination_id, "deleted": True}, f"deleted {destination_id}")


if __name__ == "__main__":
    main()
