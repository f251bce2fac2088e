"""Signing in and out of the console: an operator's or admin's token opens a server-side
session whose id (never the token) is the cookie; the sign-in form carries a value of its own
cookie, so another site's form cannot sign an operator in, and sign-out is a form of the session's."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from ...model import Role
from . import sessions
from .access import Access, sent, to_login
from .layout import page
from .sessions import session_id

#: Why sign-in was refused, by the code its URL carries (``?error=refused``): only these words
#: are ever shown, so a link anyone can make puts no text of its own on the page.
SIGN_IN_REFUSED = {"refused": "that is not an operator or admin token"}


def register(pages: APIRouter, access: Access) -> None:
    """Add the sign-in page and the sign-in and sign-out forms' routes to the console's router."""

    def login_form(request: Request, error: str = "", status: int = 200) -> HTMLResponse:
        """The sign-in page, its form bound to a new value of the sign-in form's cookie."""
        value = sessions.new_login_value()
        response = page("signin.html", "Sign in", error=error, value=value, status=status)
        sessions.login_form(response, request, value)
        return response

    @pages.get("/login")
    async def login_page(request: Request, error: str = "") -> Response:
        return login_form(request, SIGN_IN_REFUSED.get(error, ""))

    @pages.post("/login")
    async def login(request: Request) -> Response:
        """Open a session for an operator's or admin's token, sent with the sign-in form this
        browser was given (another site's form has not its value); the session it had ends."""
        fields = await access.form(request)
        if not sessions.matches(sent(fields, "csrf"), request.cookies.get(sessions.LOGIN_COOKIE, "")):
            return login_form(request, "the sign-in form was stale or not sent from this console: sign in again",
                              status=403)
        outbox = access.box(request)
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
        if await access.session(request) is not None:
            if (refused := access.forged(request, await access.form(request))) is not None:
                return refused
            await access.box(request).close_console_session(session_id(request))
        response = to_login()
        sessions.end_session(response, request)
        return response
