"""``IdempotencyMiddleware`` for WSGI apps (Flask, Django): the same contract as the ASGI one.

    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, store=SqliteRecordStore("idempotency.db"), secrets="whsec_...")

The record store is async; it runs on one background event loop owned by the middleware. The
handler reads ``environ["idempotency"]``, an ``IdempotencyContext(scope, key, epoch)``. Each
request the contract covers is a SERVER span (``receivers.tracing``), current while the app is
called (a pass-through app's lazy body is produced after it ended).
WSGI servers merge repeated headers into one, so a repeated Idempotency-Key is seen as one value.
"""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import Callable, Coroutine, Iterable
from http import HTTPStatus
from typing import Any, TypeVar

from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, Span

from . import tracing
from .engine import Answer, Idempotency, Request, Run, problem
from .records import RecordStore
from .wire import Problem

T = TypeVar("T")
StartResponse = Callable[..., Any]


def _status_line(status: int) -> str:
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} Unknown"


class IdempotencyMiddleware:
    """At-least-once requests in, at-most-once effects out, for a WSGI app."""

    def __init__(self, app: Callable[..., Iterable[bytes]], store: RecordStore, **options: Any) -> None:
        """``options`` are those of ``receivers.engine.Idempotency``."""
        self.app = app
        self.idempotency = Idempotency(store, **options)
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="idempotency-store", daemon=True).start()

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def close(self) -> None:
        """Close the store and stop the background loop."""
        self._call(self.idempotency.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        headers = [(name[5:].replace("_", "-").lower(), value) for name, value in environ.items()
                   if name.startswith("HTTP_")]
        for name in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            if environ.get(name):
                headers.append((name.replace("_", "-").lower(), environ[name]))
        request = Request(environ["REQUEST_METHOD"], environ.get("PATH_INFO", "") or "/",
                          environ.get("QUERY_STRING", ""), headers)
        if not self.idempotency.applies(request):
            return self.app(environ, start_response)
        if not tracing.recording(self.idempotency.tracer_provider):
            return self._handle(request, environ, start_response, INVALID_SPAN)
        span = tracing.server_span(self.idempotency.tracer, request.method, request.path,
                                   environ.get("wsgi.url_scheme", "http"), headers)
        with trace.use_span(span, end_on_exit=True):
            return self._handle(request, environ, _reporting(span, start_response), span)

    def _handle(self, request: Request, environ: dict[str, Any], start_response: StartResponse,
                span: Span) -> Iterable[bytes]:
        declared = (environ.get("CONTENT_LENGTH") or "0").strip()
        if not (declared.isascii() and declared.isdigit()):
            return _answer(start_response, problem(400, Problem.MALFORMED_CONTENT_LENGTH, "Malformed Content-Length",
                                                   "Content-Length must be a non-negative integer"))
        length = int(declared)
        if length > self.idempotency.max_body_bytes:
            return _answer(start_response, self.idempotency.too_large(length))
        body = environ["wsgi.input"].read(length) if length else b""
        decision = self._call(self.idempotency.begin(request, body, span))
        environ["wsgi.input"] = io.BytesIO(body)
        if decision is None:
            return self.app(environ, start_response)
        if isinstance(decision, Answer):
            return _answer(start_response, decision)
        return self._run(decision, environ, start_response)

    def _run(self, run: Run, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        """Run the app and record its response before returning it (the response is buffered, so
        the record is complete by the time the client has the answer)."""
        environ["idempotency"] = run.context
        seen: dict[str, Any] = {}

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            seen["status"], seen["headers"] = int(status.split(" ", 1)[0]), headers
            return start_response(status, headers, exc_info)

        try:
            result = self.app(environ, capture)
            try:
                chunks = list(result)
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
        except BaseException:
            self._call(self.idempotency.finish(run, None, seen.get("headers", []), None))
            raise
        body = b"".join(chunks)
        stored = body if len(body) <= self.idempotency.max_stored_bytes else None
        self._call(self.idempotency.finish(run, seen.get("status"), seen.get("headers", []), stored))
        return chunks


def _reporting(span: Span, start_response: StartResponse) -> StartResponse:
    """A ``start_response`` that tells the request's span the status it answers."""

    def report(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        tracing.responded(span, int(status.split(" ", 1)[0]))
        return start_response(status, headers, exc_info)

    return report


def _answer(start_response: StartResponse, answer: Answer) -> list[bytes]:
    start_response(_status_line(answer.status),
                   [*answer.headers, ("content-length", str(len(answer.body)))])
    return [answer.body]
