"""A scriptable webhook receiver: a pure-ASGI app run by a real uvicorn on 127.0.0.1 (port 0).

    receiver = Receiver().start()
    receiver.script("/hook", Reply(503), Reply(200, headers={"External-Id": "x"}))
    ...                                   # the sender POSTs to f"{receiver.url}/hook"
    receiver.requests("/hook")            # every request received there, in order
    receiver.stop()

Each path answers its scripted replies in order; once they run out the last one repeats. A
path may instead be given a function of the request returning a ``Reply``. Unscripted paths
answer 404. A reply can wait ``delay`` seconds, or until a ``Gate`` is opened, before answering;
both end early when the receiver stops, so teardown never waits on them.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .servers import Served


class Gate:
    """A reply waits until the test opens its gate (thread-safe; opened by ``stop`` too)."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def open(self) -> None:
        self._event.set()

    @property
    def is_open(self) -> bool:
        return self._event.is_set()


@dataclass(frozen=True)
class Reply:
    """One scripted answer."""

    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes | str | Any = b""  # bytes/str sent as is; anything else as JSON
    delay: float = 0.0  # seconds to wait before answering
    gate: Gate | None = None  # or: wait until this gate is opened
    #: Send the body in pieces (these bytes, in order), pausing ``chunk_pause`` between them.
    chunks: tuple[bytes, ...] | None = None
    chunk_pause: float = 0.05

    def encoded(self) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        headers = {k.lower(): v for k, v in self.headers.items()}
        if self.chunks is not None:
            body = b"".join(self.chunks)
        elif isinstance(self.body, bytes):
            body = self.body
        elif isinstance(self.body, str):
            body = self.body.encode()
        else:
            body = json.dumps(self.body).encode()
            headers.setdefault("content-type", "application/json")
        headers["content-length"] = str(len(body))
        return body, [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


@dataclass(frozen=True)
class Received:
    """One request as the receiver got it."""

    method: str
    path: str
    query: str
    headers: dict[str, str]  # lower-cased names; a repeated header's values joined with ", "
    raw_headers: list[tuple[str, str]]
    body: bytes
    at: float  # time.monotonic() when the body had been read

    def json(self) -> Any:
        return json.loads(self.body)


Handler = Callable[[Received], Reply]


class Receiver:
    """The ASGI app, its script and its record, and the uvicorn that serves it."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._scripts: dict[str, list[Reply] | Handler] = {}
        self._served: dict[str, int] = {}
        self._received: list[Received] = []
        self._stopping = threading.Event()
        self._uvicorn: Served | None = None
        self.port: int | None = None

    # -- scripting and inspecting (from the test's thread) ---------------------------------

    def script(self, path: str, *replies: Reply | Handler) -> None:
        """Answer ``path`` with these replies in order (the last repeats), or with a handler."""
        if len(replies) == 1 and callable(replies[0]) and not isinstance(replies[0], Reply):
            scripted: list[Reply] | Handler = replies[0]
        else:
            if not replies or not all(isinstance(r, Reply) for r in replies):
                raise ValueError("script a path with one or more Reply, or with one handler")
            scripted = list(replies)  # type: ignore[arg-type]
        with self._lock:
            self._scripts[path] = scripted
            self._served[path] = 0

    def requests(self, path: str | None = None) -> list[Received]:
        """A copy of what was received (at ``path``, or everywhere), oldest first."""
        with self._lock:
            return [r for r in self._received if path is None or r.path == path]

    def wait_for_requests_blocking(self, count: int, path: str | None = None,
                                   timeout: float = 10.0) -> list[Received]:
        """Block until at least ``count`` requests arrived (at ``path``); raises on timeout."""
        with self._lock:
            ok = self._lock.wait_for(
                lambda: len([r for r in self._received if path is None or r.path == path]) >= count,
                timeout,
            )
            got = [r for r in self._received if path is None or r.path == path]
        if not ok:
            raise TimeoutError(f"expected {count} requests at {path or 'any path'}, got {len(got)}")
        return got

    async def wait_for_requests(self, count: int, path: str | None = None,
                                timeout: float = 10.0) -> list[Received]:
        """As ``wait_for_requests_blocking``, without blocking the caller's event loop."""
        return await asyncio.to_thread(self.wait_for_requests_blocking, count, path, timeout)

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the receiver is not running")
        return f"http://127.0.0.1:{self.port}"

    # -- the ASGI app (on uvicorn's thread) -------------------------------------------------

    def _next_reply(self, request: Received) -> Reply:
        with self._lock:
            scripted = self._scripts.get(request.path)
            if scripted is None:
                return Reply(404, body={"error": f"nothing scripted at {request.path}"})
            if callable(scripted):
                handler = scripted
            else:
                index = min(self._served[request.path], len(scripted) - 1)
                self._served[request.path] += 1
                return scripted[index]
        return handler(request)

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any],
                       send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        headers: dict[str, str] = {}
        for name, value in raw:
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        request = Received(
            method=scope["method"], path=scope["path"], query=scope["query_string"].decode("latin-1"),
            headers=headers, raw_headers=raw, body=b"".join(chunks), at=time.monotonic(),
        )
        try:
            reply = self._next_reply(request)
        except Exception as exc:  # a broken handler is a test bug: answer it visibly
            reply = Reply(599, body={"error": repr(exc)})
        with self._lock:
            self._received.append(request)
            self._lock.notify_all()
        await self._hold(reply)
        body, response_headers = reply.encoded()
        await send({"type": "http.response.start", "status": reply.status, "headers": response_headers})
        if reply.chunks is None:
            await send({"type": "http.response.body", "body": body})
            return
        for index, chunk in enumerate(reply.chunks):
            if index:
                await self._pause(reply.chunk_pause)
            await send({"type": "http.response.body", "body": chunk,
                        "more_body": index < len(reply.chunks) - 1})

    async def _pause(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._stopping.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)

    async def _hold(self, reply: Reply) -> None:
        deadline = time.monotonic() + reply.delay
        while not self._stopping.is_set():
            if reply.gate is not None:
                if reply.gate.is_open:
                    return
            elif time.monotonic() >= deadline:
                return
            await asyncio.sleep(0.005)

    # -- running ------------------------------------------------------------------------------

    def start(self) -> Receiver:
        """Serve on 127.0.0.1 at a free port, in a background thread; returns once listening."""
        self._uvicorn = Served(self, lifespan="off", timeout_graceful_shutdown=2)
        self.port = self._uvicorn.port
        return self

    def stop(self) -> None:
        """Release every waiting reply and stop uvicorn."""
        self._stopping.set()
        if self._uvicorn is not None:
            self._uvicorn.stop()

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
