"""``outbox destinations``: register, inspect and remove destinations, with each channel's own
settings given as ``--set NAME=VALUE``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click

from ... import channels
from ...errors import InvalidInput
from ...model import OnUnknown
from .context import Context, fields, run, shapes, validated

if TYPE_CHECKING:
    from ...outbox import Outbox


@click.group()
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


def _delays(ctx: click.Context, param: click.Parameter, text: str | None) -> list[Any] | None:
    """``--retry-schedule 5,30,300`` as its list of delays (each checked with the destination)."""
    if text is None:
        return None
    try:
        return [json.loads(part) for part in text.split(",")]
    except ValueError:
        raise click.BadParameter(f"takes seconds separated by commas (5,30,300), not {text!r}") from None


def _subscription(text: str) -> dict[str, Any]:
    """``PATTERN`` or ``PATTERN=SCOPE,SCOPE`` as a subscription (a pattern and a scope hold no
    ``=`` and no ``,``)."""
    pattern, equals, scopes = text.partition("=")
    return {"topic": pattern, "scopes": scopes.split(",") if equals else None}


#: Shared settings without an option of their own: given as --set NAME=VALUE, as a channel's are.
SET_ONLY = frozenset({"ordering", "ordering_on_dead", "rate_limit", "max_in_flight"})


@destinations.command("put")
@click.argument("destination_id")
@click.option("--channel", default=channels.DEFAULT, show_default=True, help="The channel that delivers to it.")
@click.option("--url", help="A webhook's URL (the same as --set url=URL).")
@click.option("--set", "settings", multiple=True, metavar="NAME=VALUE",
              help="One of the channel's own settings, or ordering=key|none, ordering_on_dead=block|skip, "
                   "rate_limit='{\"per_second\": 5, \"burst\": 10}' and max_in_flight=N; "
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
@click.option("--retry-schedule", callback=_delays, metavar="SECONDS,...",
              help="The delays before retry 1, 2, ... (e.g. 5,30,300,1800,3600), each at most 3600; once all are "
                   "used the intent is dead [default: exponential backoff with jitter].")
@click.option("--max-age-seconds", type=int,
              help="An intent not delivered this long after its enqueue is dead [default: no limit].")
@click.option("--drop-previous-secrets", is_flag=True,
              help="Keep only the newest secret: the end of a rotation, once the receiver has the new one.")
@click.option("--subscribe", "subscriptions", multiple=True, metavar="PATTERN[=SCOPE,...]",
              help="Receive the events of the topics PATTERN matches (invoice.paid, invoice.*, *), for every "
                   "scope with a grant or only those named. Repeat for several [default: none].")
@run
async def destinations_put(
    ctx: Context, box: Outbox, destination_id: str, channel: str, url: str | None, settings: tuple[str, ...],
    secret: str | None, subscriptions: tuple[str, ...], **spec: Any,
) -> None:
    """Register or replace a destination: the shared options, and the channel's own settings
    (a webhook's --url) as --set NAME=VALUE."""
    from ...destinations import DestinationSpec

    kind = channels.get(channel)
    own = dict(map(_setting, settings)) | ({"url": url} if url is not None else {})
    generated = None
    if secret is None and kind.new_secret is not None and await box.store.get_destination(destination_id) is None:
        secret = generated = kind.new_secret()
    if shared := sorted(own.keys() & {*DestinationSpec.model_fields, "channel", "secret"} - SET_ONLY):
        raise InvalidInput(f"--set {shared[0]}=... names a shared option; use --{shared[0].replace('_', '-')}")
    chosen = {name: value for name, value in spec.items() if value is not None}  # unset: the channel's default
    parsed = validated(kind.spec, **own, **chosen, channel=channel, secret=secret,
                       subscriptions=[_subscription(text) for text in subscriptions])
    destination, created = await box.put_destination(destination_id, parsed)
    data = {**shapes().destination_json(destination), "created": created}
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
@run
async def destinations_show(ctx: Context, box: Outbox, destination_id: str) -> None:
    """Show a destination (never its secrets)."""
    data = shapes().destination_json(await box.get_destination(destination_id))
    ctx.emit(data, "\n".join(fields(data, 22)))


@destinations.command("list")
@click.option("--owner", help="Only the destinations this scope (a tenant) owns.")
@run
async def destinations_list(ctx: Context, box: Outbox, owner: str | None) -> None:
    """List destinations."""
    items = await box.list_destinations(owner=owner)
    ctx.emit(
        [shapes().destination_json(d) for d in items],
        lambda: "\n".join(
            f"{d.id:<20} {d.channel:<8} {_settings_line(d.settings)}"
            f"{'  (disabled)' if d.disabled else ''}{f'  (owner {d.owner})' if d.owner else ''}" for d in items
        ) or "no destinations",
    )


@destinations.command("rotate-secret")
@click.argument("destination_id")
@click.option("--window-seconds", type=float,
              help="How long the previous secret still signs beside the new one [default: the setting "
                   "secret_rotation_seconds, 24 h].")
@run
async def destinations_rotate_secret(ctx: Context, box: Outbox, destination_id: str,
                                     window_seconds: float | None) -> None:
    """Give a destination a new signing secret, printed once; the previous one signs beside it
    until the window ends, then the new one alone."""
    destination, secret = await box.rotate_secret(destination_id, window_seconds=window_seconds)
    ctx.emit({**shapes().destination_json(destination), "secret": secret},
             f"rotated {destination.id}; the previous secret signs until "
             f"{destination.previous_secrets_until and destination.previous_secrets_until.isoformat()}\n"
             f"new signing secret (shown once; give it to the receiver): {secret}")


@destinations.command("delete")
@click.argument("destination_id")
@run
async def destinations_delete(ctx: Context, box: Outbox, destination_id: str) -> None:
    """Remove a destination that no intent refers to."""
    await box.delete_destination(destination_id)
    ctx.emit({"id": destination_id, "deleted": True}, f"deleted {destination_id}")
