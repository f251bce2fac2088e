"""The console's pages: the overview (charts, destination health, what needs attention), the
intent search, an intent with its actions, and bulk replay (preview, reason, progress).

Sign-in takes an operator or admin token and opens a server-side session, whose id (never the
token) is the cookie; every form carries a CSRF value (``sessions`` says how). Actions go through
the same ``outbox.operations`` as the API and CLI, and are recorded with the token and the reason.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from functools import wraps
from html import escape
from typing import Any, ParamSpec
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from .. import operations, problems, tracing
from ..destinations import Destination
from ..errors import InvalidInput, NotFound, OutboxError
from ..ids import KEY_SEPARATOR
from ..model import Intent, Role, Status
from ..outbox import Behind, Outbox
from ..problems import Problem
from ..store import IntentQuery
from ..tokens import TokenInfo
from . import charts, events, sessions
from . import history as history_view
from .destination import STATES, circuit_state, destination_page, destinations_table
from .filters import Filter
from .headline import headline
from .health import backlog, health, per_minute, window
from .layout import STYLE, destination_link, flashes, intent_link, intent_url, page, pill, pretty, table, when
from .replays import Replays
from .sessions import csrf_for, session_id, signed_page

ATTENTION = ((Status.DEAD, "Dead letters"), (Status.UNKNOWN, "Unknown outcomes"),
             (Status.REVOKED, "Revoked"), (Status.HELD, "Held for approval"))
#: What an intent's page says after an action succeeded, by the code its URL carries
#: (``?done=replay``), and why sign-in was refused (``?error=refused``). Only these words are ever
#: shown: a link anyone can make must not put text of its own on a console page, so an unknown
#: code shows nothing. A failed action's own message is drawn in the answer to its form instead.
DONE = {name: f"{name} done" for name in ("replay", "resolve", "cancel", "approve", "reject")}
SIGN_IN_REFUSED = {"refused": "that is not an operator or admin token"}
#: The largest console form read (they hold a few short fields); a larger body is a 413, unread.
FORM_BYTES = 64 * 1024

P = ParamSpec("P")


def router(box: Callable[[Request], Outbox], authorize: Callable[[Request], Any]) -> APIRouter:
    """The console's routes, reading the outbox and the replay authority from the app."""
    pages = APIRouter(prefix="/console", include_in_schema=False)
    replays = Replays()

    async def session(request: Request) -> TokenInfo | None:
        """The operator's or admin's token of the request's open session, or None."""
        opened = session_id(request)
        if not opened:
            return None
        info = await box(request).console_session(opened)
        return info if info is not None and info.role in (Role.OPERATOR, Role.ADMIN) else None

    async def form(request: Request) -> dict[str, list[str]]:
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > FORM_BYTES:
                raise Problem(413, "payload-too-large", "Form too large",
                              f"a console form is at most {FORM_BYTES} bytes")
        return parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)

    def sent(fields: dict[str, list[str]], name: str) -> str:
        return fields.get(name, [""])[-1]

    def csrf_field(request: Request) -> str:
        return f"<input type='hidden' name='csrf' value='{csrf_for(session_id(request))}'>"

    def forged(request: Request, fields: dict[str, list[str]]) -> Response | None:
        """A refusal unless the form carries this session's CSRF value."""
        if sessions.matches(sent(fields, "csrf"), csrf_for(session_id(request))):
            return None
        return signed_page(request, "Refused",
                           "<p>the form is stale or was not sent from this console; reload and retry</p>", status=403)

    def to_login() -> Response:
        return RedirectResponse("/console/login", status_code=303)

    def signed_in(view: Callable[P, Awaitable[Response]]) -> Callable[P, Awaitable[Response]]:
        """A page only a signed-in operator sees; anyone else is sent to sign in."""

        @wraps(view)
        async def guarded(*args: P.args, **kwargs: P.kwargs) -> Response:
            request: Any = kwargs["request"]  # FastAPI passes every parameter by name
            if await session(request) is None:
                return to_login()
            return await view(*args, **kwargs)

        return guarded

    async def signed_form(request: Request) -> tuple[TokenInfo, dict[str, list[str]]] | Response:
        """Who sent a console form and its fields, or the answer instead: to sign in, or a refusal
        of a form without this session's CSRF value."""
        who = await session(request)
        if who is None:
            return to_login()
        raw = await form(request)
        if (refused := forged(request, raw)) is not None:
            return refused
        return who, raw

    async def filtered(request: Request, title: str, action: str,
                       draw: Callable[[Outbox, datetime, Filter], Awaitable[str]]) -> Response:
        """A page of the filter form (sent to ``action``) over what ``draw`` makes of the filter it
        chose; a filter or a query the outbox refuses answers 400 with the form and its message."""
        outbox = box(request)
        now = outbox.clock.now()
        destinations = [d.id for d in await outbox.list_destinations()]
        chosen = Filter()
        try:
            chosen = Filter.parse(request.query_params, now)
            drawn = await draw(outbox, now, chosen)
        except OutboxError as exc:
            return signed_page(request, title, chosen_form(chosen, destinations, action=action)
                               + flashes(error=exc.message), status=400)
        return signed_page(request, title, chosen_form(chosen, destinations, action=action) + drawn)

    events.register(pages, box, signed_in)

    @pages.get("/style.css")
    async def style() -> Response:
        return Response(STYLE, media_type="text/css; charset=utf-8", headers={"Cache-Control": "max-age=3600"})

    def login_form(request: Request, error: str = "", status: int = 200) -> HTMLResponse:
        """The sign-in page, its form bound to a new value of the sign-in form's cookie."""
        value = sessions.new_login_value()
        response = page("Sign in", flashes(error=error) + (
            "<form method='post' action='/console/login'>"
            f"<input type='hidden' name='csrf' value='{value}'><p><label>Operator or admin token<br>"
            "<input name='token' type='password' size='40' autofocus></label></p>"
            "<button type='submit'>Sign in</button></form>"), status=status)
        sessions.login_form(response, request, value)
        return response

    @pages.get("/login")
    async def login_page(request: Request, error: str = "") -> Response:
        return login_form(request, SIGN_IN_REFUSED.get(error, ""))

    @pages.post("/login")
    async def login(request: Request) -> Response:
        """Open a session for an operator's or admin's token, sent with the sign-in form this
        browser was given (another site's form has not its value); the session it had ends."""
        fields = await form(request)
        if not sessions.matches(sent(fields, "csrf"), request.cookies.get(sessions.LOGIN_COOKIE, "")):
            return login_form(request, "the sign-in form was stale or not sent from this console: sign in again",
                              status=403)
        outbox = box(request)
        token = sent(fields, "token").strip()
        info = await outbox.authenticate(token, cached=False) if token else None
        if info is None or info.role not in (Role.OPERATOR, Role.ADMIN):
            return RedirectResponse("/console/login?error=refused", status_code=303)
        if previous := session_id(request):
            await outbox.close_console_session(previous)
        response = RedirectResponse("/console", status_code=303)
        sessions.open_session(response, request, await outbox.open_console_session(info),
                              outbox.settings.console_session_seconds)
        return response

    @pages.post("/logout")
    async def logout(request: Request) -> Response:
        """End the session, if the form is its own (another site cannot sign an operator out)."""
        if await session(request) is not None:
            if (refused := forged(request, await form(request))) is not None:
                return refused
            await box(request).close_console_session(session_id(request))
        response = to_login()
        sessions.end_session(response, request)
        return response

    @pages.get("")
    @signed_in
    async def overview(request: Request) -> Response:
        outbox = box(request)
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
        graphs = ("<div class='charts'>"
                  + charts.bars("Attempts per minute", minutes, delivered, failed, ("delivered", "failed"))
                  + charts.line("Backlog (open intents)", minutes, backlog(activity, minutes), "open")
                  + "</div>")
        destinations = await outbox.list_destinations()
        destination_health = destinations_table(request, destinations,
                                                health(activity, [d.id for d in destinations]), now)
        sections = []
        for status, title in ATTENTION:
            found = await outbox.list_intents(IntentQuery(statuses=[status], limit=10))
            more = (f"<p><a href='/console/intents?status={status.value}'>all {counts.get(status.value, 0)}</a></p>"
                    if found.next_seq else "")
            sections.append(f"<h2 id='{status.value}'>{title}</h2>" + _intents(found.intents, now) + more)
        search = ("<form class='filters' method='get' action='/console/intents'><label>action id"
                  "<input name='q' size='24'></label><button>Find</button></form>")
        return signed_page(request, "Overview", headline(request, counts, destinations, now)
                           + _set_aside(request, now) + search + "<h2>Last hour</h2>" + graphs
                           + "<h2 id='destinations'>Destinations (last hour)</h2>" + destination_health
                           + "<h2>Backlog by status</h2>" + statuses + "".join(sections))

    @pages.get("/intents")
    @signed_in
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

        return await filtered(request, "Intents", "/console/intents", matched)

    @pages.get("/destinations")
    @signed_in
    async def destinations_list(request: Request, state: str = "") -> Response:
        outbox = box(request)
        now = outbox.clock.now()
        if state and state not in STATES:
            return signed_page(request, "Destinations", flashes(error="state must be one of " + ", ".join(STATES)),
                               status=400)
        destinations = await outbox.list_destinations()
        shown = [d for d in destinations if not state or circuit_state(request, d, now)[0] == state]
        activity = await outbox.store.activity(window(now)[0], now)
        healths = [h for h in health(activity, [d.id for d in shown]) if h.destination in {d.id for d in shown}]
        choices = " · ".join(f"<a href='/console/destinations?state={quote(s)}'>{escape(s)}</a>" for s in STATES)
        return signed_page(request, "Destinations", (f"<p>{'showing ' + pill(state) + ' · ' if state else ''}"
                                                     f"<a href='/console/destinations'>all</a> · {choices}</p>"
                                                     "<h2>Last hour</h2>"
                                                     + destinations_table(request, shown, healths, now)))

    @pages.get("/destinations/{destination_id}")
    @signed_in
    async def destination_view(request: Request, destination_id: str) -> Response:
        outbox = box(request)
        try:
            destination = await outbox.get_destination(destination_id)
        except NotFound as exc:
            return signed_page(request, "Not found", f"<p>{escape(exc.message)}</p>", status=404)
        return signed_page(request, f"Destination {destination_id}",
                           await destination_page(request, outbox, destination))

    @pages.get("/intents/{action_id}")
    @signed_in
    async def intent_page(request: Request, action_id: str, scope: str | None = None, done: str = "") -> Response:
        return await intent_view(request, action_id, scope, done=DONE.get(done, ""))

    async def intent_view(request: Request, action_id: str, scope: str | None, *, done: str = "", error: str = "",
                          status: int = 200) -> Response:
        """An intent's page for a signed-in operator, with what an action did or why it failed."""
        outbox = box(request)
        try:
            intent, history = await outbox.show(action_id, scope=scope)
            behind = await outbox.waiting_behind(intent)
        except (NotFound, OutboxError) as exc:
            return signed_page(request, "Not found", f"<p>{escape(exc.message)}</p>", status=404)
        now = outbox.clock.now()
        csrf = csrf_field(request)

        def action(name: str, label: str, extra: str = "") -> str:
            target = escape(intent_url(action_id, intent.scope, name))
            return (f"<form class='inline' method='post' action='{target}'>{csrf}{extra}"
                    f"<input name='reason' placeholder='reason' required size='24'> "
                    f"<button type='submit' name='action' value='{name}'>{label}</button></form>")

        actions = []
        if intent.status in operations.REPLAYABLE:
            actions.append(action("replay", "Replay", "<label><input type='checkbox' name='accept_duplicate_risk' "
                                                      "value='yes'> accept duplicate risk</label> "))
        if intent.status is Status.UNKNOWN:
            actions.append(action("resolve", "Resolve", "<select name='resolution' required>"
                "<option value='' selected>choose the outcome…</option>" + "".join(
                f"<option>{r.value}</option>" for r in operations.Resolution) + "</select> "
                "<input name='external_id' placeholder='external id (evidence)' size='20'> "))
        if intent.status is Status.HELD:
            digest = f"<input type='hidden' name='payload_digest' value='{escape(intent.payload_digest)}'>"
            actions.append(action("approve", "Approve", digest))
            actions.append(action("reject", "Reject"))
        if intent.status in (Status.PENDING, Status.HELD, Status.REVOKED, Status.DEAD):
            actions.append(action("cancel", "Cancel"))
        try:
            destination: Destination | None = await outbox.get_destination(intent.destination)
        except NotFound:
            destination = None
        waiting = f"<p class='flash error'>waiting {_behind_link(behind, intent)}</p>" if behind else ""
        if intent.unreadable:
            waiting += (f"<p class='flash error'>{escape(intent.unreadable)}: the sender sets it aside unsent; "
                        "cancel it, and enqueue it again with times the outbox takes</p>")
        last_error = ("" if intent.status is Status.DELIVERED or not intent.last_error
                      else f"<p>last error: {escape(intent.last_error)}</p>")
        return signed_page(request, f"Intent {action_id}", flashes(done, error) + (
            f"<p>{pill(intent.status.value)} to <b>{destination_link(intent.destination)}</b> for "
            f"<b>{escape(intent.scope)}</b> · attempts {intent.attempts}/{intent.max_attempts} · fence {intent.fence}"
            f" · enqueued {when(intent.created_at, now)} · changed {when(intent.updated_at, now)}"
            + (f" · next attempt {when(intent.next_attempt_at, now)}" if intent.status is Status.PENDING
               else "") + "</p>"
            f"{waiting}{last_error}"
            f"<p>payload <code>{escape(intent.payload_digest)}</code></p>{pretty(intent.payload_json[:4000])}"
            + _trace(tracing.kept(intent))
            + f"<h2>Actions</h2>{''.join(actions) or '<p>none for this status</p>'}"
            "<h2>Attempts</h2>" + history_view.attempts(history.attempts, history.events, destination, now)
            + "<h2>Timeline</h2>" + history_view.timeline(history.events, now)), status=status)

    async def act(request: Request, action_id: str, scope: str | None, name: str,
                  run: Callable[[Outbox, operations.Actor, dict[str, str]], Awaitable[object]]) -> Response:
        sent = await signed_form(request)
        if isinstance(sent, Response):
            return sent
        who, raw = sent
        fields = {k: v[-1] for k, v in raw.items()}
        try:
            await run(box(request), operations.Actor(who.actor, fields.get("reason", "")), fields)
        except OutboxError as exc:
            return await intent_view(request, action_id, scope, error=exc.message,
                                     status=problems.from_error(exc).status)
        return RedirectResponse(intent_url(action_id, scope, done=name), status_code=303)

    @pages.post("/intents/{action_id}/replay")
    async def replay(request: Request, action_id: str, scope: str | None = None) -> Response:
        return await act(request, action_id, scope, "replay", lambda b, who, f: operations.replay(
            b, action_id, who, scope=scope, authorize=authorize(request),
            accept_duplicate_risk=f.get("accept_duplicate_risk") == "yes"))

    @pages.post("/intents/{action_id}/resolve")
    async def resolve(request: Request, action_id: str, scope: str | None = None) -> Response:
        async def run(b: Outbox, who: operations.Actor, f: dict[str, str]) -> object:
            try:
                resolution = operations.Resolution(f.get("resolution", ""))
            except ValueError:
                raise InvalidInput("choose the outcome to resolve it as: delivered, retry or dead "
                                   "(nothing is chosen for you)") from None
            return await operations.resolve(b, action_id, resolution, who, scope=scope,
                                            external_id=f.get("external_id") or None)

        return await act(request, action_id, scope, "resolve", run)

    @pages.post("/intents/{action_id}/cancel")
    async def cancel(request: Request, action_id: str, scope: str | None = None) -> Response:
        return await act(request, action_id, scope, "cancel",
                         lambda b, who, f: operations.cancel(b, action_id, who, scope=scope))

    @pages.post("/intents/{action_id}/approve")
    async def approve(request: Request, action_id: str, scope: str | None = None) -> Response:
        return await act(request, action_id, scope, "approve", lambda b, who, f: operations.approve(
            b, action_id, who, scope=scope, payload_digest=f.get("payload_digest", "")))

    @pages.post("/intents/{action_id}/reject")
    async def reject(request: Request, action_id: str, scope: str | None = None) -> Response:
        return await act(request, action_id, scope, "reject",
                         lambda b, who, f: operations.reject(b, action_id, who, scope=scope))

    @pages.get("/replay")
    @signed_in
    async def replay_preview(request: Request) -> Response:
        async def dry_run(outbox: Outbox, now: datetime, chosen: Filter) -> str:
            found = [i async for i in operations.matching(outbox, operations.replay_filter(chosen.query()))]
            risky = await operations.duplicate_risks(outbox, found)
            warning = (f"<p class='warning' id='duplicate-risk'><b>Duplicate risk: {len(risky)} of these "
                       f"{len(found)} intents</b> may already have taken effect (an attempt whose outcome is "
                       "unknown or may have been submitted) at a destination that does not declare idempotency ("
                       + ", ".join(sorted({destination_link(i.destination) for i in risky}))
                       + "). Replaying sends them again and the receiver may act twice. Without "
                       "“accept duplicate risk” they are refused and listed; tick it only once you know "
                       "the receiver can take them.</p>") if risky else ""
            confirm = (
                f"<form method='post' action='/console/replay'>{csrf_field(request)}{chosen.hidden()}"
                f"<p><label>Reason (recorded on every replay)<br><input name='reason' required size='40'></label></p>"
                f"<p><label><input type='checkbox' name='accept_duplicate_risk' value='yes'> accept duplicate risk"
                + (f" (<b>{len(risky)} may have taken effect already</b>; unticked, they are refused)" if risky else "")
                + f"</label></p><button type='submit'>Replay {len(found)} intents</button></form>") if found else ""
            return (f"<h2>Dry run: {len(found)} intents match</h2>" + warning
                    + (f"<p>The first {min(len(found), 20)} of them:</p>" if found else "")
                    + _intents(found[:20], now) + confirm)

        return await filtered(request, "Bulk replay", "/console/replay", dry_run)

    @pages.post("/replay")
    async def replay_start(request: Request) -> Response:
        sent = await signed_form(request)
        if isinstance(sent, Response):
            return sent
        who, raw = sent
        outbox = box(request)
        try:
            chosen = Filter.parse(raw, outbox.clock.now())
            actor = operations.Actor(who.actor, raw.get("reason", [""])[-1])
            job = await replays.start(outbox, chosen.query(), actor, authorize=authorize(request),
                                      accept_duplicate_risk=raw.get("accept_duplicate_risk", [""])[-1] == "yes")
        except OutboxError as exc:
            return signed_page(request, "Bulk replay", flashes(error=exc.message), status=400)
        return RedirectResponse(f"/console/replay/{job}", status_code=303)

    @pages.get("/replay/{job}")
    @signed_in
    async def replay_progress(request: Request, job: str) -> Response:
        found = replays.get(job)
        if found is None:
            return signed_page(request, "Not found",
                               "<p>no such bulk replay in this process (it may have restarted)</p>", status=404)
        now = box(request).clock.now()
        refused = [[escape(a), escape(why)] for a, why in found.refused.items()]
        state = ("running (this page refreshes itself)" if not found.finished
                 else f"stopped: {escape(found.error)}" if found.error else "finished")
        return signed_page(request, "Bulk replay", (
            f"<p>{state} · started {when(found.started_at, now)} by {escape(found.actor.name)}: "
            f"{escape(found.actor.reason)}</p>"
            f"<p><progress max='{max(found.total, 1)}' value='{found.done}'></progress> "
            f"{found.done} of {found.total} looked at · <b>{len(found.replayed)} replayed</b> · "
            f"{len(found.refused)} refused</p>" + ("<h2>Refused</h2>" + table(["action_id", "why"], refused)
                                                   if refused else "")),
            refresh=None if found.finished else 2)

    return pages


