"""The receivers' idempotency contract (the README's "The contract") through the ASGI middleware.

A Starlette app whose handler counts its executions (the side effect) sits behind
``receivers.IdempotencyMiddleware``. The contract table runs through ``httpx.ASGITransport``
on an in-memory and on a real SQLite store; the concurrency test and the end-to-end cases go
over a real uvicorn socket on 127.0.0.1. Time is an injected clock.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from receivers import (
    RELEASE_STATUSES,
    IdempotencyMiddleware,
    MemoryRecordStore,
    PostgresRecordStore,
    SqliteRecordStore,
    State,
)
from receivers.keys import identity
from receivers.records import StoreUnavailable

from ..problems import assert_problem
from .conftest import Clock, Watched

JSON = {"content-type": "application/json"}
SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()
OTHER_SECRET = "whsec_" + base64.b64encode(b"o" * 32).decode()


def signed(key: str, body: bytes, at: float, *secrets: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    from receivers.wire import sign

    stamp = int(at)
    return {**JSON, "idempotency-key": key, "webhook-id": key, "webhook-timestamp": str(stamp),
            "webhook-signature": sign(secrets or (SECRET,), key, stamp, body), **(extra or {})}


# -- the app: a handler whose executions are the side effect ---------------------------------


@dataclass
class Call:
    method: str
    path: str
    body: bytes
    context: Any  # the IdempotencyContext the middleware handed over (None: passed through)
    headers: dict[str, str]


@dataclass
class Effects:
    calls: list[Call] = field(default_factory=list)
    entered: threading.Event = field(default_factory=threading.Event)
    gate: threading.Event = field(default_factory=threading.Event)

    @property
    def count(self) -> int:
        return len(self.calls)


def make_app(effects: Effects) -> Starlette:
    """``x-mode`` (not part of the fingerprint) picks what the handler does: ok (201 JSON),
    gate (wait for the test), raise, 503, 400, big (``x-size`` bytes), status (``x-status``)."""

    async def handle(request: Request) -> Response:
        body = await request.body()
        context = getattr(request.state, "idempotency", None)
        effects.calls.append(Call(request.method, request.url.path, body, context, dict(request.headers)))
        mode = request.headers.get("x-mode", "ok")
        if mode == "gate":
            effects.entered.set()
            assert await asyncio.to_thread(effects.gate.wait, 20), "the test never opened the gate"
        if mode == "raise":
            raise RuntimeError("the handler failed")
        if mode == "503":
            return JSONResponse({"error": "try later"}, status_code=503)
        if mode == "400":
            return JSONResponse({"error": "bad invoice"}, status_code=400, headers={"x-reason": "invalid"})
        if mode == "status":
            return JSONResponse({"n": effects.count}, status_code=int(request.headers["x-status"]))
        if mode == "big":
            return Response(b"x" * int(request.headers["x-size"]), media_type="application/octet-stream",
                            headers={"x-big": "yes"})
        response = JSONResponse(
            {"n": effects.count, "epoch": context.epoch if context else None,
             "scope": context.scope if context else None, "key": context.key if context else None},
            status_code=201,
            headers={"x-custom": "kept", "authorization": "Bearer secret-token", "cache-control": "no-store"},
        )
        response.set_cookie("session", "s3cret")
        return response

    methods = ["GET", "POST", "PATCH", "PUT", "DELETE"]
    return Starlette(routes=[Route("/items", handle, methods=methods), Route("/other", handle, methods=methods),
                             Route("/read-only", handle, methods=["GET"])])


# -- harness -----------------------------------------------------------------------------------


@dataclass
class Harness:
    app: IdempotencyMiddleware
    client: httpx.AsyncClient
    store: Any
    effects: Effects
    clock: Clock
    secret: str | None = None  # requests are signed with it when the middleware checks signatures

    async def record(self, key: str, scope: str = "default") -> Any:
        await self.store.open()  # a no-op once the middleware opened it
        return await self.store.get(identity(scope, key))

    async def post(self, key: str | None, payload: Any = None, *, path: str = "/items", method: str = "POST",
                   mode: str | None = None, fence: int | str | None = None, headers: Any = None,
                   content: bytes | None = None, sign: bool = True) -> httpx.Response:
        sent: dict[str, Any] = dict(JSON)
        if content is None:
            content = json.dumps({"invoice": 42} if payload is None else payload).encode()
        if key is not None:
            sent["idempotency-key"] = key
            if sign and self.secret is not None:
                sent = signed(key, content, self.clock.now.timestamp(), self.secret)
        if mode is not None:
            sent["x-mode"] = mode
        if fence is not None:
            sent["outbox-fence"] = str(fence)
        sent.update(headers or {})
        return await self.client.request(method, path, content=content, headers=sent)

    async def probe(self, key: str | None, fence: int | None, *, method: str = "POST", secret: str | None = None,
                    body: Any = None, webhook_id: str | None = None, headers: Any = None) -> httpx.Response:
        """A reconcile probe as the sender makes it: ``{"key", "fence"}`` signed with ``secret``
        (the harness's by default; pass ``body``/``webhook_id`` to make it lie)."""
        content = body if isinstance(body, bytes) else json.dumps(
            {"key": key, "fence": fence} if body is None else body).encode()
        sent: dict[str, str] = {"outbox-reconcile": "probe", **JSON}
        if key is not None:
            sent["idempotency-key"] = key
        if fence is not None:
            sent["outbox-fence"] = str(fence)
        secret = secret or self.secret
        if secret is not None:
            msg_id = webhook_id if webhook_id is not None else key or ""
            sent.update({k: v for k, v in signed(msg_id, content, self.clock.now.timestamp(), secret).items()
                         if k.startswith("webhook-")})
        sent.update(headers or {})
        return await self.client.request(method, "/items", content=content, headers=sent)


@pytest.fixture
async def make_harness(clock: Clock) -> AsyncIterator[Callable[..., Awaitable[Harness]]]:
    made: list[Harness] = []

    async def make(store: Any, **options: Any) -> Harness:
        effects = Effects()
        app = IdempotencyMiddleware(make_app(effects), store, clock=clock, **options)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
                                   base_url="http://receiver.test")
        secrets = options.get("secrets")
        harness = Harness(app, client, store, effects, clock,
                          secrets if isinstance(secrets, str) or secrets is None else secrets[0])
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.effects.gate.set()
        await harness.client.aclose()
        await harness.app.idempotency.aclose()  # stops the purger and closes the store


@pytest.fixture(params=["memory", "sqlite"])
def build(request: pytest.FixtureRequest, tmp_path: Path,
          make_harness: Callable[..., Awaitable[Harness]]) -> Callable[..., Awaitable[Harness]]:
    """``await build(**middleware_options)``: a harness on a fresh store of the parametrized kind."""
    counter = iter(range(100))

    async def build(**options: Any) -> Harness:
        store = MemoryRecordStore() if request.param == "memory" else SqliteRecordStore(
            tmp_path / f"idempotency-{next(counter)}.db")
        return await make_harness(store, **options)

    return build


