"""``outbox secrets``: the key that seals destination secrets at rest (``outbox.keyring``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from .context import Context, run

if TYPE_CHECKING:
    from ..outbox import Outbox


@click.group("secrets")
def secrets_group() -> None:
    """The key that seals destination secrets in the database (see the README's Security)."""


@secrets_group.command("generate-key")
def secrets_generate_key() -> None:
    """Print a new random key, for a key file (OUTBOX_SECRETS_KEY_FILE): one key a line."""
    from .. import keyring

    click.echo(keyring.generate_key())


@secrets_group.command("rotate")
@run
async def secrets_rotate(ctx: Context, box: Outbox) -> None:
    """Seal every destination's secrets under the first key of the key file, in one transaction.

    On SQLite's own key file (beside the database) a new key is made for it, and the old one
    dropped once everything is sealed under the new one. With OUTBOX_SECRETS_KEY_FILE, put the
    new key first in that file (`outbox secrets generate-key`) for every process, then rotate.
    """
    from .. import secrets_key

    done = await secrets_key.rotate(box.store)
    after = (f"; {done.key_file} now holds only the new key: back it up (older backups of the database open "
             "only with the key file of their time)" if box.store.keyring and box.store.keyring.managed else
             "; every process seals under it now: the old key can leave the key files")
    ctx.emit(done.json(), f"sealed the secrets of {done.resealed} destination(s) under key {done.key}"
                          f" (was {done.previous or 'none'})" + after)