def chosen_form(chosen: Filter, destinations: list[str], *, action: str = "/console/intents") -> str:
    """The filter form, showing what is chosen (GET, so a search is a link to share)."""
    statuses = "".join(f"<option{' selected' if s in chosen.statuses else ''}>{s.value}</option>" for s in Status)
    dests = "".join(f"<option{' selected' if d == chosen.destination else ''}>{escape(d)}</option>"
                    for d in destinations)
    ranges = "".join(f"<option value='{k}'{' selected' if k == chosen.range else ''}>{label}</option>"
                     for k, label in (("", "any time"), ("1h", "last hour"), ("24h", "last day"),
                                      ("7d", "last week")))
    text = "" if action != "/console/intents" else (
        f"<label>action id<input name='q' value='{escape(chosen.action_id)}' size='20'></label>")
    return (f"<form class='filters' method='get' action='{action}'>{text}"
            f"<label>status<select name='status' multiple size='3'>{statuses}</select></label>"
            f"<label>destination<select name='destination'><option value=''>any</option>{dests}</select></label>"
            f"<label>scope<input name='scope' value='{escape(chosen.scope)}' size='12'></label>"
            f"<label>channel<input name='channel' value='{escape(chosen.channel)}' size='8'></label>"
            f"<label>enqueued<select name='range'>{ranges}</select></label>"
            f"<label>after (UTC)<input name='after' type='datetime-local' value='{chosen.after_text}'></label>"
            f"<label>before (UTC)<input name='before_time' type='datetime-local' value='{chosen.before_text}'>"
            f"</label><button>Filter</button></form>")


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
