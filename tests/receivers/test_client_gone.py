"""A client that vanishes while the answer is being sent: the handler's work is still recorded."""

from __future__ import annotations

import pytest

from receivers import IdempotencyMiddleware, MemoryRecordStore, State
from receivers.keys import identity


async def test_an_answer_the_client_never_received_is_still_recorded_and_replayed():
    runs = []

    async def app(scope, receive, send):
        await receive()
        runs.append(scope["state"]["idempotency"].epoch)
        await send({"type": "http.response.start", "status": 201, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"made"})

    store = MemoryRecordStore()
    middleware = IdempotencyMiddleware(app, store)
    scope = {"type": "http", "method": "POST", "path": "/orders", "query_string": b"",
             "headers": [(b"idempotency-key", b"k-1"), (b"content-type", b"text/plain")]}

    async def receive():
        return {"type": "http.request", "body": b"order", "more_body": False}

    async def broken_send(message):
        if message["type"] == "http.response.body":
            raise OSError("connection reset by peer")

    with pytest.raises(OSError):
        await middleware(scope, receive, broken_send)
    record = await store.get(identity("default", "k-1"))
    assert record is not None and record.state is State.COMPLETED

    sent = []

    async def send(message):
        sent.append(message)

    await middleware(scope, receive, send)
    assert runs == [1]  # the retry was a replay, not a second effect
    assert sent[0]["status"] == 201 and (b"idempotent-replayed", b"true") in sent[0]["headers"]
    assert sent[1]["body"] == b"made"
    await middleware.idempotency.aclose()