def replayed(response: httpx.Response) -> bool:
    return response.headers.get("idempotent-replayed") == "true"


async def drive(app: Any, method: str, path: str, headers: list[tuple[bytes, bytes]],
                messages: list[dict[str, Any]]) -> tuple[int | None, list[tuple[bytes, bytes]], bytes]:
    """Call an ASGI app directly with these ``receive`` messages (then http.disconnect)."""
    incoming = list(messages)
    status: int | None = None
    response_headers: list[tuple[bytes, bytes]] = []
    body = bytearray()

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, response_headers
        if message["type"] == "http.response.start":
            status, response_headers = message["status"], list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            body.extend(message.get("body", b""))

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": headers, "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 80)}
    await app(scope, receive, send)
    return status, response_headers, bytes(body)


# -- the contract table --------------------------------------------------------------------------


async def test_first_request_runs_the_handler_under_a_claim(build: Any) -> None:
    h = await build()
    response = await h.post("k-1")
    assert response.status_code == 201
    assert response.json() == {"n": 1, "epoch": 1, "scope": "default", "key": "k-1"}
    assert h.effects.count == 1
    context = h.effects.calls[0].context
    assert (context.scope, context.key, context.epoch) == ("default", "k-1", 1)
    assert h.effects.calls[0].body == b'{"invoice": 42}'  # the app still gets the body it was sent
    assert not replayed(response)
    record = await h.record("k-1")
    assert (record.state, record.response.status) == (State.COMPLETED, 201)


async def test_a_replay_answers_the_same_response_without_running_the_handler(build: Any) -> None:
    h = await build()
    first = await h.post("k-1")
    again = await h.post("k-1")
    assert h.effects.count == 1
    assert again.status_code == first.status_code == 201
    assert again.content == first.content
    assert replayed(again)
    for name in ("content-type", "x-custom", "cache-control"):
        assert again.headers[name] == first.headers[name], name
    assert "idempotent-body-omitted" not in again.headers
    assert int(again.headers["content-length"]) == len(first.content)
    third = await h.post("k-1")
    assert (third.status_code, third.content, h.effects.count) == (201, first.content, 1)


async def test_json_with_reordered_keys_and_other_whitespace_is_the_same_request(build: Any) -> None:
    h = await build()
    first = await h.post("k", content=b'{"a": 1, "b": {"x": [1, 2], "y": null}}')
    again = await h.post("k", content=b'{\n  "b":{"y":null,"x":[1,2]} ,"a":1\n}')
    assert replayed(again) and again.content == first.content
    assert h.effects.count == 1


@pytest.mark.parametrize(("first", "second"), [(1, "1"), (1, 1.0), ("1", 1.0), (1.0, 1), ("1", 1)])
async def test_number_types_make_different_requests(build: Any, first: Any, second: Any) -> None:
    h = await build()
    assert (await h.post("k", {"amount": first})).status_code == 201
    before = await h.record("k")
    assert_problem(await h.post("k", {"amount": second}), 422, "idempotency-key-reused")
    assert h.effects.count == 1
    assert await h.record("k") == before  # the refusal changed nothing
    assert replayed(await h.post("k", {"amount": first}))


@pytest.mark.parametrize("change", ["path", "method", "query", "media type", "body"])
async def test_the_same_key_for_another_request_is_422(build: Any, change: str) -> None:
    h = await build()
    assert (await h.post("k", path="/items?page=1")).status_code == 201
    if change == "path":
        second = await h.post("k", path="/other?page=1")
    elif change == "method":
        second = await h.post("k", path="/items?page=1", method="PATCH")
    elif change == "query":
        second = await h.post("k", path="/items?page=2")
    elif change == "media type":
        second = await h.post("k", path="/items?page=1", headers={"content-type": "application/x-ndjson"})
    else:
        second = await h.post("k", {"invoice": 43}, path="/items?page=1")
    assert_problem(second, 422, "idempotency-key-reused")
    assert h.effects.count == 1


async def test_scope_and_key_never_collide_across_the_separator(build: Any) -> None:
    h = await build(scope_resolver=lambda request: request.values("x-tenant")[0])
    first = await h.post("b:c", headers={"x-tenant": "a"})
    second = await h.post("c", headers={"x-tenant": "a:b"})
    assert (first.status_code, second.status_code) == (201, 201)
    assert not replayed(second)
    assert h.effects.count == 2
    assert [(c.context.scope, c.context.key) for c in h.effects.calls] == [("a", "b:c"), ("a:b", "c")]
    # each replays its own
    assert (await h.post("b:c", headers={"x-tenant": "a"})).json()["key"] == "b:c"
    assert (await h.post("c", headers={"x-tenant": "a:b"})).json()["key"] == "c"
    assert h.effects.count == 2
    # and the same key in another scope is another request
    assert not replayed(await h.post("c", headers={"x-tenant": "other"}))
    assert h.effects.count == 3


async def test_an_async_scope_resolver_is_awaited(build: Any) -> None:
    async def tenant(request: Any) -> str:
        return "tenant-" + request.values("x-tenant")[0]

    h = await build(scope_resolver=tenant)
    assert (await h.post("k", headers={"x-tenant": "1"})).json()["scope"] == "tenant-1"


async def test_a_quoted_sf_string_key_and_a_bare_token_are_the_same_key(build: Any) -> None:
    h = await build()
    first = await h.post('"abc-1"')
    again = await h.post("abc-1")
    assert first.json()["key"] == "abc-1"
    assert replayed(again) and h.effects.count == 1
    # an escaped quote inside the sf-string is part of the key
    assert (await h.post(r'"a\"b"')).json()["key"] == 'a"b'
    assert replayed(await h.post('a"b'))


@pytest.mark.parametrize("raw", [
    pytest.param("clé".encode(), id="non-ascii"),
    pytest.param(b"a" * 256, id="too-long"),
    pytest.param(b'"' + b"a" * 256 + b'"', id="too-long-quoted"),
    pytest.param(b"", id="empty"),
    pytest.param(b'""', id="empty-sf-string"),
    pytest.param(b'"a b"', id="space"),
    pytest.param(b'"a\\b"', id="bad-escape"),
    pytest.param(b'"a"b"', id="unescaped-quote"),
])
async def test_a_malformed_key_is_400(build: Any, raw: bytes) -> None:
    h = await build()
    response = await h.client.post("/items", content=b"{}", headers=[
        (b"content-type", b"application/json"), (b"idempotency-key", raw)])
    assert_problem(response, 400, "malformed-idempotency-key")
    assert h.effects.count == 0


async def test_two_key_headers_are_400_even_when_equal(build: Any) -> None:
    h = await build()
    for values in ((b"a", b"b"), (b"a", b"a")):
        response = await h.client.post("/items", content=b"{}", headers=[
            (b"content-type", b"application/json"), (b"idempotency-key", values[0]),
            (b"idempotency-key", values[1])])
        assert_problem(response, 400, "malformed-idempotency-key")
    assert h.effects.count == 0


