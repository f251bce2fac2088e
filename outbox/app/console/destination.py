"""A destination as the console shows it: where it delivers, what is known of its circuit, its
health over the overview's window, and its page (health, backlog, policy fields, last errors).

Its policy is drawn from the destination's public answer field by field, whatever the fields are,
so a field added to the destination record shows here without a change."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import quote

from fastapi import Request

from ... import channels
from ...destinations import Destination
from ...model import Status
from ...outbox import Outbox
from ...shapes import destination_json
from .health import Health, health, window

#: A destination's last errors shown on its page.
LAST_ERRORS = 20


def record_pause(destination: Destination, now: datetime) -> datetime | None:
    """When the pause its receiver asked for (``paused_until``, a 429 or 503 with Retry-After)
    ends, if it has not yet."""
    until = destination.paused_until
    return until if until is not None and until > now else None


def circuits_here(request: Request) -> Any:
    """The circuits of the sender running in this process, or None when there is none."""
    return getattr(getattr(request.app.state, "worker", None), "circuits", None)


#: A circuit's states, as ``circuit_state`` names them and the destinations list filters on.
STATES = ("disabled", "unusable", "paused", "open", "probing", "closed", "not known")


def circuit_state(request: Request, destination: Destination | str, now: datetime) -> tuple[str, datetime | None]:
    """What is known here of a destination's circuit, and until when it holds: ``disabled``,
    ``unusable`` (stored settings the outbox does not take: nothing is sent) and ``paused`` come
    from its record; ``open`` (paused by the sender after sends got no answer),
    ``probing`` and ``closed`` only from a sender in this process, since those pauses are not
    stored; without one it is ``not known`` rather than a guess."""
    if isinstance(destination, Destination):
        if destination.disabled:
            return "disabled", None
        if destination.unusable:
            return "unusable", None
        if (paused := record_pause(destination, now)) is not None:
            return "paused", paused
    circuits = circuits_here(request)
    if circuits is None:
        return "not known", None
    until = circuits.paused_until(destination if isinstance(destination, str) else destination.id)
    if until is None:
        return "closed", None
    return ("open", until) if until > now else ("probing", until)


#: A destination's health, its circuit's state and until when that holds: a row of the health tables
#: (``templates/health.html``).
HealthRow = tuple[Health, str, datetime | None]


async def destination_page(request: Request, outbox: Outbox, destination: Destination) -> dict[str, Any]:
    """What a destination's page (``templates/destination.html``) shows: what on call needs to
    judge it at a glance, then its policy."""
    now = outbox.clock.now()
    since = window(now)[0]
    activity = await outbox.store.activity(since, now)
    [h] = [h for h in health(activity, [destination.id]) if h.destination == destination.id]
    counts = await outbox.store.destination_counts(destination.id)
    state, until = circuit_state(request, destination, now)
    return {"destination": destination, "target": channels.target(destination), "state": state, "until": until,
            "now": now, "filtered": f"/console/intents?destination={quote(destination.id)}",
            "limits": limits(destination), "paused": record_pause(destination, now), "health_rows": [(h, state, until)],
            "backlog": [(s.value, counts.get(s.value, 0)) for s in Status], "last_errors": LAST_ERRORS,
            "failures": await outbox.store.failed_attempts(destination.id, since, LAST_ERRORS),
            "policy": destination_json(destination)}


def limits(destination: Destination) -> list[str]:
    """Its limits in words: what decides how fast it is sent (its pause aside)."""
    rate = destination.rate_limit
    return [f"{rate.per_second:g}/s, burst {rate.burst}" if rate else "no rate limit",
            f"at most {destination.max_in_flight} in flight" if destination.max_in_flight else "no in-flight limit"]


def health_rows(request: Request, destinations: list[Destination], healths: list[Health],
                now: datetime) -> list[HealthRow]:
    """Each destination's health (``healths``) with what is known here of its circuit."""
    known: dict[str, Destination | str] = {d.id: d for d in destinations}
    return [(h, *circuit_state(request, known.get(h.destination, h.destination), now)) for h in healths]
