"""The console's pages: the overview (charts, destination health, what needs attention), the
intent search, destinations, an intent with the forms of its actions (``actions`` answers them),
and bulk replay's preview and progress. Who may see them is ``access``'s; signing in, ``signin``'s."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ... import operations, tracing
from ...destinations import Destination
from ...errors import NotFound, OutboxError
from ...ids import KEY_SEPARATOR
from ...model import REPLAYABLE, Resolution, Status
from ...outbox import Outbox
from ...store import IntentQuery
from . import charts
from . import history as history_view
from .access import Access
from .destination import STATES, circuit_state, destination_page, health_rows
from .filters import Filter
from .headline import headline
from .health import backlog, health, per_minute, window
from .layout import STYLE
from .replays import Replays
from .sessions import signed_page

ATTENTION = ((Status.DEAD, "Dead letters"), (Status.UNKNOWN, "Unknown outcomes"),
             (Status.REVOKED, "Revoked"), (Status.HELD, "Held for approval"))
#: What an intent's page says after an action succeeded, by the code its URL carries
#: (``?done=replay``). Only these words are ever shown: a link anyone can make must not put text
#: of its own on a console page, so an unknown code shows nothing. A failed action's own message
#: is drawn in the answer to its form instead.
DONE = {name: f"{name} done" for name in ("replay", "resolve", "cancel", "approve", "reject")}


def register(pages: APIRouter, access: Access, replays: Replays) -> None:
    """Add the console's pages to its router (``replays``: the bulk replays this process runs)."""

    @pages.get("/style.css")
    async def style() -> Response:
        return Response(STYLE, media_type="text/css; charset=utf-8", headers={"Cache-Control": "max-age=3600"})

    @pages.get("")
    @access.signed_in
    async def overview(request: Request) -> Response:
        outbox = access.box(request)
        now = outbox.clock.now()
        minutes = window(now)
        activity = await outbox.store.activity(minutes[0], now)
        counts: dict[str, int] = {}
        for status, _, n in await outbox.store.count_by_status():
            counts[status] = counts.get(status, 0) + n
        delivered, failed = per_minute(activity, minutes)
        destinations = await outbox.list_destinations()
        sections = []
        for status, title in ATTENTION:
            found = await outbox.list_intents(IntentQuery(statuses=[status], limit=10))
            sections.append((status.value, title, found.intents,
                             counts.get(status.value, 0) if found.next_seq else None))
        return signed_page(
            request, "overview.html", "Overview", now=now, headline=headline(request, counts, destinations, now),
            set_aside=_set_aside(request),
            charts=[charts.bars("Attempts per minute", minutes, delivered, failed, ("delivered", "failed")),
                    charts.line("Backlog (open intents)", minutes, backlog(activity, minutes), "open")],
            health_rows=health_rows(request, destinations, health(activity, [d.id for d in destinations]), now),
            statuses=[(s.value, counts.get(s.value, 0)) for s in Status], sections=sections)

    @pages.get("/intents")
    @access.signed_in
    async def search(request: Request) -> Response:
        async def matched(outbox: Outbox, now: datetime, chosen: Filter) -> dict[str, Any]:
            if chosen.action_id:
                intents, next_seq = await outbox.store.intents_named(chosen.action_id), None
            else:
                found = await outbox.list_intents(chosen.query(before=chosen.before))
                intents, next_seq = found.intents, found.next_seq
            return {"intents": intents, "older": chosen.encode(before=next_seq) if next_seq else None,
                    "bulk": chosen.encode() if chosen.replayable() else None}

        return await access.filtered(request, "Intents", "intents.html", "/console/intents", matched)

    @pages.get("/destinations")
    @access.signed_in
    async def destinations_list(request: Request, state: str = "") -> Response:
        outbox = access.box(request)
        now = outbox.clock.now()
        if state and state not in STATES:
            return signed_page(request, "error.html", "Destinations", status=400,
                               error="state must be one of " + ", ".join(STATES))
        destinations = await outbox.list_destinations()
        shown = [d for d in destinations if not state or circuit_state(request, d, now)[0] == state]
        activity = await outbox.store.activity(window(now)[0], now)
        healths = [h for h in health(activity, [d.id for d in shown]) if h.destination in {d.id for d in shown}]
        return signed_page(request, "destinations.html", "Destinations", state=state, states=STATES, now=now,
                           health_rows=health_rows(request, shown, healths, now))

    @pages.get("/destinations/{destination_id}")
    @access.signed_in
    async def destination_view(request: Request, destination_id: str) -> Response:
        outbox = access.box(request)
        try:
            destination = await outbox.get_destination(destination_id)
        except NotFound as exc:
            return signed_page(request, "message.html", "Not found", message=exc.message, status=404)
        return signed_page(request, "destination.html", f"Destination {destination_id}",
                           **await destination_page(request, outbox, destination))

    @pages.get("/intents/{action_id}")
    @access.signed_in
    async def intent_page(request: Request, action_id: str, scope: str | None = None, done: str = "") -> Response:
        return await intent_view(access, request, action_id, scope, done=DONE.get(done, ""))

    @pages.get("/replay")
    @access.signed_in
    async def replay_preview(request: Request) -> Response:
        async def dry_run(outbox: Outbox, now: datetime, chosen: Filter) -> dict[str, Any]:
            found = [i async for i in operations.matching(outbox, operations.replay_filter(chosen.query()))]
            risky = await operations.duplicate_risks(outbox, found)
            return {"found": len(found), "intents": found[:20], "risky": len(risky),
                    "risky_destinations": sorted({i.destination for i in risky})}

        return await access.filtered(request, "Bulk replay", "replay_preview.html", "/console/replay", dry_run)

    @pages.get("/replay/{job}")
    @access.signed_in
    async def replay_progress(request: Request, job: str) -> Response:
        found = replays.get(job)
        if found is None:
            return signed_page(request, "message.html", "Not found", status=404,
                               message="no such bulk replay in this process (it may have restarted)")
        return signed_page(request, "replay_progress.html", "Bulk replay", job=found,
                           now=access.box(request).clock.now(), refresh=None if found.finished else 2)


