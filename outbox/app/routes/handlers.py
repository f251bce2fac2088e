"""Every error the API answers, as RFC 9457 problem+json: the problems routes raise, the
outbox's own errors, invalid input, routing's 404 and 405, and anything unforeseen (500).

The unforeseen is answered by ``Faults``, around the app, not by an exception handler: Starlette
answers a handler's 500 and then raises the exception on to the server, which takes it for a
broken response and closes the connection, so the client's next request on it was reset."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...errors import OutboxError
from ..problems import Problem, from_error
from ..web import allowed_methods

log = logging.getLogger("outbox.api")


def validation_problem(errors: Sequence[Mapping[str, Any]]) -> Problem:
    """The 422 for pydantic's errors: each refused field, and the first five in the detail."""
    shown = [{"field": ".".join(str(part) for part in e["loc"]), "message": e["msg"]} for e in errors]
    detail = "; ".join(f"{e['field'] or 'body'}: {e['message']}" for e in shown[:5])
    return Problem(422, "invalid-input", "Invalid input", detail, errors=shown)


async def _problem(request: Request, exc: Problem) -> Response:
    return exc.response(request.url.path)


async def _outbox_error(request: Request, exc: OutboxError) -> Response:
    return from_error(exc).response(request.url.path)


async def _invalid(request: Request, exc: RequestValidationError) -> Response:
    # FastAPI's locations start with where the value was (body, query, path); a field may be
    # called that too (a file channel's "path"), so only that first part is dropped
    located = [{**e, "loc": tuple(e["loc"])[1:]} for e in exc.errors()]
    return validation_problem(located).response(request.url.path)


async def _http(request: Request, exc: HTTPException) -> Response:
    kinds = {404: "not-found", 405: "method-not-allowed"}
    detail = {
        404: f"there is no route {request.url.path}; see /docs",
        405: f"{request.method} is not allowed on {request.url.path}; see /docs",
    }.get(exc.status_code, str(exc.detail))
    problem = Problem(exc.status_code, kinds.get(exc.status_code, "http"), str(exc.detail), detail)
    problem.headers.update(exc.headers or {})
    if exc.status_code == 405:
        problem.headers["Allow"] = allowed_methods(request)
    return problem.response(request.url.path)


class Faults:
    """Answers an exception no handler took with a 500 problem, logged, and ends it there: the
    connection stays open for the client's next request. Once an answer has started, nothing
    can be said in its place, so the exception goes on to the server, which drops the connection
    (the client must not take half an answer for a whole one)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception:
            path = scope.get("path", "")
            log.exception("unhandled error on %s %s", scope.get("method"), path)
            if started:
                raise
            await Problem(500, "internal", "Internal error", "the server failed; the error is in its log"
                          ).response(path)(scope, receive, send)


def install(app: FastAPI) -> None:
    """Answer every error of ``app`` as problem+json."""
    app.exception_handler(Problem)(_problem)
    app.exception_handler(OutboxError)(_outbox_error)
    app.exception_handler(RequestValidationError)(_invalid)
    app.exception_handler(HTTPException)(_http)
    app.add_middleware(Faults)
