"""Who is signed in to the console, and whether a form came from the console itself.

**The session.** Signing in opens a server-side session (``Outbox.open_console_session``): the
cookie ``COOKIE`` holds its random id, never the API token, and the store keeps only the id's
SHA-256, the token it was opened with and when it ends (``console_session_seconds``). Each
request reads it joined to the token, so signing out, the expiry and revoking the token each end
it at once. The cookie is HttpOnly, SameSite=Strict, limited to ``/console``, lasts as long as
the session, and is ``Secure`` whenever the request reached the server over TLS (``secure``).

**Forms.** A signed-in page's forms carry ``csrf_for`` the session id, which only the session's
own pages know. The sign-in form, before there is a session, carries a random value also set in
a short-lived cookie of its own (``LOGIN_COOKIE``), compared in constant time: another site can
neither read it nor set it, so it cannot sign an operator's browser in with a token of its own.
Every request that changes something under ``/console`` must also come from the console's own
origin (``cross_site``, checked for all of them by ``guard.Guard``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import HTMLResponse, Response

from .layout import page

COOKIE = "outbox_console"
#: The sign-in form's own cookie, holding the value its hidden field echoes.
LOGIN_COOKIE = "outbox_console_login"
#: How long a sign-in form may stay open before it is stale.
LOGIN_FORM_SECONDS = 3600
PATH = "/console"
#: What ``Sec-Fetch-Site`` says of a request the console's own pages sent, or one the user made
#: by hand (typing an address, a bookmark): never another site's, not even a sibling subdomain's.
OWN_SITE = frozenset({"same-origin", "none"})


def csrf_for(session_id: str) -> str:
    """The CSRF value bound to a console session."""
    return hmac.new(session_id.encode(), b"outbox-console-csrf", hashlib.sha256).hexdigest()[:32]


def session_id(request: Request) -> str:
    """The session id the request's cookie holds ("" without one)."""
    return request.cookies.get(COOKIE, "")


def matches(sent: str, expected: str) -> bool:
    """Whether a form's value is the one expected, compared in constant time (none never matches)."""
    return bool(expected) and hmac.compare_digest(sent.encode(), expected.encode())


def signed_page(request: Request, template: str, title: str, **options: Any) -> HTMLResponse:
    """A page for the signed-in operator (``layout.page``'s options): its forms, and its header's
    sign-out form, carry the session's CSRF value (``csrf``)."""
    return page(template, title, csrf=csrf_for(session_id(request)), **options)


def secure(request: Request) -> bool:
    """Whether a cookie set in answer to ``request`` must be ``Secure``: it came over TLS, as the
    server saw it (uvicorn's own TLS, or a trusted proxy's ``X-Forwarded-Proto``, which ``outbox
    serve`` takes only from the peers ``forwarded_allow_ips`` names)."""
    return request.url.scheme == "https"


def open_session(response: Response, request: Request, session: str, seconds: float) -> None:
    """Set the session cookie, and drop the sign-in form's."""
    response.set_cookie(COOKIE, session, max_age=int(seconds), path=PATH, secure=secure(request),
                        httponly=True, samesite="strict")
    response.delete_cookie(LOGIN_COOKIE, path=PATH, secure=secure(request), httponly=True, samesite="strict")


def end_session(response: Response, request: Request) -> None:
    """Drop the session cookie."""
    response.delete_cookie(COOKIE, path=PATH, secure=secure(request), httponly=True, samesite="strict")


def login_form(response: Response, request: Request, value: str) -> None:
    """Set the sign-in form's cookie to ``value``, the value of the form's hidden field."""
    response.set_cookie(LOGIN_COOKIE, value, max_age=LOGIN_FORM_SECONDS, path=PATH, secure=secure(request),
                        httponly=True, samesite="strict")


def new_login_value() -> str:
    return secrets.token_urlsafe(32)


def cross_site(headers: Mapping[str, str]) -> bool:
    """Whether a request was sent by a page of another origin (as Go's ``CrossOriginProtection``
    judges it). Browsers say so in ``Sec-Fetch-Site``, which no page can set; older ones send
    ``Origin``, which must then name the host the request was sent to. A request with neither is
    not from a browser's page (a script, curl), which has no cookie of an operator to borrow."""
    site = headers.get("sec-fetch-site")
    if site is not None:
        return site.strip().lower() not in OWN_SITE
    origin = headers.get("origin")
    if origin is None:
        return False
    try:
        sent_from = urlsplit(origin.strip())
    except ValueError:
        return True
    host = headers.get("host", "")
    return sent_from.scheme not in ("http", "https") or not host or sent_from.netloc.lower() != host.strip().lower()