async def test_a_key_of_255_visible_characters_is_accepted(build: Any) -> None:
    h = await build()
    key = "".join(chr(0x21 + i % 94) for i in range(255)).replace('"', "q")
    assert (await h.post(key)).status_code == 201
    assert replayed(await h.post(key))


async def test_a_missing_key_is_400_and_the_handler_does_not_run(build: Any) -> None:
    h = await build()
    assert_problem(await h.post(None), 400, "missing-idempotency-key")
    assert_problem(await h.post(None, method="PATCH"), 400, "missing-idempotency-key")
    assert h.effects.count == 0


async def test_a_missing_key_passes_through_when_not_required(build: Any) -> None:
    h = await build(required=False)
    first = await h.post(None)
    second = await h.post(None)
    assert (first.status_code, second.status_code) == (201, 201)
    assert h.effects.count == 2  # nothing deduplicates without a key
    assert [c.context for c in h.effects.calls] == [None, None]
    assert h.effects.calls[1].body == b'{"invoice": 42}'
    # a keyed request is still covered
    await h.post("k")
    assert replayed(await h.post("k"))
    assert h.effects.count == 3


async def test_get_passes_through_untouched(build: Any) -> None:
    h = await build()
    for _ in range(2):
        response = await h.client.request("GET", "/items", content=b"payload",
                                          headers={"idempotency-key": "k", "x-mode": "ok"})
        assert response.status_code == 201 and not replayed(response)
    assert h.effects.count == 2
    assert [(c.method, c.body, c.context) for c in h.effects.calls] == [("GET", b"payload", None)] * 2
    assert h.effects.calls[0].headers["idempotency-key"] == "k"
    # PUT and DELETE are not covered by default either; no key needed
    assert (await h.client.put("/items", content=b"x")).status_code == 201
    assert await h.record("k") is None


async def test_in_progress_is_409_with_retry_after(build: Any) -> None:
    h = await build(lease_seconds=45)
    running = asyncio.create_task(h.post("k", mode="gate"))
    assert await asyncio.to_thread(h.effects.entered.wait, 10)
    busy = await h.post("k")
    problem = assert_problem(busy, 409, "request-in-progress")
    assert busy.headers["retry-after"] == "45"
    assert "still" in problem["detail"]
    h.clock.advance(30)
    assert (await h.post("k")).headers["retry-after"] == "15"
    assert h.effects.count == 1
    h.effects.gate.set()
    assert (await running).status_code == 201
    assert replayed(await h.post("k"))
    assert h.effects.count == 1


async def test_an_expired_lease_is_taken_over_with_a_higher_epoch(build: Any) -> None:
    h = await build(lease_seconds=30)
    stalled = asyncio.create_task(h.post("k", mode="gate"))
    assert await asyncio.to_thread(h.effects.entered.wait, 10)
    h.clock.advance(30)  # the first handler's lease has run out (it is still running)
    takeover = await h.post("k")
    assert takeover.status_code == 201 and not replayed(takeover)
    assert takeover.json()["epoch"] == 2
    assert [c.context.epoch for c in h.effects.calls] == [1, 2]
    h.effects.gate.set()
    late = await stalled  # the stale owner answers its own client ...
    assert late.json()["epoch"] == 1
    record = await h.record("k")  # ... but cannot overwrite the record of the takeover
    assert (record.state, record.epoch) == (State.COMPLETED, 2)
    again = await h.post("k")
    assert replayed(again) and again.json()["epoch"] == 2
    assert h.effects.count == 2


async def test_a_handler_that_raises_releases_the_key_and_a_retry_runs_again(build: Any) -> None:
    h = await build()
    failed = await h.post("k", mode="raise")
    assert failed.status_code == 500
    record = await h.record("k")
    assert record.state is State.ABSENT
    retry = await h.post("k")
    assert retry.status_code == 201 and not replayed(retry)
    assert retry.json()["epoch"] == 2
    assert h.effects.count == 2
    assert replayed(await h.post("k"))


async def test_a_plain_asgi_handler_that_raises_before_answering_releases_too(
        make_harness: Any, tmp_path: Path) -> None:
    store = SqliteRecordStore(tmp_path / "plain.db")
    runs: list[Any] = []

    async def plain(scope: dict[str, Any], receive: Any, send: Any) -> None:
        runs.append(scope["state"]["idempotency"])
        if len(runs) == 1:
            raise RuntimeError("boom")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})

    app = IdempotencyMiddleware(plain, store)
    try:
        with pytest.raises(RuntimeError):
            await drive(app, "POST", "/x", [(b"idempotency-key", b"k")], [{"type": "http.request", "body": b"1"}])
        status, _, body = await drive(app, "POST", "/x", [(b"idempotency-key", b"k")],
                                      [{"type": "http.request", "body": b"1"}])
        assert (status, body, [c.epoch for c in runs]) == (200, b"done", [1, 2])
    finally:
        await store.close()


@pytest.mark.parametrize("status", [404, 405, 408, 425, 429, 500, 502, 503, 504, 599])
async def test_a_response_that_says_nothing_ran_or_come_back_releases_the_key(build: Any, status: int) -> None:
    h = await build()
    assert (await h.post("k", mode="status", headers={"x-status": str(status)})).status_code == status
    assert (await h.record("k")).state is State.ABSENT
    retry = await h.post("k")
    assert retry.status_code == 201 and not replayed(retry)
    assert retry.json()["epoch"] == 2
    assert h.effects.count == 2


async def test_a_routers_404_for_a_wrong_path_releases_the_key_so_the_right_path_runs(build: Any) -> None:
    """A sender's typo: no handler ran, so once the URL is fixed the key must not answer the
    stored 404 (same path) or 422 (the right path is another fingerprint)."""
    h = await build()
    wrong = await h.post("k", path="/itmes")
    assert wrong.status_code == 404 and h.effects.count == 0  # Starlette's router answered
    assert (await h.record("k")).state is State.ABSENT
    again = await h.post("k", path="/itmes")
    assert again.status_code == 404 and not replayed(again)
    fixed = await h.post("k")
    assert fixed.status_code == 201 and not replayed(fixed)
    assert h.effects.count == 1
    assert replayed(await h.post("k"))


async def test_a_routers_405_for_a_wrong_method_releases_the_key(build: Any) -> None:
    h = await build()
    assert (await h.post("k", path="/read-only")).status_code == 405 and h.effects.count == 0
    assert (await h.record("k")).state is State.ABSENT
    fixed = await h.post("k")
    assert fixed.status_code == 201 and not replayed(fixed)
    assert h.effects.count == 1


@pytest.mark.parametrize("status", [200, 202, 204, 303, 400, 401, 403, 409, 410, 422])
async def test_every_other_response_completes_and_is_replayed(build: Any, status: int) -> None:
    h = await build()
    first = await h.post("k", mode="status", headers={"x-status": str(status)})
    assert first.status_code == status
    again = await h.post("k")
    assert again.status_code == status and replayed(again) and again.content == first.content
    assert h.effects.count == 1


