"""A fault-injecting HTTP/1.1 proxy on loopback, between the sender and a receiver.

Each connection carries one request (the proxy asks both sides for ``Connection: close``, so no
connection is reused behind its mode's back) and gets one mode, from a scripted list or drawn
from a seeded ``random.Random``:

- ``pass``: forwarded both ways.
- ``refuse``: reset on accept, and the port stops listening for ``refuse_seconds`` (connects in
  that window are refused).
- ``reset_before``: the request is read, then the connection reset; the receiver never sees it.
- ``reset_after``: the receiver processes the request and answers; the answer is dropped and the
  connection reset.
- ``late``: the answer is held ``late_seconds`` (beyond the client's timeout), then sent.
- ``headers_close``: the status line and headers are sent, then the connection closed before the
  body.
- ``drip``: the answer is sent ``drip_bytes`` at a time, ``drip_pause`` apart.

The proxy runs its own event loop in a thread, so the test's loop (and the sender in it) never
waits on it.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Coroutine, Sequence
from concurrent.futures import Future
from typing import Any

MODES = ("pass", "refuse", "reset_before", "reset_after", "late", "headers_close", "drip")


class Proxy:
    """Forwards ``127.0.0.1:port`` to ``upstream_port``, injecting one fault mode per connection."""

    def __init__(self, upstream_port: int, *, rng: random.Random | None = None,
                 script: Sequence[str] = (), weights: dict[str, float] | None = None,
                 late_seconds: float = 2.5, refuse_seconds: float = 0.2,
                 drip_bytes: int = 16, drip_pause: float = 0.01) -> None:
        unknown = (set(script) | set(weights or {})) - set(MODES)
        if unknown:
            raise ValueError(f"unknown proxy modes: {sorted(unknown)}")
        self.upstream_port = upstream_port
        self.rng = rng or random.Random(0)
        self.script = list(script)
        self.weights = weights or dict.fromkeys(MODES, 1.0)
        self.late_seconds = late_seconds
        self.refuse_seconds = refuse_seconds
        self.drip_bytes = drip_bytes
        self.drip_pause = drip_pause
        #: How many connections got each mode (refused connects in a pause are not counted).
        self.faults: Counter[str] = Counter()
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="fault-proxy")

    # -- from the test's thread --------------------------------------------------------------

    def start(self) -> Proxy:
        self._thread.start()
        self._call(self._listen())
        return self

    def stop(self) -> None:
        self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Proxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _call(self, coroutine: Coroutine[Any, Any, None]) -> None:
        future: Future[None] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        future.result(15)

    # -- on the proxy's loop -------------------------------------------------------------------

    async def _listen(self) -> None:
        deadline = time.monotonic() + 5
        while True:  # the port is ours again after a refusal pause; retry if briefly taken
            try:
                self._server = await asyncio.start_server(self._accepted, "127.0.0.1", self.port,
                                                          reuse_address=True)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.01)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _refuse_for_a_while(self) -> None:
        if self._server is None:
            return
        server, self._server = self._server, None
        server.close()
        await asyncio.sleep(self.refuse_seconds)
        await self._listen()

    def _mode(self) -> str:
        if self.script:
            return self.script.pop(0)
        modes = list(self.weights)
        return self.rng.choices(modes, weights=[self.weights[m] for m in modes])[0]

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        mode = self._mode()
        self.faults[mode] += 1
        try:
            await self._serve(mode, reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            _reset(writer)
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _serve(self, mode: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if mode == "refuse":
            _reset(writer)
            await self._refuse_for_a_while()
            return
        request = await _read_message(reader)
        if mode == "reset_before":
            _reset(writer)
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        try:
            up_writer.write(_closing(request))
            await up_writer.drain()
            answer = _closing(await up_reader.read(-1))  # the receiver closes after its answer
        finally:
            up_writer.close()
        if mode == "reset_after":
            _reset(writer)
            return
        if mode == "late":
            await asyncio.sleep(self.late_seconds)
        if mode == "headers_close":
            writer.write(answer.partition(b"\r\n\r\n")[0] + b"\r\n\r\n")
        elif mode == "drip":
            for start in range(0, len(answer), self.drip_bytes):
                writer.write(answer[start:start + self.drip_bytes])
                await writer.drain()
                await asyncio.sleep(self.drip_pause)
        else:
            writer.write(answer)
        await writer.drain()


async def _read_message(reader: asyncio.StreamReader) -> bytes:
    """One HTTP/1.1 request: its head, then a Content-Length body (the sender always sends one)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    return head + (await reader.readexactly(length) if length else b"")


def _closing(message: bytes) -> bytes:
    """``message`` with its Connection header (if any) replaced by ``Connection: close``."""
    head, sep, body = message.partition(b"\r\n\r\n")
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
    return b"\r\n".join([*lines, b"Connection: close"]) + sep + body


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), not a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.fileno() != -1:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
