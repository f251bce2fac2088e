"""What every answer under ``/console`` is, whoever makes it: ``Guard``, a pure-ASGI middleware
around the whole app (the shape of Starlette's ``TrustedHostMiddleware``).

- Every answer carries ``web.CONSOLE_HEADERS`` (no framing, no Referer, no script, nothing
  sniffed), the errors too: routing's 404 and 405, a refused form, an unforeseen 500.
- An error answered as problem+json (the API's form, which names the path) becomes a console
  page saying the same, every value escaped, with the headers it had (``Allow``).
- A request that would change something (any method but GET, HEAD and OPTIONS) sent by another
  site's page (``sessions.cross_site``) is refused with 403 before any route reads it: no
  sign-in, sign-out or action is made for a page elsewhere, whatever it holds.
"""

from __future__ import annotations

import json

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..problems import MEDIA_TYPE as PROBLEM
from ..web import CONSOLE_HEADERS
from .layout import page
from .sessions import PATH, cross_site

#: Methods that change nothing, which any page may send (a link, an image).
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: A problem's headers that stay on the page made of it.
KEPT = ("allow", "retry-after", "www-authenticate")


def under_console(path: str) -> bool:
    return path == PATH or path.startswith(PATH + "/")


class Guard:
    """Hardens every answer under ``/console`` and refuses cross-site changes there (see the module)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not under_console(scope["path"]):
            await self.app(scope, receive, send)
            return

        async def hardened(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message).update(CONSOLE_HEADERS)
            await send(message)

        if scope["method"] not in SAFE_METHODS and cross_site(Headers(scope=scope)):
            refusal = page("cross_site.html", "Refused", status=403)
            await refusal(scope, receive, hardened)
            return

        problem: Message | None = None
        body = bytearray()

        async def answering(message: Message) -> None:
            nonlocal problem
            if message["type"] == "http.response.start":
                if Headers(raw=message["headers"]).get("content-type", "").startswith(PROBLEM):
                    problem = message  # drawn as a page once its whole body is here
                    return
            elif message["type"] == "http.response.body" and problem is not None:
                body.extend(message.get("body", b""))
                if message.get("more_body", False):
                    return
                await _as_page(problem, bytes(body))(scope, receive, hardened)
                return
            await hardened(message)

        await self.app(scope, receive, answering)


def _as_page(start: Message, body: bytes) -> ASGIApp:
    """A problem answer (its start message and body) as a console page of the same status."""
    try:
        found = json.loads(body)
        title, detail = str(found.get("title") or "Error"), str(found.get("detail") or "")
    except (ValueError, AttributeError):
        title, detail = "Error", ""
    answer = page("problem.html", title, detail=detail, status=start["status"])
    original = Headers(raw=start["headers"])
    for name in KEPT:
        if name in original:
            answer.headers[name] = original[name]
    return answer