async def test_which_statuses_release_is_the_release_statuses_option(build: Any) -> None:
    """An app whose handlers' 404s carry meaning can keep them; one that wants 409 retried can add it."""
    keeps = await build(release_statuses=RELEASE_STATUSES - {404})
    assert (await keeps.post("k", path="/itmes")).status_code == 404
    assert (await keeps.record("k")).state is State.COMPLETED
    stored = await keeps.post("k", path="/itmes")
    assert stored.status_code == 404 and replayed(stored)
    retries = await build(release_statuses={*RELEASE_STATUSES, 409})
    assert (await retries.post("k", mode="status", headers={"x-status": "409"})).status_code == 409
    assert (await retries.post("k")).status_code == 201
    assert retries.effects.count == 2


@pytest.mark.parametrize("statuses", [{"404"}, {99}, {600}, {404.0}, {True}])
def test_release_statuses_must_be_http_status_codes(statuses: Any) -> None:
    with pytest.raises(ValueError, match="release_statuses must be HTTP status codes"):
        IdempotencyMiddleware(make_app(Effects()), MemoryRecordStore(), release_statuses=statuses)


async def test_a_4xx_response_completes_and_is_replayed(build: Any) -> None:
    h = await build()
    first = await h.post("k", mode="400")
    assert first.status_code == 400
    again = await h.post("k")  # the handler would succeed now, but the key is spent
    assert again.status_code == 400 and replayed(again)
    assert again.json() == {"error": "bad invoice"} and again.headers["x-reason"] == "invalid"
    assert h.effects.count == 1


async def test_set_cookie_and_authorization_are_never_stored_or_replayed(build: Any) -> None:
    h = await build()
    first = await h.post("k")
    assert "session=s3cret" in first.headers["set-cookie"]  # the first client does get them
    assert first.headers["authorization"] == "Bearer secret-token"
    record = await h.record("k")
    stored = {name.lower() for name, _ in record.response.headers}
    assert stored.isdisjoint({"set-cookie", "authorization", "content-length", "date", "server"})
    assert "x-custom" in stored
    again = await h.post("k")
    assert replayed(again)
    assert "set-cookie" not in again.headers and "authorization" not in again.headers
    assert b"s3cret" not in again.content and b"secret-token" not in again.content


async def test_a_response_over_max_stored_bytes_completes_without_a_stored_body(build: Any) -> None:
    h = await build(max_stored_bytes=1000)
    first = await h.post("big", mode="big", headers={"x-size": "1001"})
    assert first.status_code == 200 and first.content == b"x" * 1001  # the client got all of it
    record = await h.record("big")
    assert record.state is State.COMPLETED and record.response.body is None
    again = await h.post("big", mode="big", headers={"x-size": "1001"})
    assert again.status_code == 200 and replayed(again)
    assert again.headers["idempotent-body-omitted"] == "true"
    assert again.content == b"" and again.headers["x-big"] == "yes"
    # exactly at the limit the body is kept
    assert (await h.post("fits", mode="big", headers={"x-size": "1000"})).status_code == 200
    fits = await h.post("fits", mode="big", headers={"x-size": "1000"})
    assert replayed(fits) and fits.content == b"x" * 1000 and "idempotent-body-omitted" not in fits.headers
    assert h.effects.count == 2


async def test_a_body_sent_in_several_chunks_has_the_same_fingerprint(build: Any) -> None:
    h = await build()
    headers = [(b"content-type", b"application/json"), (b"idempotency-key", b"k")]
    status, _, body = await drive(h.app, "POST", "/items", headers, [
        {"type": "http.request", "body": b'{"invoice"', "more_body": True},
        {"type": "http.request", "body": b"", "more_body": True},
        {"type": "http.request", "body": b": 4", "more_body": True},
        {"type": "http.request", "body": b"2}", "more_body": False},
    ])
    assert status == 201
    assert h.effects.calls[0].body == b'{"invoice": 42}'  # the app got the whole body
    again = await h.post("k")  # one chunk, same bytes
    assert replayed(again) and again.content == body
    assert h.effects.count == 1


async def test_a_body_over_max_body_bytes_is_413_before_claiming(build: Any) -> None:
    h = await build(max_body_bytes=100)
    declared = await h.post("k", content=b" " * 101)
    assert_problem(declared, 413, "payload-too-large")
    # without a Content-Length (chunked): counted while read
    status, headers, body = await drive(h.app, "POST", "/items", [(b"idempotency-key", b"k2")], [
        {"type": "http.request", "body": b"a" * 60, "more_body": True},
        {"type": "http.request", "body": b"a" * 41, "more_body": False},
    ])
    assert status == 413 and (b"content-type", b"application/problem+json") in headers
    assert json.loads(body)["type"] == "urn:outbox:problem:payload-too-large"
    assert h.effects.count == 0
    assert await h.record("k") is None and await h.record("k2") is None
    # exactly at the limit it runs
    assert (await h.post("k", content=b" " * 90 + b'{"a": 1}  ')).status_code == 201


async def test_a_client_that_disconnects_mid_body_does_not_run_the_handler(build: Any) -> None:
    """A truncated upload is not a request: running the handler on the partial body records
    the partial fingerprint, and the sender's complete retry is then refused with 422."""
    h = await build()
    headers = [(b"content-type", b"application/json"), (b"idempotency-key", b"k"),
               (b"content-length", b"15")]
    await drive(h.app, "POST", "/items", headers, [
        {"type": "http.request", "body": b'{"invoi', "more_body": True},
        {"type": "http.disconnect"},
    ])
    ran_on_partial_body = [c.body for c in h.effects.calls]
    assert ran_on_partial_body == [], f"the handler ran on a truncated body: {ran_on_partial_body}"
    retry = await h.post("k")  # the sender retries the whole body with the same key
    assert retry.status_code == 201, (retry.status_code, retry.text)
    assert [c.body for c in h.effects.calls] == [b'{"invoice": 42}']


async def test_an_unavailable_memory_store_is_503_and_the_handler_does_not_run(make_harness: Any) -> None:
    store = MemoryRecordStore()
    h = await make_harness(store)
    store.available = False
    response = await h.post("k")
    assert_problem(response, 503, "store-unavailable")
    assert response.headers["retry-after"] == "1"
    assert h.effects.count == 0
    store.available = True
    assert (await h.post("k")).status_code == 201  # nothing was stored by the refusal


async def test_a_closed_sqlite_store_is_503_and_the_handler_does_not_run(make_harness: Any, tmp_path: Path) -> None:
    store = SqliteRecordStore(tmp_path / "closed.db")
    h = await make_harness(store)
    assert (await h.post("first")).status_code == 201
    await store.close()
    assert_problem(await h.post("second"), 503, "store-unavailable")
    assert_problem(await h.post("first"), 503, "store-unavailable")
    assert h.effects.count == 1


