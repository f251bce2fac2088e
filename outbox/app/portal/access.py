"""Who is in the tenant portal, and what every answer under ``/portal`` carries.

**The session.** A link (``outbox.portal``) opens a session once; the cookie ``COOKIE`` holds
the session's random id (the store keeps its SHA-256), HttpOnly, limited to ``/portal``, lasting
as long as the session, ``Secure`` over TLS (``console.sessions.secure``). It is SameSite=Lax:
the user arrives by a link from your application's pages, another site, and a Strict cookie set
on that navigation would not come back on the redirect that follows it. When the portal may be
framed (``portal_frame_ancestors``) and the request came over TLS it is SameSite=None, so that
the frame in your page sends it.

**Signing out** (a form on every page, a read-only session's too) ends the session in the store,
so its cookie opens nothing even if kept, and drops the cookie.

**Forms** carry ``console.sessions.csrf_for`` the session id, as the console's do, and every
request that changes something must come from the portal's own origin (``Guard``); a read-only
session is shown no forms, and its posts are refused.
"""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import HTMLResponse, Response
from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...outbox import Outbox
from ...portal import PortalSession
from ...settings import Settings
from ..console import sessions
from ..console.access import Access
from ..console.guard import SAFE_METHODS
from ..console.templates import render

COOKIE = "outbox_portal"
PATH = "/portal"


def box(request: Request) -> Outbox:
    return request.app.state.outbox


def headers(settings: Settings) -> dict[str, str]:
    """What every portal answer carries: only its own stylesheet (and the logo's origin's
    images), forms posted to itself, no script, framed only by ``portal_frame_ancestors``."""
    images = "'self'" + (f" {_origin(settings.portal_logo_url)}" if settings.portal_logo_url else "")
    ancestors = " ".join(settings.portal_frame_ancestors) or "'none'"
    found = {
        "Content-Security-Policy": (f"default-src 'none'; style-src 'self'; img-src {images}; form-action 'self'; "
                                    f"frame-ancestors {ancestors}; base-uri 'none'"),
        "Referrer-Policy": "no-referrer",
        "X-Content-Type-Options": "nosniff",
        "Cache-Control": "no-store",
    }
    if not settings.portal_frame_ancestors:
        found["X-Frame-Options"] = "DENY"
    return found


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


class Guard:
    """Every answer under ``/portal`` carries ``headers``; a request that would change something
    sent by another site's page (``sessions.cross_site``) is refused before any route reads it."""

    def __init__(self, app: ASGIApp, *, settings: Settings) -> None:
        self.app = app
        self.headers = headers(settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path == PATH or path.startswith(PATH + "/")):
            await self.app(scope, receive, send)
            return

        async def hardened(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message).update(self.headers)
            await send(message)

        if scope["method"] not in SAFE_METHODS and sessions.cross_site(Headers(scope=scope)):
            await HTMLResponse(render("portal/cross_site.html"), status_code=403)(scope, receive, hardened)
            return
        await self.app(scope, receive, hardened)


async def session(request: Request) -> PortalSession | None:
    """The request's open portal session, or None."""
    opened = request.cookies.get(COOKIE, "")
    return await box(request).portal_session(opened) if opened else None


def csrf(request: Request) -> str:
    """The CSRF value of the request's session, which its forms carry."""
    return sessions.csrf_for(request.cookies.get(COOKIE, ""))


async def form(request: Request) -> dict[str, list[str]]:
    """The form ``request`` sends, bounded as the console's are."""
    return await Access.form(request)


def forged(request: Request, fields: dict[str, list[str]]) -> bool:
    """Whether a form lacks this session's CSRF value."""
    return not sessions.matches(fields.get("csrf", [""])[-1], csrf(request))


def same_site(request: Request) -> Literal["lax", "none"]:
    return "none" if box(request).settings.portal_frame_ancestors and sessions.secure(request) else "lax"


def open_session(response: Response, request: Request, session_id: str, opened: PortalSession) -> None:
    """Set the session cookie, for as long as the session lasts."""
    seconds = (opened.expires_at - box(request).clock.now()).total_seconds()
    response.set_cookie(COOKIE, session_id, max_age=max(int(seconds), 1), path=PATH, secure=sessions.secure(request),
                        httponly=True, samesite=same_site(request))


def end_session(response: Response, request: Request) -> None:
    """Drop the session cookie (the same attributes it was set with, so the browser drops it)."""
    response.delete_cookie(COOKIE, path=PATH, secure=sessions.secure(request), httponly=True,
                           samesite=same_site(request))


def page(request: Request, template: str, title: str, opened: PortalSession | None, *, status: int = 200,
         **values: Any) -> HTMLResponse:
    """A portal page: ``template`` in the branded frame, its forms bound to the session's CSRF
    value, or none of them for a read-only session."""
    settings = box(request).settings
    brand = {"name": settings.portal_name, "logo": settings.portal_logo_url}
    writable = opened is not None and not opened.read_only
    return HTMLResponse(render(template, title=title, brand=brand, session=opened, writable=writable,
                               csrf=csrf(request), **values), status_code=status)
