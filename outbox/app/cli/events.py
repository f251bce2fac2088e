"""Events from the command line: ``publish``, and ``events show|list|deliver`` (the last an
operator's delivery of an existing event to one more destination)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from .context import Context, cli_actor, fields, run, shapes
from .intents import _payload
from .options import TIMESTAMP

if TYPE_CHECKING:
    from datetime import datetime

    from ...events import StoredEvent
    from ...outbox import Outbox

#: Event ids are unique per scope: the scope is needed only when one is used in several.
SCOPE = click.option("--scope", help="The event's scope; needed only when its id is used in several scopes.")


def _text(event: StoredEvent) -> str:
    """An event and its fan-out, one destination a line."""
    data = shapes().event_json(event)
    lines = fields({name: value for name, value in data.items() if name != "fanout"}, 16)
    lines.append("fan-out:" if event.fanout else "fan-out: none (no destination subscribed and granted)")
    lines += [f"  {d.destination:<20} {d.action_id}  " + (d.status.value if d.status else f"skipped: {d.skipped}")
              for d in event.fanout]
    return "\n".join(lines)


@click.command()
@click.option("--scope", required=True, help="Tenant/account on whose authority the effects are made.")
@click.option("--topic", required=True, help="What happened: dot-separated segments (invoice.paid).")
@click.option("--payload", required=True, help="JSON text, @file, or - for standard input.")
@click.option("--event-id", help="Your event's id [default: a new UUIDv7].")
@click.option("--not-before", type=TIMESTAMP, help="Do not send earlier (RFC 3339, with timezone).")
@click.option("--expires-at", type=TIMESTAMP, help="Dead-letter if not sent by then (RFC 3339, with timezone).")
@click.option("--max-attempts", type=int, help="Attempts before a dead letter, for each intent.")
@click.option("--ordering-key", help="Each intent's ordering key.")
@run
async def publish(ctx: Context, box: Outbox, payload: str, **event: Any) -> None:
    """Publish an event: one intent per subscribed destination (idempotent on --event-id)."""
    result = await box.publish(payload=_payload(payload), actor=cli_actor(), **event)
    ctx.emit({**shapes().event_json(result.event), "created": result.created},
             lambda: f"{'published' if result.created else 'already published'} {result.event.event_id}\n"
             + _text(result.event))


@click.group()
def events() -> None:
    """Inspect published events and deliver one to a later subscriber."""


@events.command("show")
@click.argument("event_id")
@SCOPE
@run
async def events_show(ctx: Context, box: Outbox, event_id: str, scope: str | None) -> None:
    """Show an event and its fan-out: each destination's intent and status."""
    event = await box.get_event(event_id, scope=scope)
    ctx.emit(shapes().event_json(event), lambda: _text(event))


@events.command("list")
@click.option("--scope", "scopes", multiple=True, help="Repeat for several.")
@click.option("--topic", help="A topic or a pattern (invoice.*).")
@click.option("--event-id")
@click.option("--created-after", type=TIMESTAMP, help="RFC 3339, with timezone.")
@click.option("--created-before", type=TIMESTAMP, help="RFC 3339, with timezone.")
@click.option("--limit", type=click.IntRange(1, 500), default=50, show_default=True)
@run
async def events_list(ctx: Context, box: Outbox, scopes: tuple[str, ...], topic: str | None, event_id: str | None,
                      created_after: datetime | None, created_before: datetime | None, limit: int) -> None:
    """List events, newest first, with how many intents each made."""
    from ...events import EventQuery

    page = await box.list_events(EventQuery(scopes=scopes or None, topic=topic, event_id=event_id,
                                            created_after=created_after, created_before=created_before, limit=limit))
    ctx.emit([shapes().event_json(e) for e in page.events], lambda: "\n".join(
        f"{e.event_id:<36} {e.scope:<12} {e.topic:<24} "
        f"{sum(1 for d in e.fanout if d.status)} intent(s)"
        + (f", {sum(1 for d in e.fanout if not d.status)} skipped" if any(not d.status for d in e.fanout) else "")
        for e in page.events) or "no events")


@events.command("deliver")
@click.argument("event_id")
@click.option("--destination", required=True, help="The destination to deliver it to, subscribed or not.")
@click.option("--reason", help="Why (recorded with the intent's first event).")
@SCOPE
@run
async def events_deliver(ctx: Context, box: Outbox, event_id: str, destination: str, reason: str | None,
                         scope: str | None) -> None:
    """Deliver an existing event to one destination now (a subscription added after it was
    published): its intent, made unless it exists."""
    made, event = await box.deliver_event(event_id, destination, scope=scope, actor=cli_actor(), reason=reason)
    ctx.emit({**shapes().event_json(event), "created": made.created},
             lambda: f"{'made' if made.created else 'already made'} {made.intent.action_id} "
             f"({made.intent.status.value})\n" + _text(event))