async def test_a_sqlite_store_that_cannot_open_is_503(make_harness: Any, tmp_path: Path) -> None:
    before = set(threading.enumerate())
    h = await make_harness(SqliteRecordStore(tmp_path / "missing-directory" / "records.db"))
    assert_problem(await h.post("k"), 503, "store-unavailable")
    assert_problem(await h.post("k"), 503, "store-unavailable")  # tried again, still refused
    assert h.effects.count == 0
    # aiosqlite stops a failed connection's thread asynchronously: let it finish on this loop
    for thread in set(threading.enumerate()) - before:
        await asyncio.to_thread(thread.join, 5)


# -- what only the request decides is a 4xx, never a 503 ----------------------------------------


@pytest.mark.parametrize("body", [
    pytest.param(b"[" * 100_000, id="100000-brackets"),
    pytest.param(b'{"a":' * 50_000 + b"1" + b"}" * 50_000, id="50000-objects"),
    pytest.param(b"[" * 65 + b"]" * 65, id="65-levels"),
    pytest.param(b'{"name": "\\ud800"}', id="lone-surrogate"),
    pytest.param(b'["\\udfff", 1]', id="lone-low-surrogate"),
    pytest.param(b'{"\\ud800": 1}', id="lone-surrogate-as-a-name"),
])
async def test_a_json_body_that_cannot_be_fingerprinted_is_400_not_503(build: Any, body: bytes) -> None:
    """Such a body can never succeed, so it is a client error, not a store outage to retry."""
    h = await build()
    for _ in range(2):  # and nothing was stored: the same answer again
        response = await h.post("k", content=body, fence=3)
        problem = assert_problem(response, 400, "invalid-json-body")
        assert "retry-after" not in response.headers
        assert "deeper than 64" in problem["detail"] or "surrogate" in problem["detail"]
    assert h.effects.count == 0
    assert await h.record("k") is None
    assert (await h.post("k", fence=1)).status_code == 201  # no fence was raised either


async def test_the_json_depth_limit_is_max_json_depth_and_counts_only_real_nesting(build: Any) -> None:
    h = await build()
    assert (await h.post("64", content=b"[" * 64 + b"]" * 64)).status_code == 201
    assert (await h.post("mixed", content=b'{"a": ' * 32 + b"[" * 32 + b"1" + b"]" * 32 + b"}" * 32)).status_code == 201
    # brackets inside strings, escaped quotes included, are text, not nesting
    text = json.dumps({"s": "[{" * 5000 + '\\"[[[', "t": ['"]]]', "[" * 300]}).encode()
    assert (await h.post("text", content=text)).status_code == 201
    # a body that is not declared JSON is fingerprinted as bytes, whatever it holds
    raw = await h.post("raw", content=b"[" * 100_000, headers={"content-type": "application/octet-stream"})
    assert raw.status_code == 201 and replayed(await h.post("raw", content=b"[" * 100_000,
                                                            headers={"content-type": "application/octet-stream"}))
    # so is declared JSON that does not parse (as before): the app decides what it means
    assert (await h.post("broken", content=b'{"a": [1, 2')).status_code == 201
    shallow = await build(max_json_depth=2)
    assert (await shallow.post("2", content=b'{"a": [1]}')).status_code == 201
    assert_problem(await shallow.post("3", content=b'{"a": [[1]]}'), 400, "invalid-json-body")
    assert_problem(await shallow.post("3+", content=b'{"a": [[1]]}', headers={"content-type": "application/x+json"}),
                   400, "invalid-json-body")


async def test_a_scope_resolver_that_raises_is_the_apps_error_not_a_503(make_harness: Any) -> None:
    def resolver(request: Any) -> str:
        return request.values("x-tenant")[0]  # IndexError without the header

    store = MemoryRecordStore()
    h = await make_harness(store, scope_resolver=resolver)
    with pytest.raises(IndexError):
        await drive(h.app, "POST", "/items", [(b"idempotency-key", b"k")], [{"type": "http.request", "body": b"1"}])
    odd = await make_harness(MemoryRecordStore(), scope_resolver=lambda request: 42)
    with pytest.raises(TypeError, match="scope_resolver returned int"):
        await drive(odd.app, "POST", "/items", [(b"idempotency-key", b"k")], [{"type": "http.request", "body": b"1"}])
    assert h.effects.count == odd.effects.count == 0
    assert await store.get(identity("default", "k")) is None


async def test_a_signature_timestamp_too_large_for_a_float_is_401_not_500(build: Any) -> None:
    h = await build(secrets=SECRET)
    response = await h.post("k", headers={"webhook-timestamp": "1" + "0" * 400})
    assert_problem(response, 401, "invalid-signature")
    assert h.effects.count == 0


async def test_a_content_length_of_non_ascii_digits_is_not_a_500(build: Any) -> None:
    h = await build()
    status, _, _ = await drive(h.app, "POST", "/items", [
        (b"idempotency-key", b"k"), (b"content-type", b"application/json"), (b"content-length", "²".encode("latin-1"))],
        [{"type": "http.request", "body": b"{}"}])
    assert status == 201


async def test_a_lower_outbox_fence_than_seen_is_409_stale_fence_when_the_handler_would_run(build: Any) -> None:
    h = await build()
    assert (await h.post("k", fence=5, mode="503")).status_code == 503  # ran, released: the key is free
    stale = await h.post("k", fence=4)
    problem = assert_problem(stale, 409, "stale-fence")
    assert "4" in problem["detail"] and "5" in problem["detail"]
    assert h.effects.count == 1
    assert (await h.post("k", fence=5)).status_code == 201  # the same fence is not lower
    assert h.effects.count == 2
    assert (await h.record("k")).min_fence == 5


async def test_a_completed_request_is_replayed_whatever_its_fence(build: Any) -> None:
    """A fence stops a handler from running; it never turns a completed effect into a refusal
    (else a sender that lost the answer would be told 409 for ever), and a replay raises nothing."""
    h = await build()
    first = await h.post("k", fence=5)
    for fence in (4, 0, 7, 999_999_999_999_999_999, None):
        again = await h.post("k", fence=fence)
        assert replayed(again) and again.content == first.content, fence
    assert h.effects.count == 1
    assert (await h.record("k")).min_fence == 5
    assert_problem(await h.post("k", {"other": 1}, fence=1), 422, "idempotency-key-reused")


@pytest.mark.parametrize("raw", [b"abc", b"-1", b"1.5", b"", b"\xb2"], ids=["word", "negative", "decimal",
                                                                           "empty", "superscript-two"])
async def test_a_malformed_outbox_fence_is_400(build: Any, raw: bytes) -> None:
    h = await build()
    response = await h.client.post("/items", content=b"{}", headers=[
        (b"content-type", b"application/json"), (b"idempotency-key", b"k"), (b"outbox-fence", raw)])
    assert response.status_code == 400, response.status_code
    assert response.headers["content-type"] == "application/problem+json"
    assert h.effects.count == 0


async def test_a_fence_beyond_64_bits_is_a_client_error_not_an_unavailable_store(
        make_harness: Any, tmp_path: Path) -> None:
    h = await make_harness(SqliteRecordStore(tmp_path / "fence.db"))
    response = await h.post("k", fence=2**63)
    assert response.status_code == 400, (response.status_code, response.text)
    assert h.effects.count == 0


