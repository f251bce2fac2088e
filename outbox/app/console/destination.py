"""A destination as the console shows it: where it delivers, what is known of its circuit, its
health over the overview's window, and its page (health, backlog, policy fields, last errors).

Its policy is drawn from the destination's public answer field by field, whatever the fields are,
so a field added to the destination record shows here without a change."""

from __future__ import annotations

from datetime import datetime
from html import escape
from typing import Any
from urllib.parse import quote

from fastapi import Request
from markupsafe import Markup

from ... import channels
from ...destinations import Destination
from ...model import Status
from ...outbox import Outbox
from ...shapes import destination_json
from .health import Health, health, window
from .layout import destination_link, fields, intent_link, pill, table, when
from .templates import render

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


def circuit(request: Request, destination: Destination | str, now: datetime) -> str:
    """A destination's circuit in words."""
    state, until = circuit_state(request, destination, now)
    return {"disabled": pill("disabled") + " (answered 410 Gone, or an admin disabled it)",
            "unusable": pill("unusable") + " (stored settings the outbox does not take: nothing is sent)",
            "paused": f"{pill('paused')} until {when(until, now)} (by its record)",
            "not known": "not known here (no sender in this process)",
            "closed": pill("closed"),
            "open": f"{pill('paused')} until {when(until, now)}",
            "probing": f"{pill('probing')} (pause ended {when(until, now)}; one send finds out)"}[state]


HEALTH = ["destination", "circuit", "delivered", "failed", "failure rate", "mean attempt", "open", "oldest due",
          "last success", "last error"]
NUMERIC = ("delivered", "failed", "failure rate", "mean attempt", "open")


def health_row(h: Health, circuit_html: str, now: datetime) -> list[str]:
    """A destination's health as the cells of ``HEALTH``."""
    rate = "—" if h.failure_rate is None else f"{h.failure_rate:.0%}"
    mean = "—" if h.mean_ms is None else f"{h.mean_ms:.0f} ms"
    failure = h.last_failure
    last_error = "—" if failure is None else (
        f"{when(failure.at, now)} {escape(failure.outcome)}"
        + (f" {failure.status_code}" if failure.status_code else "")
        + (f": {escape(failure.error[:200])}" if failure.error else ""))
    return [destination_link(h.destination), circuit_html, str(h.delivered),
            str(h.failed), rate, mean, str(h.waiting), when(h.oldest_due_at, now), when(h.last_success, now),
            last_error]


async def destination_page(request: Request, outbox: Outbox, destination: Destination) -> str:
    """A destination's page: what on call needs to judge it at a glance, then its policy."""
    now = outbox.clock.now()
    since = window(now)[0]
    activity = await outbox.store.activity(since, now)
    [h] = [h for h in health(activity, [destination.id]) if h.destination == destination.id]
    counts = await outbox.store.destination_counts(destination.id)
    failures = await outbox.store.failed_attempts(destination.id, since, LAST_ERRORS)
    state = circuit(request, destination, now)
    filtered = f"/console/intents?destination={quote(destination.id)}"
    backlog = table(["status", "intents"], [
        [f"<a href='{filtered}&amp;status={s.value}'>{pill(s.value)}</a>", str(counts.get(s.value, 0))]
        for s in Status], numeric=("intents",), compact=True)
    errors = table(["finished", "intent", "#", "submission", "outcome", "status", "error"], [
        [when(f.at, now), intent_link(f.action_id, f.scope), str(f.number), escape(f.submission or ""),
         escape(f.outcome), str(f.status_code or ""), escape(f.error or "")] for f in failures],
        empty="no failed attempts in the last hour", numeric=("#", "status"))
    return render("destination.html", destination=destination, target=channels.target(destination),
                  circuit=Markup(state), filtered=filtered, limits=limits(destination, now),
                  health=Markup(table(HEALTH[2:], [health_row(h, state, now)[2:]], numeric=NUMERIC)),
                  backlog=Markup(backlog), last_errors=LAST_ERRORS, errors=Markup(errors),
                  policy=Markup(fields(destination_json(destination))))


def limits(destination: Destination, now: datetime) -> list[str | Markup]:
    """Its limits and pause in words: what decides how fast it is sent."""
    rate = destination.rate_limit
    said: list[str | Markup] = [
        f"{rate.per_second:g}/s, burst {rate.burst}" if rate else "no rate limit",
        f"at most {destination.max_in_flight} in flight" if destination.max_in_flight else "no in-flight limit"]
    if (paused := record_pause(destination, now)) is not None:
        said.append(Markup(f"<b>paused</b> by its receiver until {when(paused, now)}"))
    return said


def destinations_table(request: Request, destinations: list[Destination], healths: list[Health],
                       now: datetime) -> str:
    """Each destination's health (``healths``), each linking to its page."""
    known: dict[str, Destination | str] = {d.id: d for d in destinations}
    return table(HEALTH, [health_row(h, circuit(request, known.get(h.destination, h.destination), now), now)
                          for h in healths], numeric=NUMERIC)