async def intent_view(access: Access, request: Request, action_id: str, scope: str | None, *, done: str = "",
                      error: str = "", status: int = 200) -> Response:
    """An intent's page for a signed-in operator, with what an action did or why it failed."""
    outbox = access.box(request)
    try:
        intent, history = await outbox.show(action_id, scope=scope)
        behind = await outbox.waiting_behind(intent)
    except (NotFound, OutboxError) as exc:
        return signed_page(request, "message.html", "Not found", message=exc.message, status=404)
    try:
        destination: Destination | None = await outbox.get_destination(intent.destination)
    except NotFound:
        destination = None
    return signed_page(
        request, "intent.html", f"Intent {action_id}", intent=intent, now=outbox.clock.now(), done=done,
        error=error, behind=behind, trace=tracing.kept(intent), actions=_actions(intent.status),
        resolutions=[r.value for r in Resolution], events=history.events,
        attempts=history_view.attempts(history.attempts, history.events, destination),
        destination_id=destination.id if destination else None, status=status)


def _actions(status: Status) -> list[tuple[str, str]]:
    """The actions an intent's status allows, by name and label (its page draws each one's form)."""
    allowed = [("replay", "Replay")] if status in REPLAYABLE else []
    if status is Status.UNKNOWN:
        allowed.append(("resolve", "Resolve"))
    if status is Status.HELD:
        allowed += [("approve", "Approve"), ("reject", "Reject")]
    if status in (Status.PENDING, Status.HELD, Status.REVOKED, Status.DEAD):
        allowed.append(("cancel", "Cancel"))
    return allowed


def _set_aside(request: Request) -> dict[str, Any] | None:
    """What the sender in this process set aside since it started (how many, and the last one
    with when), if anything."""
    worker = getattr(request.app.state, "worker", None)
    last: tuple[str, datetime] | None = getattr(worker, "last_set_aside", None)
    if last is None:
        return None
    scope, _, action_id = last[0].rpartition(KEY_SEPARATOR)
    return {"count": getattr(worker, "set_aside", 0), "action_id": action_id, "scope": scope, "at": last[1]}