async def test_the_probe_after_a_completed_request_answers_its_response(build: Any) -> None:
    h = await build(secrets=SECRET)
    first = await h.post("k", fence=1)
    probe = await h.probe("k", 2)
    assert probe.status_code == 200
    assert probe.headers["content-type"] == "application/json"
    answer = probe.json()
    assert (answer["state"], answer["key"], answer["fence"]) == ("completed", "k", 2)
    assert answer["response"]["status"] == 201
    assert base64.b64decode(answer["response"]["body"]) == first.content
    assert ["x-custom", "kept"] in answer["response"]["headers"]
    assert not any(name.lower() in ("set-cookie", "authorization") for name, _ in answer["response"]["headers"])
    assert h.effects.count == 1  # the app never saw the probe
    assert (await h.record("k")).min_fence == 2
    assert replayed(await h.post("k", fence=1))  # the earlier attempt, late: still the same effect


async def test_the_probe_before_any_request_is_absent_and_fences_out_the_late_request(build: Any) -> None:
    h = await build(secrets=SECRET)
    answer = (await h.probe("k", 3)).json()
    assert answer == {"state": "absent", "key": "k", "fence": 3}
    assert h.effects.count == 0
    assert_problem(await h.post("k", fence=2), 409, "stale-fence")  # the old attempt arrives late
    assert h.effects.count == 0
    assert (await h.post("k", fence=3)).status_code == 201  # the sender's retry with the new fence


async def test_the_probe_while_running_is_in_progress_and_after_an_expired_lease_absent(build: Any) -> None:
    h = await build(lease_seconds=30, secrets=SECRET, signature_tolerance_seconds=3600)
    running = asyncio.create_task(h.post("k", mode="gate", fence=1))
    assert await asyncio.to_thread(h.effects.entered.wait, 10)
    assert (await h.probe("k", 2)).json() == {"state": "in_progress", "key": "k", "fence": 2}
    h.clock.advance(30)
    assert (await h.probe("k", 3)).json() == {"state": "absent", "key": "k", "fence": 3}
    h.effects.gate.set()
    await running
    record = await h.record("k")
    assert record.state is State.ABSENT  # the old run's completion was refused
    assert h.effects.count == 1
    assert (await h.post("k", fence=3)).json()["epoch"] > 1


async def test_a_probe_without_a_fence_is_400(build: Any) -> None:
    h = await build(secrets=SECRET)
    assert_problem(await h.probe("k", None), 400, "missing-fence")
    assert_problem(await h.probe(None, 1), 400, "missing-idempotency-key")
    assert h.effects.count == 0


@pytest.mark.parametrize("secrets", [None, SECRET], ids=["no-secrets", "secrets"])
async def test_a_probe_is_never_passed_to_the_app_even_when_keys_are_optional(build: Any, secrets: Any) -> None:
    h = await build(required=False, secrets=secrets)
    response = await h.probe(None, 1)
    assert h.effects.count == 0, "the reconcile probe reached the app, which ran its handler (the side effect)"
    assert response.status_code in (400, 403)
    assert response.headers["content-type"] == "application/problem+json"


@pytest.mark.parametrize("method", ["GET", "PUT", "PATCH", "DELETE", "HEAD"])
@pytest.mark.parametrize("secrets", [None, SECRET], ids=["no-secrets", "secrets"])
async def test_a_probe_with_another_method_than_post_is_405(build: Any, method: str, secrets: Any) -> None:
    h = await build(secrets=secrets)
    await h.post("k")
    response = await h.probe("k", 999_999_999_999_999_999, method=method)
    assert response.status_code == 405, (response.status_code, response.text)
    assert response.headers["allow"] == "POST"
    if method != "HEAD":
        assert_problem(response, 405, "method-not-allowed")
    assert h.effects.count == 1  # only the first post ran
    assert (await h.record("k")).min_fence == 0
    assert b"invoice" not in response.content


async def test_without_secrets_the_probe_is_off_so_nobody_reads_or_fences_a_key(build: Any) -> None:
    h = await build()
    first = await h.post("k", fence=1)
    refused = await h.probe("k", 2)
    problem = assert_problem(refused, 403, "probe-disabled")
    assert "secrets=" in problem["detail"]
    assert first.content not in refused.content and "response" not in problem
    # the lock-out: a probe with the highest fence on a key the sender has not used yet
    assert_problem(await h.probe("later", 999_999_999_999_999_999), 403, "probe-disabled")
    assert await h.record("later") is None
    assert (await h.post("later", fence=1)).status_code == 201
    assert h.effects.count == 2


async def test_the_middleware_warns_at_start_up_when_it_has_no_secrets(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="receivers.idempotency"):
        IdempotencyMiddleware(make_app(Effects()), MemoryRecordStore())
    [warning] = [r for r in caplog.records if r.name == "receivers.idempotency"]
    assert warning.levelno == logging.WARNING
    assert "signatures are not checked" in warning.message and "probe is off" in warning.message
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="receivers.idempotency"):
        IdempotencyMiddleware(make_app(Effects()), MemoryRecordStore(), secrets=SECRET)
    assert not [r for r in caplog.records if r.name == "receivers.idempotency"]


async def test_an_unsigned_or_forged_probe_is_401_and_neither_reads_nor_fences(build: Any) -> None:
    h = await build(secrets=SECRET)
    first = await h.post("k", fence=1)
    before = await h.record("k")
    for response in (await h.probe("k", 2, secret=OTHER_SECRET),
                     await h.probe("k", 2, headers={"webhook-signature": "v1,AAAA"}),
                     await h.client.post("/items", content=b"", headers={
                         **JSON, "outbox-reconcile": "probe", "idempotency-key": "k", "outbox-fence": "2"})):
        assert_problem(response, 401, "invalid-signature")
        assert first.content not in response.content
    assert await h.record("k") == before
    assert_problem(await h.probe("unused", 999_999_999_999_999_999, secret=OTHER_SECRET), 401, "invalid-signature")
    assert await h.record("unused") is None


@pytest.mark.parametrize(("case", "body", "webhook_id", "headers"), [
    ("another key in the body", {"key": "other", "fence": 2}, "other", None),
    ("webhook-id not the key", {"key": "k", "fence": 2}, "other", None),
    ("another fence in the body", {"key": "k", "fence": 3}, None, None),
    ("the fence as a string", {"key": "k", "fence": "2"}, None, None),
    ("the fence as a boolean", {"key": "k", "fence": True}, None, {"outbox-fence": "1"}),
    ("no fence in the body", {"key": "k"}, None, None),
    ("a list", ["k", 2], None, None),
    ("the old empty body", b"", None, None),
    ("not JSON", b"key=k&fence=2", None, None),
    ("deep JSON", b"[" * 100_000, None, None),
])
async def test_a_signed_probe_must_name_its_key_and_fence_in_its_signed_body(
        build: Any, case: str, body: Any, webhook_id: str | None, headers: Any) -> None:
    """A probe signed for one key or fence cannot be used to ask about another: its signature
    covers the body, and the body must name what the headers ask about."""
    h = await build(secrets=SECRET)
    await h.post("k", fence=1)
    before = await h.record("k")
    response = await h.probe("k", 2, body=body, webhook_id=webhook_id, headers=headers)
    problem = assert_problem(response, 400, "invalid-probe")
    assert "key" in problem["detail"] and "fence" in problem["detail"], case
    assert "response" not in response.text
    assert await h.record("k") == before
    assert (await h.probe("k", 2)).json()["state"] == "completed"  # the well-formed probe is answered


