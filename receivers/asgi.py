"""``IdempotencyMiddleware`` for any ASGI app (Starlette, FastAPI, plain ASGI): no framework needed.

    app = IdempotencyMiddleware(app, store=SqliteRecordStore("idempotency.db"), secrets="whsec_...")

The handler reads ``scope["state"]["idempotency"]`` (Starlette: ``request.state.idempotency``),
an ``IdempotencyContext(scope, key, epoch)``, to fence its own downstream effects. Each request
the contract covers is a SERVER span (``receivers.tracing``), current while the handler runs.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, Span

from . import tracing
from .engine import Answer, Idempotency, Request, Run
from .records import RecordStore

Scope = dict[str, Any]
Message = dict[str, Any]


class IdempotencyMiddleware:
    """At-least-once requests in, at-most-once effects out: the contract of ``receivers.engine``."""

    def __init__(self, app: Any, store: RecordStore, **options: Any) -> None:
        """``options`` are those of ``receivers.engine.Idempotency`` (secrets, scope_resolver,
        methods, required, retention_seconds, lease_seconds, max_body_bytes, max_stored_bytes,
        max_json_depth, signature_tolerance_seconds, release_statuses, clock, tracer_provider)."""
        self.app = app
        self.idempotency = Idempotency(store, **options)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, self._closing_on_shutdown(send))
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(
            method=scope["method"],
            path=scope["path"],
            query=scope.get("query_string", b"").decode("latin-1"),
            headers=[(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"]],
        )
        if not self.idempotency.applies(request):
            await self.app(scope, receive, send)
            return
        if not tracing.recording(self.idempotency.tracer_provider):
            await self._handle(request, scope, receive, send, INVALID_SPAN)
            return
        span = tracing.server_span(self.idempotency.tracer, request.method, request.path, scope.get("scheme", "http"),
                                   request.headers)
        with trace.use_span(span, end_on_exit=True):
            await self._handle(request, scope, receive, _reporting(span, send), span)

    async def _handle(self, request: Request, scope: Scope, receive: Any, send: Any, span: Span) -> None:
        declared = request.values("content-length")
        if (declared and declared[0].isascii() and declared[0].isdigit()  # "²".isdigit() too
                and int(declared[0]) > self.idempotency.max_body_bytes):
            await _answer(send, self.idempotency.too_large(int(declared[0])))
            return
        try:
            body = await read_body(receive, self.idempotency.max_body_bytes)
        except ClientGone:
            return  # nothing to claim: the request never fully arrived
        if body is None:
            await _answer(send, self.idempotency.too_large(self.idempotency.max_body_bytes + 1))
            return
        decision = await self.idempotency.begin(request, body, span)
        if decision is None:
            await self.app(scope, replaying(body, receive), send)
        elif isinstance(decision, Answer):
            await _answer(send, decision)
        else:
            await self._run(decision, scope, body, receive, send)

    def _closing_on_shutdown(self, send: Any) -> Any:
        """Close the store (and stop purging) when the server shuts the app down."""

        async def forward(message: Message) -> None:
            if message["type"] == "lifespan.shutdown.complete":
                await self.idempotency.aclose()
            await send(message)

        return forward

    async def _run(self, run: Run, scope: Scope, body: bytes, receive: Any, send: Any) -> None:
        scope = {**scope, "state": {**scope.get("state", {}), "idempotency": run.context}}
        status: int | None = None
        headers: list[tuple[str, str]] = []
        chunks: list[bytes] | None = []
        size = 0
        finished = False

        async def capture(message: Message) -> None:
            nonlocal status, headers, chunks, size, finished
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in message.get("headers", [])]
            elif message["type"] == "http.response.body" and chunks is not None:
                size += len(message.get("body", b""))
                if size > self.idempotency.max_stored_bytes:
                    chunks = None  # completed without a stored body
                else:
                    chunks.append(message.get("body", b""))
            last = message["type"] == "http.response.body" and not message.get("more_body")
            try:
                await send(message)
            finally:
                if last and not finished:
                    # Recorded once the answer is out (even if the client has gone: the handler is
                    # done), so the client does not wait for a second commit; a retry in that
                    # instant is told "in progress", then gets the replay.
                    finished = True
                    await self.idempotency.finish(run, status, headers,
                                                  None if chunks is None else b"".join(chunks))

        try:
            await self.app(scope, replaying(body, receive), capture)
        except BaseException:
            if not finished:
                await self.idempotency.finish(run, None, headers, None)
            raise
        if not finished:  # the app returned without completing a response
            await self.idempotency.finish(run, None, headers, None)


class ClientGone(Exception):
    """The client disconnected before its request body was complete."""


async def read_body(receive: Any, limit: int) -> bytes | None:
    """The whole request body, or None once it exceeds ``limit``. Raises ClientGone. (The
    outbox's API reads its bodies with it too.)"""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            break
    return b"".join(chunks)


def _reporting(span: Span, send: Any) -> Any:
    """A ``send`` that tells the request's span the status it answers."""

    async def report(message: Message) -> None:
        if message["type"] == "http.response.start":
            tracing.responded(span, message["status"])
        await send(message)

    return report


def replaying(body: bytes, receive: Any) -> Any:
    """A ``receive`` that hands the app the body already read, then defers to the real one."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _answer(send: Any, answer: Answer) -> None:
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in answer.headers]
    headers.append((b"content-length", str(len(answer.body)).encode()))
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": answer.body})
