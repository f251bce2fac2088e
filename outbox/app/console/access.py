"""Who may see and send the console's pages: the signed-in operator's session, the CSRF value
every form carries (``sessions`` says how), the bounded reading of a form, and the filter page
that several views share. One ``Access`` per console, asked by its pages and actions."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from functools import wraps
from typing import Any, ParamSpec
from urllib.parse import parse_qs

from fastapi import Request
from fastapi.responses import RedirectResponse, Response

from ...errors import OutboxError
from ...model import Role, Status
from ...outbox import Outbox
from ...tokens import TokenInfo
from ..problems import Problem
from . import sessions
from .filters import Filter
from .sessions import csrf_for, session_id, signed_page

#: The largest console form read (they hold a few short fields); a larger body is a 413, unread.
FORM_BYTES = 64 * 1024

P = ParamSpec("P")


def sent(fields: dict[str, list[str]], name: str) -> str:
    """The last value of ``name`` in a parsed form ("" when it has none)."""
    return fields.get(name, [""])[-1]


def to_login() -> Response:
    return RedirectResponse("/console/login", status_code=303)


class Access:
    """The console's guard over ``box``, the outbox its pages read (from the app)."""

    def __init__(self, box: Callable[[Request], Outbox]) -> None:
        self.box = box

    async def session(self, request: Request) -> TokenInfo | None:
        """The operator's or admin's token of the request's open session, or None."""
        opened = session_id(request)
        if not opened:
            return None
        info = await self.box(request).console_session(opened)
        return info if info is not None and info.role in (Role.OPERATOR, Role.ADMIN) else None

    @staticmethod
    async def form(request: Request) -> dict[str, list[str]]:
        """The form ``request`` sends, read up to FORM_BYTES (past it, 413, the rest unread)."""
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > FORM_BYTES:
                raise Problem(413, "payload-too-large", "Form too large",
                              f"a console form is at most {FORM_BYTES} bytes")
        return parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)

    @staticmethod
    def forged(request: Request, fields: dict[str, list[str]]) -> Response | None:
        """A refusal unless the form carries this session's CSRF value."""
        if sessions.matches(sent(fields, "csrf"), csrf_for(session_id(request))):
            return None
        return signed_page(request, "message.html", "Refused", status=403,
                           message="the form is stale or was not sent from this console; reload and retry")

    def signed_in(self, view: Callable[P, Awaitable[Response]]) -> Callable[P, Awaitable[Response]]:
        """A page only a signed-in operator sees; anyone else is sent to sign in."""

        @wraps(view)
        async def guarded(*args: P.args, **kwargs: P.kwargs) -> Response:
            request: Any = kwargs["request"]  # FastAPI passes every parameter by name
            if await self.session(request) is None:
                return to_login()
            return await view(*args, **kwargs)

        return guarded

    async def signed_form(self, request: Request) -> tuple[TokenInfo, dict[str, list[str]]] | Response:
        """Who sent a console form and its fields, or the answer instead: to sign in, or a refusal
        of a form without this session's CSRF value."""
        who = await self.session(request)
        if who is None:
            return to_login()
        raw = await self.form(request)
        if (refused := self.forged(request, raw)) is not None:
            return refused
        return who, raw

    async def filtered(self, request: Request, title: str, template: str, action: str,
                       find: Callable[[Outbox, datetime, Filter], Awaitable[dict[str, Any]]]) -> Response:
        """A page of the filter form (``templates/filtered.html``, sent to ``action``) over what
        ``template`` draws of what ``find`` finds with the filter it chose; a filter or a query
        the outbox refuses answers 400 with the form and its message."""
        outbox = self.box(request)
        now = outbox.clock.now()
        form = {"chosen": Filter(), "destinations": [d.id for d in await outbox.list_destinations()],
                "action": action, "statuses": [s.value for s in Status], "now": now}
        try:
            form["chosen"] = chosen = Filter.parse(request.query_params, now)
            found = await find(outbox, now, chosen)
        except OutboxError as exc:
            return signed_page(request, template, title, status=400, error=exc.message, **form)
        return signed_page(request, template, title, error="", **form, **found)
