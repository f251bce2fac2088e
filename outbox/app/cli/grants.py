"""``outbox grants``: the built-in authority provider's grants (scope x destination)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from .context import Context, run, shapes, validated
from .options import TIMESTAMP

if TYPE_CHECKING:
    from datetime import datetime

    from ...outbox import Outbox


@click.group()
def grants() -> None:
    """Grant, list and withdraw authority (scope x destination) for the built-in provider."""


@grants.command("put")
@click.argument("grant_id")
@click.option("--scope", required=True, help="The scope allowed.")
@click.option("--destination", required=True, help="A destination id, or '*' for every one.")
@click.option("--expires-at", type=TIMESTAMP, help="No sends after this (RFC 3339, with timezone).")
@click.option("--note", help="Why it was granted.")
@run
async def grants_put(ctx: Context, box: Outbox, grant_id: str, scope: str, destination: str,
                     expires_at: datetime | None, note: str | None) -> None:
    """Create or replace a grant (its revision goes up)."""
    from ...grants import GrantSpec

    spec = validated(GrantSpec, scope=scope, destination=destination, expires_at=expires_at, note=note)
    grant, created = await box.put_grant(grant_id, spec)
    ctx.emit(shapes().grant_json(grant), f"{'granted' if created else 'replaced'} {grant.id}: "
                             f"{grant.scope} -> {grant.destination} (revision {grant.revision})")


@grants.command("list")
@run
async def grants_list(ctx: Context, box: Outbox) -> None:
    """List grants."""
    from ...clock import iso

    items = await box.list_grants()
    ctx.emit([shapes().grant_json(g) for g in items], lambda: "\n".join(
        f"{g.id:<20} {g.scope:<16} -> {g.destination:<16} r{g.revision}"
        f"{'  until ' + str(iso(g.expires_at)) if g.expires_at else ''}" for g in items) or "no grants")


@grants.command("delete")
@click.argument("grant_id")
@run
async def grants_delete(ctx: Context, box: Outbox, grant_id: str) -> None:
    """Withdraw a grant: later sends it allowed become revoked."""
    await box.delete_grant(grant_id)
    ctx.emit({"id": grant_id, "deleted": True}, f"deleted {grant_id}")