async def test_a_probe_reads_only_the_records_of_its_own_scope(build: Any) -> None:
    h = await build(secrets=SECRET, scope_resolver=lambda request: request.values("x-tenant")[0])
    secret = await h.post("k", {"salary": 123_456}, headers={"x-tenant": "a"})
    assert secret.status_code == 201
    other = await h.probe("k", 5, headers={"x-tenant": "b"})
    assert other.json() == {"state": "absent", "key": "k", "fence": 5}
    assert (await h.record("k", scope="a")).min_fence == 0
    own = (await h.probe("k", 5, headers={"x-tenant": "a"})).json()
    assert own["state"] == "completed" and base64.b64decode(own["response"]["body"]) == secret.content


async def test_expiry_at_the_exact_retention_boundary(build: Any) -> None:
    h = await build(retention_seconds=100)
    start = h.clock.now
    assert (await h.post("k", fence=4)).json()["epoch"] == 1
    h.clock.set(start + timedelta(seconds=100) - timedelta(microseconds=1))
    assert replayed(await h.post("k"))
    assert replayed(await h.post("k", fence=3))
    h.clock.set(start + timedelta(seconds=100))  # now == expires_at: gone
    again = await h.post("k", fence=1)  # and its fence is forgotten with it
    assert again.status_code == 201 and not replayed(again) and again.json()["epoch"] == 2
    assert h.effects.count == 2


async def test_the_retention_runs_from_completion(build: Any) -> None:
    h = await build(retention_seconds=100, lease_seconds=300)
    start = h.clock.now
    running = asyncio.create_task(h.post("k", mode="gate"))
    assert await asyncio.to_thread(h.effects.entered.wait, 10)
    h.clock.advance(50)
    h.effects.gate.set()
    await running  # completed at start + 50 s
    h.clock.set(start + timedelta(seconds=149, microseconds=999_999))
    assert replayed(await h.post("k"))
    h.clock.set(start + timedelta(seconds=150))
    assert not replayed(await h.post("k"))
    assert h.effects.count == 2


async def test_middleware_answers_are_never_stored(build: Any) -> None:
    h = await build(max_body_bytes=50, max_json_depth=8)
    assert_problem(await h.post("k", content=b"x" * 60), 413, "payload-too-large")
    assert await h.record("k") is None
    assert (await h.post("k", fence=2)).status_code == 201
    completed = await h.record("k")
    assert_problem(await h.post("k", {"other": 1}, fence=3), 422, "idempotency-key-reused")
    assert_problem(await h.post("k", content=b"[" * 20), 400, "invalid-json-body")
    assert_problem(await h.post("k", headers={"idempotency-key": '"a b"'}), 400, "malformed-idempotency-key")
    assert_problem(await h.probe("k", 9), 403, "probe-disabled")
    assert await h.record("k") == completed
    assert (await h.post("released", fence=2, mode="503")).status_code == 503
    released = await h.record("released")
    assert_problem(await h.post("released", fence=1), 409, "stale-fence")
    assert await h.record("released") == released
    again = await h.post("k")
    assert replayed(again) and again.status_code == 201


# -- signatures checked before claiming (``secrets=``) ------------------------------------------


async def test_signed_requests_run_and_forged_ones_are_401_before_claiming(build: Any) -> None:
    h = await build(secrets=[SECRET], signature_tolerance_seconds=300)
    body = b'{"invoice": 42}'
    now = h.clock.now.timestamp()
    assert (await h.client.post("/items", content=body, headers=signed("k", body, now))).status_code == 201
    # a forgery with a key the real sender will use later cannot poison that key
    forged = await h.client.post("/items", content=b'{"invoice": 666}',
                                 headers=signed("k2", b'{"invoice": 666}', now, OTHER_SECRET))
    assert_problem(forged, 401, "invalid-signature")
    assert await h.record("k2") is None
    tampered = await h.client.post("/items", content=b'{"invoice": 43}', headers=signed("k3", body, now))
    assert_problem(tampered, 401, "invalid-signature")
    assert_problem(await h.post("k4", sign=False), 401, "invalid-signature")  # unsigned
    assert h.effects.count == 1
    real = await h.client.post("/items", content=body, headers=signed("k2", body, now))
    assert real.status_code == 201 and not replayed(real)
    # rotation: signed with the old and the new secret, verified with either
    h2 = await build(secrets=[OTHER_SECRET, SECRET])
    assert (await h2.client.post("/items", content=body, headers=signed("r", body, now, SECRET))).status_code == 201


async def test_the_signature_tolerance_follows_the_injected_clock(build: Any) -> None:
    h = await build(secrets=SECRET, signature_tolerance_seconds=300)
    body = b'{"invoice": 42}'
    headers = signed("k", body, h.clock.now.timestamp())
    h.clock.advance(300)
    assert (await h.client.post("/items", content=body, headers=headers)).status_code == 201
    h.clock.advance(1)  # 301 s after signing: a replayed capture is refused, not replayed
    assert_problem(await h.client.post("/items", content=body, headers=headers), 401, "invalid-signature")
    assert h.effects.count == 1


async def test_a_signature_header_with_non_ascii_bytes_is_401_not_500(build: Any) -> None:
    h = await build(secrets=[SECRET])
    body = b'{"invoice": 42}'
    headers = signed("k", body, h.clock.now.timestamp())
    raw = [(name.encode(), value.encode()) for name, value in headers.items() if name != "webhook-signature"]
    response = await h.client.post("/items", content=body, headers=[*raw, (b"webhook-signature", b"v1,\xe9t\xe9")])
    assert response.status_code == 401, (response.status_code, response.text)
    assert response.headers["content-type"] == "application/problem+json"
    assert h.effects.count == 0


async def test_a_signed_probe_is_answered(build: Any) -> None:
    """The wire format, by hand: POST, signed body {"key", "fence"}, webhook-id the key."""
    h = await build(secrets=[SECRET])
    now = h.clock.now.timestamp()
    body = b'{"key": "k", "fence": 4}'
    probe = await h.client.post("/items", content=body, headers=signed(
        "k", body, now, extra={"outbox-reconcile": "probe", "outbox-fence": "4"}))
    assert probe.status_code == 200 and probe.headers["content-type"] == "application/json"
    assert probe.json() == {"state": "absent", "key": "k", "fence": 4}
    assert (await h.record("k")).min_fence == 4
    assert h.effects.count == 0


