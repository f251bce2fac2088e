"""The console's pages: the overview (charts, destination health, what needs attention), the
intent search, destinations, an intent with the forms of its actions (``actions`` answers them),
and bulk replay's preview and progress. Who may see them is ``access``'s; signing in, ``signin``'s."""

from __future__ import annotations

from datetime import datetime
from html import escape

from fastapi import APIRouter, Request
from fastapi.responses import Response
from markupsafe import Markup

from ... import operations, tracing
from ...destinations import Destination
from ...errors import NotFound, OutboxError
from ...ids import KEY_SEPARATOR
from ...model import REPLAYABLE, Intent, Resolution, Status
from ...outbox import Behind, Outbox
from ...store import IntentQuery
from . import charts
from . import history as history_view
from .access import Access
from .destination import STATES, circuit_state, destination_page, destinations_table
from .filters import Filter
from .headline import headline
from .health import backlog, health, per_minute, window
from .layout import STYLE, destination_link, flashes, intent_link, intent_url, pill, pretty, table, when
from .replays import Replays
from .sessions import signed_page
from .templates import render

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
        statuses = table(["status", "intents"], [
            [f"<a href='/console/intents?status={s.value}'>{pill(s.value)}</a>", str(counts.get(s.value, 0))]
            for s in Status], numeric=("intents",), compact=True)
        delivered, failed = per_minute(activity, minutes)
        destinations = await outbox.list_destinations()
        destination_health = destinations_table(request, destinations,
                                                health(activity, [d.id for d in destinations]), now)
        sections = []
        for status, title in ATTENTION:
            found = await outbox.list_intents(IntentQuery(statuses=[status], limit=10))
            sections.append((status.value, title, Markup(_intents(found.intents, now)),
                             counts.get(status.value, 0) if found.next_seq else None))
        return signed_page(request, "Overview", render(
            "overview.html", headline=Markup(headline(request, counts, destinations, now)),
            set_aside=Markup(_set_aside(request, now)),
            attempts_chart=Markup(charts.bars("Attempts per minute", minutes, delivered, failed,
                                              ("delivered", "failed"))),
            backlog_chart=Markup(charts.line("Backlog (open intents)", minutes, backlog(activity, minutes), "open")),
            destinations=Markup(destination_health), statuses=Markup(statuses), sections=sections))

    @pages.get("/intents")
    @access.signed_in
    async def search(request: Request) -> Response:
        async def matched(outbox: Outbox, now: datetime, chosen: Filter) -> str:
            if chosen.action_id:
                intents, next_seq = await outbox.store.intents_named(chosen.action_id), None
            else:
                found = await outbox.list_intents(chosen.query(before=chosen.before))
                intents, next_seq = found.intents, found.next_seq
            older = (f"<p><a rel='next' href='/console/intents?{chosen.encode(before=next_seq)}'>older →</a></p>"
                     if next_seq else "")
            bulk = (f"<p><a href='/console/replay?{chosen.encode()}'>Replay what this filter matches…</a></p>"
                    if chosen.replayable() else "")
            return bulk + _intents(intents, now) + older

        return await access.filtered(request, "Intents", "/console/intents", matched)

    @pages.get("/destinations")
    @access.signed_in
    async def destinations_list(request: Request, state: str = "") -> Response:
        outbox = access.box(request)
        now = outbox.clock.now()
        if state and state not in STATES:
            return signed_page(request, "Destinations", flashes(error="state must be one of " + ", ".join(STATES)),
                               status=400)
        destinations = await outbox.list_destinations()
        shown = [d for d in destinations if not state or circuit_state(request, d, now)[0] == state]
        activity = await outbox.store.activity(window(now)[0], now)
        healths = [h for h in health(activity, [d.id for d in shown]) if h.destination in {d.id for d in shown}]
        return signed_page(request, "Destinations", render(
            "destinations.html", state=state, pill=Markup(pill(state)) if state else None, states=STATES,
            table=Markup(destinations_table(request, shown, healths, now))))

    @pages.get("/destinations/{destination_id}")
    @access.signed_in
    async def destination_view(request: Request, destination_id: str) -> Response:
        outbox = access.box(request)
        try:
            destination = await outbox.get_destination(destination_id)
        except NotFound as exc:
            return signed_page(request, "Not found", f"<p>{escape(exc.message)}</p>", status=404)
        return signed_page(request, f"Destination {destination_id}",
                           await destination_page(request, outbox, destination))

    @pages.get("/intents/{action_id}")
    @access.signed_in
    async def intent_page(request: Request, action_id: str, scope: str | None = None, done: str = "") -> Response:
        return await intent_view(access, request, action_id, scope, done=DONE.get(done, ""))

    @pages.get("/replay")
    @access.signed_in
    async def replay_preview(request: Request) -> Response:
        async def dry_run(outbox: Outbox, now: datetime, chosen: Filter) -> str:
            found = [i async for i in operations.matching(outbox, operations.replay_filter(chosen.query()))]
            risky = await operations.duplicate_risks(outbox, found)
            return render("replay_preview.html", found=len(found), risky=len(risky),
                          risky_destinations=[Markup(destination_link(d)) for d in sorted({i.destination
                                                                                          for i in risky})],
                          intents=Markup(_intents(found[:20], now)), csrf=Markup(access.csrf_field(request)),
                          hidden=Markup(chosen.hidden()))

        return await access.filtered(request, "Bulk replay", "/console/replay", dry_run)

    @pages.get("/replay/{job}")
    @access.signed_in
    async def replay_progress(request: Request, job: str) -> Response:
        found = replays.get(job)
        if found is None:
            return signed_page(request, "Not found",
                               "<p>no such bulk replay in this process (it may have restarted)</p>", status=404)
        now = access.box(request).clock.now()
        refused = [[escape(a), escape(why)] for a, why in found.refused.items()]
        return signed_page(request, "Bulk replay", render(
            "replay_progress.html", job=found, started=Markup(when(found.started_at, now)),
            refused=Markup(table(["action_id", "why"], refused)) if refused else None),
            refresh=None if found.finished else 2)


