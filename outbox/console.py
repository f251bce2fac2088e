"""The operator console at ``/console``: server-rendered pages, no front-end build.

Sign-in takes an operator or admin token and keeps it in an HttpOnly, SameSite=Strict cookie;
every action form also carries a token-bound CSRF value. Actions go through the same
``outbox.operations`` as the API and CLI, and are recorded with the token and the reason.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Awaitable, Callable
from html import escape
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from . import operations
from .clock import iso
from .errors import NotFound, OutboxError
from .model import Intent, Role, Status
from .outbox import Behind, Outbox
from .store import IntentQuery
from .tokens import TokenInfo
from .web import ConsoleRoute, secure_cookie

COOKIE = "outbox_console"
STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1b1f24;background:#f6f8fa}
header{background:#24292f;color:#fff;padding:10px 20px;display:flex;gap:20px;align-items:center}
header a{color:#fff} main{padding:20px;max-width:1200px}
table{border-collapse:collapse;width:100%;background:#fff;margin:8px 0 20px}
th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#eaeef2} .pill{padding:1px 8px;border-radius:10px;background:#ddf4ff}
.dead,.revoked{background:#ffebe9} .unknown,.held{background:#fff8c5} .delivered{background:#dafbe1}
form.inline{display:inline-block;margin:4px 8px 4px 0;padding:6px;border:1px solid #d0d7de;background:#fff}
.flash{padding:8px;background:#dafbe1;border:1px solid #4ac26b} .error{background:#ffebe9;border-color:#ff8182}
code{font-size:12px} header form{margin:0}
"""


def csrf_for(token: str) -> str:
    """The CSRF value bound to a console session's token."""
    return hmac.new(token.encode(), b"outbox-console-csrf", hashlib.sha256).hexdigest()[:32]


def _page(title: str, body: str, *, signed_in: bool = True, status: int = 200) -> HTMLResponse:
    nav = ('<a href="/console">Overview</a><form method="post" action="/console/logout">'
           '<button>Sign out</button></form>') if signed_in else ""
    return HTMLResponse(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)} · outbox</title>"
        f"<link rel='stylesheet' href='/console/style.css'></head>"
        f"<body><header><strong>outbox console</strong>{nav}</header>"
        f"<main><h1>{escape(title)}</h1>{body}</main></body></html>",
        status_code=status,
    )


def _status(value: str) -> str:
    return f"<span class='pill {escape(value)}'>{escape(value)}</span>"