# -- over a real uvicorn socket ----------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
def real_store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "sqlite":
        return SqliteRecordStore(tmp_path / "served.db")
    dsn = request.getfixturevalue("pg_dsn")
    table = request.getfixturevalue("pg_table")
    return PostgresRecordStore(dsn, table=table, pool_size=20)


async def test_twenty_concurrent_duplicates_over_a_socket_run_the_handler_once(serve: Any, real_store: Any) -> None:
    effects = Effects()
    store = Watched(real_store)
    server = serve(IdempotencyMiddleware(make_app(effects), store))
    headers = {**JSON, "idempotency-key": "order-7", "x-mode": "gate"}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        tasks = [asyncio.create_task(client.post("/items", content=b'{"order": 7}', headers=headers))
                 for _ in range(20)]
        # while the one handler is held, every duplicate must be answered without running it
        finished: set[asyncio.Task[httpx.Response]] = set()
        while len(finished) < 19:
            done, _ = await asyncio.wait(set(tasks) - finished, timeout=20, return_when=asyncio.FIRST_COMPLETED)
            assert done, f"only {len(finished)} duplicates were answered"
            finished |= done
        assert effects.count == 1
        effects.gate.set()
        responses = await asyncio.gather(*tasks)
        await store.wait_finished(1)
        statuses = sorted(r.status_code for r in responses)
        assert statuses == [201] + [409] * 19, statuses
        for response in responses:
            if response.status_code == 409:
                assert response.headers["content-type"] == "application/problem+json"
                assert response.json()["type"] == "urn:outbox:problem:request-in-progress"
                assert int(response.headers["retry-after"]) >= 1
        assert effects.count == 1
        late = await client.post("/items", content=b'{"order": 7}', headers=headers)
        assert late.status_code == 201 and replayed(late)
    assert effects.count == 1


async def test_twenty_free_running_duplicates_over_a_socket_never_5xx(serve: Any, tmp_path: Path) -> None:
    effects = Effects()
    inner = SqliteRecordStore(tmp_path / "free.db")
    store = Watched(inner)
    server = serve(IdempotencyMiddleware(make_app(effects), store))
    headers = {**JSON, "idempotency-key": "order-8"}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        responses = await asyncio.gather(*(client.post("/items", content=b'{"order": 8}', headers=headers)
                                           for _ in range(20)))
    await store.wait_finished(1)
    assert effects.count == 1
    assert all(r.status_code < 500 for r in responses), [r.status_code for r in responses]
    ran = [r for r in responses if r.status_code == 201 and not replayed(r)]
    assert len(ran) == 1
    for response in responses:
        assert (response.status_code == 409 or (response.status_code == 201 and replayed(response))
                or response is ran[0])


async def test_end_to_end_first_run_replay_mismatch_and_malformed_over_a_socket(serve: Any, tmp_path: Path) -> None:
    effects = Effects()
    inner = SqliteRecordStore(tmp_path / "e2e.db")
    store = Watched(inner)
    server = serve(IdempotencyMiddleware(make_app(effects), store))
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        first = await client.post("/items", json={"a": 1, "b": 2}, headers={"idempotency-key": '"e2e"'})
        assert first.status_code == 201 and first.json()["epoch"] == 1
        await store.wait_finished(1)
        again = await client.post("/items", content=b'{ "b": 2, "a": 1 }',
                                  headers={**JSON, "idempotency-key": "e2e"})
        assert again.status_code == 201 and replayed(again) and again.content == first.content
        assert "set-cookie" not in again.headers and "authorization" not in again.headers
        assert_problem(await client.post("/items", json={"a": 1, "b": "2"}, headers={"idempotency-key": "e2e"}),
                       422, "idempotency-key-reused")
        assert_problem(await client.post("/items", json={}, headers=[("idempotency-key", "x"),
                                                                      ("idempotency-key", "y")]),
                       400, "malformed-idempotency-key")
        assert_problem(await client.post("/items", json={}), 400, "missing-idempotency-key")
        assert (await client.get("/items")).status_code == 201  # passes through
        assert effects.count == 2
    server.stop()  # lifespan shutdown: the middleware closes its store
    with pytest.raises(StoreUnavailable):
        await inner.get(identity("default", "e2e"))
    # what the other receivers sharing the file see
    reader = SqliteRecordStore(tmp_path / "e2e.db")
    await reader.open()
    try:
        record = await reader.get(identity("default", "e2e"))
        assert (record.state, record.epoch, record.response.status) == (State.COMPLETED, 1, 201)
    finally:
        await reader.close()


async def test_end_to_end_streamed_chunks_fingerprint_like_one_body(serve: Any, tmp_path: Path) -> None:
    effects = Effects()
    inner = SqliteRecordStore(tmp_path / "chunks.db")
    store = Watched(inner)
    server = serve(IdempotencyMiddleware(make_app(effects), store))

    async def chunks() -> AsyncIterator[bytes]:
        for piece in (b'{"lines": [', b"1, 2", b", 3]", b"}"):
            yield piece

    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        streamed = await client.post("/items", content=chunks(), headers={**JSON, "idempotency-key": "s"})
        assert streamed.status_code == 201
        assert effects.calls[0].body == b'{"lines": [1, 2, 3]}'
        assert "content-length" not in effects.calls[0].headers  # really chunked
        await store.wait_finished(1)
        whole = await client.post("/items", content=b'{"lines": [1, 2, 3]}', headers={**JSON, "idempotency-key": "s"})
        assert replayed(whole) and whole.content == streamed.content
    assert effects.count == 1


async def test_end_to_end_probe_and_fences_over_a_socket(serve: Any, tmp_path: Path) -> None:
    effects = Effects()
    inner = SqliteRecordStore(tmp_path / "probe.db")
    store = Watched(inner)
    server = serve(IdempotencyMiddleware(make_app(effects), store, secrets=SECRET))

    def probe(key: str, fence: int) -> tuple[bytes, dict[str, str]]:
        body = json.dumps({"key": key, "fence": fence}).encode()
        return body, signed(key, body, time.time(), extra={"outbox-reconcile": "probe", "outbox-fence": str(fence)})

    def request(key: str, body: bytes, fence: int) -> dict[str, str]:
        return signed(key, body, time.time(), extra={"outbox-fence": str(fence)})

    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        body, headers = probe("p1", 2)
        absent = await client.post("/items", content=body, headers=headers)
        assert absent.json() == {"state": "absent", "key": "p1", "fence": 2}
        assert_problem(await client.post("/items", content=b'{"n": 1}', headers=request("p1", b'{"n": 1}', 1)),
                       409, "stale-fence")
        done = await client.post("/items", content=b'{"n": 2}', headers=request("p2", b'{"n": 2}', 1))
        await store.wait_finished(1)
        body, headers = probe("p2", 2)
        completed = (await client.post("/items", content=body, headers=headers)).json()
        assert completed["state"] == "completed" and completed["response"]["status"] == 201
        assert base64.b64decode(completed["response"]["body"]) == done.content
    assert effects.count == 1