async def intent_view(access: Access, request: Request, action_id: str, scope: str | None, *, done: str = "",
                      error: str = "", status: int = 200) -> Response:
    """An intent's page for a signed-in operator, with what an action did or why it failed."""
    outbox = access.box(request)
    try:
        intent, history = await outbox.show(action_id, scope=scope)
        behind = await outbox.waiting_behind(intent)
    except (NotFound, OutboxError) as exc:
        return signed_page(request, "Not found", f"<p>{escape(exc.message)}</p>", status=404)
    now = outbox.clock.now()
    actions: list[tuple[str, str, Markup]] = []
    if intent.status in REPLAYABLE:
        actions.append(("replay", "Replay", Markup("<label><input type='checkbox' name='accept_duplicate_risk' "
                                                   "value='yes'> accept duplicate risk</label> ")))
    if intent.status is Status.UNKNOWN:
        actions.append(("resolve", "Resolve", Markup(
            "<select name='resolution' required><option value='' selected>choose the outcome…</option>"
            + "".join(f"<option>{r.value}</option>" for r in Resolution) + "</select> "
            "<input name='external_id' placeholder='external id (evidence)' size='20'> ")))
    if intent.status is Status.HELD:
        actions.append(("approve", "Approve", Markup(
            f"<input type='hidden' name='payload_digest' value='{escape(intent.payload_digest)}'>")))
        actions.append(("reject", "Reject", Markup("")))
    if intent.status in (Status.PENDING, Status.HELD, Status.REVOKED, Status.DEAD):
        actions.append(("cancel", "Cancel", Markup("")))
    try:
        destination: Destination | None = await outbox.get_destination(intent.destination)
    except NotFound:
        destination = None
    return signed_page(request, f"Intent {action_id}", render(
        "intent.html", intent=intent, flashes=Markup(flashes(done, error)), status=Markup(pill(intent.status.value)),
        destination=Markup(destination_link(intent.destination)), enqueued=Markup(when(intent.created_at, now)),
        changed=Markup(when(intent.updated_at, now)),
        next_attempt=Markup(when(intent.next_attempt_at, now)) if intent.status is Status.PENDING else None,
        behind=Markup(_behind_link(behind, intent)) if behind else None,
        last_error=None if intent.status is Status.DELIVERED else intent.last_error,
        payload=Markup(pretty(intent.payload_json[:4000])), trace=Markup(_trace(tracing.kept(intent))),
        actions=actions, url=lambda name: intent_url(action_id, intent.scope, name),
        csrf=Markup(access.csrf_field(request)),
        attempts=Markup(history_view.attempts(history.attempts, history.events, destination, now)),
        timeline=Markup(history_view.timeline(history.events, now))), status=status)


def _set_aside(request: Request, now: datetime) -> str:
    """A warning naming what the sender in this process set aside since it started, if anything."""
    worker = getattr(request.app.state, "worker", None)
    last: tuple[str, datetime] | None = getattr(worker, "last_set_aside", None)
    if last is None:
        return ""
    scope, _, action_id = last[0].rpartition(KEY_SEPARATOR)
    return (f"<p class='flash error'>The sender set aside {getattr(worker, 'set_aside', 0)} intent(s) whose stored "
            f"times cannot be read (dead, nothing sent), the last {intent_link(action_id, scope)} "
            f"{when(last[1], now)}: cancel them, and have them enqueued again with times the outbox takes.</p>")


def _intents(intents: list[Intent], now: datetime) -> str:
    return table(["action_id", "status", "destination", "scope", "attempts", "enqueued", "changed", "last error"], [
        [intent_link(i.action_id, i.scope), pill(i.status.value) + (" " + pill("unreadable") if i.unreadable else ""),
         destination_link(i.destination), escape(i.scope), str(i.attempts), when(i.created_at, now),
         when(i.updated_at, now), "" if i.status is Status.DELIVERED else escape((i.last_error or "")[:200])]
        for i in intents], numeric=("attempts",))


def _trace(kept: dict[str, str]) -> str:
    """The trace context an intent keeps, its ``tracestate`` too (both escaped, as a producer sent
    the state); nothing when it keeps none."""
    if "traceparent" not in kept:
        return ""
    state = f" · tracestate <code>{escape(kept['tracestate'])}</code>" if kept.get("tracestate") else ""
    return f"<p>trace <code>{escape(kept['traceparent'])}</code>{state}</p>"


def _behind_link(behind: Behind, intent: Intent) -> str:
    """"behind <action_id>", linking to the intent in the way."""
    text = escape(behind.text(intent))
    if behind.action_id is None:
        return text
    return f"<a href='{escape(intent_url(behind.action_id, behind.scope))}'>{text}</a>"
