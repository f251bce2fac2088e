"""HTTP details the API and the console share: the methods a path allows, ``HEAD`` wherever
``GET`` works, and the headers that keep the console's pages from being framed, leaking their
URLs or running injected code (``console.Guard`` sends them with every answer under ``/console``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import fastapi.routing
from fastapi import Request
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Sent with every console answer. The pages load only their own stylesheet and post their
#: forms only to themselves; no script runs on them.
CONSOLE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}


def allowed_methods(request: Request) -> str:
    """Every method the request's path answers, for a 405's ``Allow`` (Starlette names only
    those of the first route matching the path, and FastAPI makes one route per method)."""
    methods: set[str] = set()
    for route in routes(request.app.router):
        route_methods = getattr(route, "methods", None)
        if route_methods and route.matches(request.scope)[0] is not Match.NONE:
            methods |= route_methods
    return ", ".join(sorted(methods))


def routes(router: Any) -> Iterable[Any]:
    """``router``'s routes, with those of the routers it includes: recent FastAPI (0.165) keeps
    an included router as one route, whose routes ``iter_route_contexts`` yields; earlier
    releases copied them into the app."""
    flatten = getattr(fastapi.routing, "iter_route_contexts", None)
    return router.routes if flatten is None else flatten(router.routes)


def matched(router: Any, scope: Scope) -> Any | None:
    """The route of ``router`` that answers ``scope`` whole (its path and its method), or None."""
    return next((route for route in routes(router) if route.matches(scope)[0] is Match.FULL), None)


class Head:
    """Answers ``HEAD`` wherever ``GET`` is answered, as RFC 9110 (section 9.3.2) asks: the
    ``GET`` answer's status and headers, without its body (FastAPI makes a route per method,
    and none for ``HEAD``). Where no ``GET`` route matches, ``HEAD`` goes on as it came (405)."""

    def __init__(self, app: ASGIApp, *, router: Any) -> None:
        self.app = app
        self.router = router

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        as_get = {**scope, "method": "GET"}  # a copy: the server's own scope still says HEAD
        if matched(self.router, as_get) is None:
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app(as_get, receive, headers_only)
