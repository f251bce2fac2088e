"""``outbox tenants``: what a tenant's own users are given, a link into the tenant portal."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from .context import Context, run, shapes

if TYPE_CHECKING:
    from ...outbox import Outbox
    from ...tokens import TokenInfo


@click.group()
def tenants() -> None:
    """Links into the tenant portal for a scope's users."""


@tenants.command("portal-link")
@click.argument("scope")
@click.option("--session-seconds", type=click.IntRange(min=1),
              help="How long the session it opens lasts [default and most: OUTBOX_PORTAL_SESSION_SECONDS].")
@click.option("--read-only", is_flag=True, help="A session that may look but change nothing.")
@click.option("--token-id", help="The active admin token, or producer token of SCOPE, the link is minted under: "
                                 "revoking it ends the link's session [default: the oldest active admin token].")
@click.option("--base-url", help="This service's public origin (https://hooks.example.com), to print the link "
                                 "whole [default: the path alone].")
@run
async def tenants_portal_link(ctx: Context, box: Outbox, scope: str, session_seconds: int | None, read_only: bool,
                              token_id: str | None, base_url: str | None) -> None:
    """Mint a single-use link that opens the portal as SCOPE's tenant, and print its URL once."""
    link_token, link = await box.mint_portal_link(await _minter(box, scope, token_id), scope,
                                                  session_seconds=session_seconds, read_only=read_only)
    shown = shapes().minted_portal_link_json(link_token, link)
    if base_url:
        shown["url"] = base_url.rstrip("/") + shown["url"]
    ctx.emit(shown, shown["url"])


async def _minter(box: Outbox, scope: str, token_id: str | None) -> TokenInfo:
    """The token a link is minted under: as the API asks of whoever mints one (an admin, or a
    producer of the scope), and active."""
    from ...model import Role

    active = [t for t in await box.list_tokens() if t.revoked_at is None]
    if token_id is None:
        admins = sorted((t for t in active if t.role is Role.ADMIN), key=lambda t: t.created_at)
        if not admins:
            raise click.UsageError("there is no active admin token to mint the link under: create one with "
                                   "`outbox tokens create --role admin`, or name a producer token with --token-id")
        return admins[0]
    found = next((t for t in active if t.id == token_id), None)
    if found is None or found.role not in (Role.ADMIN, Role.PRODUCER) or not found.may_act_in(scope):
        raise click.UsageError(f"--token-id {token_id}: not an active admin token or producer token of {scope!r}")
    return found
