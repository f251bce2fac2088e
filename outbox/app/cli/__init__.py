"""The ``outbox`` command: run the service and administer the outbox it serves.

Every command works directly on the database (``OUTBOX_DATABASE_URL``), so the one who runs it
on the host is trusted as an admin; remote callers use the HTTP API with a token.

One module per noun, as ``outbox.routes`` is, assembled into ``main`` here:

- ``context``: what every command shares (settings, output, the async wrapper)
- ``options``: shared options and parameter types (times, settings from the environment)
- ``service``: serve, worker, demo, migrate
- ``intents``: enqueue, show, list, and the operators' replay, resolve, cancel, approve,
  reject, prune
- ``events``: publish, and events show, list, deliver
- ``tokens``, ``grants``, ``destinations``, ``secrets``, ``tenants``: a group of commands each
"""

from __future__ import annotations

import click

from .context import Context
from .destinations import destinations
from .events import events, publish
from .grants import grants
from .intents import approve, cancel, enqueue, list_, prune, reject, replay, resolve, show
from .options import env
from .secrets import secrets_group
from .service import demo, migrate, serve, worker
from .tenants import tenants
from .tokens import tokens

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--database-url", help="sqlite:///path.db or postgresql://user@host/db [default: sqlite:///./outbox.db]",
              **env("database_url"))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")
@click.version_option(package_name="outbox-delivery")
@click.pass_context
def main(click_ctx: click.Context, database_url: str | None, as_json: bool) -> None:
    """Durable intents delivered at least once, with honest outcomes.

    Settings come from OUTBOX_* environment variables, then ./outbox.toml, then defaults.
    """
    overrides = {"database_url": database_url} if database_url else {}
    click_ctx.obj = Context(overrides, as_json)


for command in (serve, worker, demo, migrate, tokens, enqueue, show, list_, replay, resolve, cancel, approve, reject,
                prune, grants, destinations, secrets_group, publish, events, tenants):
    main.add_command(command)
