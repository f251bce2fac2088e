"""``outbox tokens``: create, list and revoke API tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ...model import Role
from .context import Context, cli_actor, run, shapes

if TYPE_CHECKING:
    from ...outbox import Outbox


@click.group()
def tokens() -> None:
    """Create, list and revoke API tokens."""


@tokens.command("create")
@click.option("--role", type=click.Choice([r.value for r in Role]), required=True)
@click.option("--scope", "scopes", multiple=True,
              help="A scope a producer may act in (repeat; '*' for all), or a tenant's one scope.")
@click.option("--label", help="What the token is for.")
@run
async def tokens_create(ctx: Context, box: Outbox, role: str, scopes: tuple[str, ...], label: str | None) -> None:
    """Create a token and print it once (only its hash is stored)."""
    token, info = await box.create_token(Role(role), scopes, label, actor=cli_actor())
    ctx.emit({"token": token, **shapes().token_json(info)}, token)


@tokens.command("list")
@run
async def tokens_list(ctx: Context, box: Outbox) -> None:
    """List tokens (never their text)."""
    items = await box.list_tokens()
    ctx.emit(
        [shapes().token_json(i) for i in items],
        lambda: "\n".join(
            [f"{'ID':<8}  {'ROLE':<8}  {'SCOPES':<20}  {'STATE':<7}  LABEL"]
            + [f"{i.id:<8}  {i.role.value:<8}  {','.join(i.scopes) or '-':<20}  "
               f"{'revoked' if i.revoked_at else 'active':<7}  {i.label or ''}".rstrip() for i in items]
        ) if items else "no tokens",
    )


@tokens.command("revoke")
@click.argument("token_id")
@run
async def tokens_revoke(ctx: Context, box: Outbox, token_id: str) -> None:
    """Revoke a token by its id; it stops working at once.

    The last admin token too (the API refuses that): on the host another can always be made.
    """
    info = await box.revoke_token(token_id, actor=cli_actor(), keep_an_admin=False)
    ctx.emit(shapes().token_json(info), f"revoked {info.id}")
    if info.role is Role.ADMIN and not await box.store.count_active_tokens(Role.ADMIN.value):
        click.echo("warning: no active admin token is left, so no one can manage tokens over the API; "
                   "create one with `outbox tokens create --role admin` (`outbox serve` also makes one "
                   "when it starts without any)", err=True)