def router(box: Callable[[Request], Outbox], authorize: Callable[[Request], Any]) -> APIRouter:
    """The console's routes, reading the outbox and the replay authority from the app."""
    pages = APIRouter(prefix="/console", include_in_schema=False, route_class=ConsoleRoute)

    async def session(request: Request) -> TokenInfo | None:
        token = request.cookies.get(COOKIE)
        if not token:
            return None
        info = await box(request).authenticate(token)
        return info if info is not None and info.role in (Role.OPERATOR, Role.ADMIN) else None

    async def form(request: Request) -> dict[str, str]:
        raw = (await request.body()).decode("utf-8", "replace")
        return {k: v[-1] for k, v in parse_qs(raw, keep_blank_values=True).items()}

    def to_login() -> Response:
        return RedirectResponse("/console/login", status_code=303)

    @pages.get("/style.css")
    async def style() -> Response:
        return Response(STYLE, media_type="text/css; charset=utf-8", headers={"Cache-Control": "max-age=3600"})

    @pages.get("/login")
    async def login_page(request: Request, error: str = "") -> Response:
        message = f"<p class='flash error'>{escape(error)}</p>" if error else ""
        return _page("Sign in", message + (
            "<form method='post' action='/console/login'><p><label>Operator or admin token<br>"
            "<input name='token' type='password' size='70' autofocus></label></p>"
            "<button type='submit'>Sign in</button></form>"), signed_in=False)

    @pages.post("/login")
    async def login(request: Request) -> Response:
        token = (await form(request)).get("token", "").strip()
        info = await box(request).authenticate(token) if token else None
        if info is None or info.role not in (Role.OPERATOR, Role.ADMIN):
            return RedirectResponse("/console/login?error=" + quote("that is not an operator or admin token"),
                                    status_code=303)
        response = RedirectResponse("/console", status_code=303)
        response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/console",
                            secure=secure_cookie(request))
        return response

    @pages.post("/logout")
    async def logout(request: Request) -> Response:
        response = to_login()
        response.delete_cookie(COOKIE, path="/console", secure=secure_cookie(request))
        return response

    @pages.get("")
    async def overview(request: Request, done: str = "") -> Response:
        if await session(request) is None:
            return to_login()
        outbox = box(request)
        counts: dict[str, int] = {}
        for status, _, n in await outbox.store.count_by_status():
            counts[status] = counts.get(status, 0) + n
        backlog = "".join(f"<tr><td>{_status(s.value)}</td><td>{counts.get(s.value, 0)}</td></tr>" for s in Status)
        sections = []
        for status, title in ((Status.DEAD, "Dead letters"), (Status.UNKNOWN, "Unknown outcomes"),
                              (Status.REVOKED, "Revoked"), (Status.HELD, "Held for approval")):
            page = await outbox.list_intents(IntentQuery(statuses=[status], limit=100))
            rows = "".join(
                f"<tr><td><a href='{escape(_intent_url(i.action_id, i.scope))}'>{escape(i.action_id)}</a></td>"
                f"<td>{escape(i.destination)}</td><td>{escape(i.scope)}</td><td>{i.attempts}</td>"
                f"<td>{escape(iso(i.updated_at) or '')}</td><td>{escape(i.last_error or '')}</td></tr>"
                for i in page.intents)
            more = " (first 100)" if page.next_seq else ""
            sections.append(
                f"<h2 id='{status.value}'>{title}{more}</h2><table><tr><th>action_id</th><th>destination</th>"
                f"<th>scope</th><th>attempts</th><th>since</th><th>last error</th></tr>"
                f"{rows or '<tr><td colspan=6>none</td></tr>'}</table>")
        flash = f"<p class='flash'>{escape(done)}</p>" if done else ""
        return _page("Overview", flash + f"<h2>Backlog</h2><table><tr><th>status</th><th>intents</th></tr>"
                                         f"{backlog}</table>" + "".join(sections))

    @pages.get("/intents/{action_id}")
    async def intent_page(request: Request, action_id: str, scope: str | None = None, done: str = "",
                          error: str = "") -> Response:
        who = await session(request)
        if who is None:
            return to_login()
        outbox = box(request)
        try:
            intent, history = await outbox.show(action_id, scope=scope)
            behind = await outbox.waiting_behind(intent)
        except (NotFound, OutboxError) as exc:
            return _page("Not found", f"<p>{escape(exc.message)}</p>", status=404)
        token = request.cookies[COOKIE]
        csrf = f"<input type='hidden' name='csrf' value='{csrf_for(token)}'>"
        def action(name: str, label: str, extra: str = "") -> str:
            target = escape(_intent_url(action_id, intent.scope, name))
            return (f"<form class='inline' method='post' action='{target}'>{csrf}{extra}"
                    f"<input name='reason' placeholder='reason' required size='28'> "
                    f"<button type='submit' name='action' value='{name}'>{label}</button></form>")

        actions = []
        if intent.status in operations.REPLAYABLE:
            actions.append(action("replay", "Replay", "<label><input type='checkbox' name='accept_duplicate_risk' "
                                                      "value='yes'> accept duplicate risk</label> "))
        if intent.status is Status.UNKNOWN:
            actions.append(action("resolve", "Resolve", "<select name='resolution'>" + "".join(
                f"<option>{r.value}</option>" for r in operations.Resolution) + "</select> "
                "<input name='external_id' placeholder='external id (evidence)' size='20'> "))
        if intent.status is Status.HELD:
            digest = f"<input type='hidden' name='payload_digest' value='{escape(intent.payload_digest)}'>"
            actions.append(action("approve", "Approve", digest))
            actions.append(action("reject", "Reject"))
        if intent.status in (Status.PENDING, Status.HELD, Status.REVOKED):
            actions.append(action("cancel", "Cancel"))
        attempts = "".join(
            f"<tr><td>{a.number}</td><td><code>{escape(a.attempt_id)}</code></td><td>{a.fence}</td>"
            f"<td>{escape(iso(a.started_at) or '')}</td><td>{escape(a.submission.value if a.submission else '')}</td>"
            f"<td>{escape(a.outcome.value if a.outcome else 'in flight')}</td><td>{escape(a.stage or '')}</td>"
            f"<td>{a.status_code or ''}</td>"
            f"<td>{escape(a.external_id or '')}</td><td>{a.duration_ms or ''}</td><td>{escape(a.error or '')}</td>"
            f"<td><code>{escape((a.reply or '')[:300])}</code></td></tr>" for a in history.attempts)
        events = "".join(
            f"<tr><td>{escape(iso(e.at) or '')}</td><td>{escape(e.kind.value)}</td><td>{escape(e.actor)}</td>"
            f"<td>{escape(e.reason or '')}</td><td><code>{escape(json.dumps(dict(e.data)) if e.data else '')}</code>"
            f"</td></tr>"
            for e in history.events)
        waiting = f"<p class='flash error'>waiting {_behind_link(behind, intent)}</p>" if behind else ""
        flash = (f"<p class='flash'>{escape(done)}</p>" if done else "") + (
            f"<p class='flash error'>{escape(error)}</p>" if error else "")
        return _page(f"Intent {action_id}", flash + (
            f"<p>{_status(intent.status.value)} to <b>{escape(intent.destination)}</b> for "
            f"<b>{escape(intent.scope)}</b> · attempts {intent.attempts}/{intent.max_attempts} · fence {intent.fence}"
            + (f" · next attempt {escape(iso(intent.next_attempt_at) or '')}" if intent.status is Status.PENDING
               else "") + "</p>"
            f"{waiting}"
            f"<p>payload <code>{escape(intent.payload_digest)}</code></p>"
            f"<pre>{escape(intent.payload_json[:4000])}</pre>"
            f"<p>last error: {escape(intent.last_error or '—')}</p>"
            f"<h2>Actions</h2>{''.join(actions) or '<p>none for this status</p>'}"
            f"<h2>Attempts</h2><table><tr><th>#</th><th>attempt_id</th><th>fence</th><th>started</th>"
            f"<th>submission</th><th>outcome</th><th>stage</th><th>status</th><th>external id</th><th>ms</th>"
            f"<th>error</th><th>reply</th></tr>{attempts or '<tr><td colspan=12>none</td></tr>'}</table>"
            f"<h2>Timeline</h2><table><tr><th>at</th><th>event</th><th>actor</th><th>reason</th><th>data</th></tr>"
            f"{events}</table>"))

    async def act(request: Request, action_id: str, scope: str | None, name: str,
                  run: Callable[[Outbox, operations.Actor, dict[str, str]], Awaitable[object]]) -> Response:
        who = await session(request)
        if who is None:
            return to_login()
        fields = await form(request)
        if not hmac.compare_digest(fields.get("csrf", ""), csrf_for(request.cookies[COOKIE])):
            return _page("Refused", "<p>the form is stale or was not sent from this console; reload and retry</p>",
                         status=403)
        try:
            await run(box(request), operations.Actor(who.actor, fields.get("reason", "")), fields)
        except OutboxError as exc:
            return RedirectResponse(_intent_url(action_id, scope, error=exc.message), status_code=303)
        return RedirectResponse(_intent_url(action_id, scope, done=name + " done"), status_code=303)

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
                raise OutboxError("choose delivered, retry or dead") from None
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

    return pages


def _behind_link(behind: Behind, intent: Intent) -> str:
    """"behind <action_id>", linking to the intent in the way."""
    text = escape(behind.text(intent))
    if behind.action_id is None:
        return text
    return f"<a href='{escape(_intent_url(behind.action_id, behind.scope))}'>{text}</a>"


def _intent_url(action_id: str, scope: str | None, action: str = "", **query: str) -> str:
    """An intent's console page (or one of its actions), naming its scope: action ids are unique
    per scope only."""
    path = f"/console/intents/{quote(action_id, safe='')}" + (f"/{action}" if action else "")
    params = ({"scope": scope} if scope else {}) | query
    return path + ("?" + urlencode(params) if params else "")
