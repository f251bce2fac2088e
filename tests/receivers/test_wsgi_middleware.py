"""The same idempotency contract through ``receivers.wsgi.IdempotencyMiddleware`` around a Flask
app: Flask's test client for the table, a real threaded wsgiref server on 127.0.0.1 end to end."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import httpx
import pytest
from flask import Flask, jsonify, request

from receivers import RELEASE_STATUSES, MemoryRecordStore, SqliteRecordStore, State
from receivers.keys import identity
from receivers.wsgi import IdempotencyMiddleware

from ..problems import assert_problem
from .conftest import Clock, Watched

JSON = "application/json"
SECRET = "whsec_" + base64.b64encode(b"w" * 32).decode()


def signature_headers(key: str, body: bytes, at: float, secret: str = SECRET) -> dict[str, str]:
    from receivers.wire import sign

    stamp = int(at)
    return {"webhook-id": key, "webhook-timestamp": str(stamp), "webhook-signature": sign((secret,), key, stamp, body)}


@dataclass
class Effects:
    calls: list[tuple[str, bytes, Any]] = field(default_factory=list)  # (path, body, environ["idempotency"])
    lock: threading.Lock = field(default_factory=threading.Lock)
    entered: threading.Event = field(default_factory=threading.Event)
    gate: threading.Event = field(default_factory=threading.Event)

    @property
    def count(self) -> int:
        return len(self.calls)


def make_flask(effects: Effects) -> Flask:
    app = Flask("receivers-wsgi-test")

    @app.route("/items", methods=["GET", "POST", "PATCH"])
    @app.route("/other", methods=["POST"])
    def items() -> Any:
        context = request.environ.get("idempotency")
        with effects.lock:
            effects.calls.append((request.path, request.get_data(), context))
            n = effects.count
        mode = request.headers.get("x-mode", "ok")
        if mode == "gate":
            effects.entered.set()
            assert effects.gate.wait(20), "the test never opened the gate"
        if mode == "raise":
            raise RuntimeError("the handler failed")
        if mode == "503":
            return jsonify(error="try later"), 503
        if mode == "400":
            return jsonify(error="bad invoice"), 400
        if mode == "status":
            return jsonify(n=n), int(request.headers["X-Status"])
        response = jsonify(n=n, epoch=context.epoch if context else None, key=context.key if context else None,
                           scope=context.scope if context else None)
        response.status_code = 201
        response.headers["X-Custom"] = "kept"
        response.headers["Authorization"] = "Bearer secret-token"
        response.set_cookie("session", "s3cret")
        return response

    return app


@dataclass
class Harness:
    flask: Flask
    middleware: IdempotencyMiddleware
    store: Any
    effects: Effects
    clock: Clock
    path: Path | None  # the SQLite file, if any

    @property
    def client(self) -> Any:
        return self.flask.test_client()

    def post(self, key: str | None, payload: Any = None, *, path: str = "/items", mode: str | None = None,
             fence: int | None = None, method: str = "POST", data: bytes | None = None,
             headers: dict[str, str] | None = None) -> Any:
        sent = dict(headers or {})
        body = data if data is not None else json.dumps({"invoice": 42} if payload is None else payload).encode()
        if key is not None:
            sent["Idempotency-Key"] = key
            if self.middleware.idempotency.secrets is not None:
                sent.update(signature_headers(key, body, self.clock.now.timestamp()))
        if mode is not None:
            sent["X-Mode"] = mode
        if fence is not None:
            sent["Outbox-Fence"] = str(fence)
        return self.client.open(path, method=method, data=body, headers=sent, content_type=JSON)

    def probe(self, key: str, fence: int, *, method: str = "POST") -> Any:
        body = json.dumps({"key": key, "fence": fence}).encode()
        headers = {"Outbox-Reconcile": "probe", "Idempotency-Key": key, "Outbox-Fence": str(fence),
                   **signature_headers(key, body, self.clock.now.timestamp())}
        return self.client.open("/items", method=method, data=body, headers=headers, content_type=JSON)

    def record(self, key: str, scope: str = "default") -> Any:
        """The record as another process sharing the store would read it."""
        if self.path is None:
            return asyncio.run(self.store.get(identity(scope, key)))

        async def read() -> Any:
            reader = SqliteRecordStore(self.path)
            await reader.open()
            try:
                return await reader.get(identity(scope, key))
            finally:
                await reader.close()

        return asyncio.run(read())


@pytest.fixture(params=["memory", "sqlite"])
def build(request: pytest.FixtureRequest, tmp_path: Path, clock: Clock) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def build(*, testing: bool = False, **options: Any) -> Harness:
        path = tmp_path / f"wsgi-{len(made)}.db" if request.param == "sqlite" else None
        store = MemoryRecordStore() if path is None else SqliteRecordStore(path)
        effects = Effects()
        flask = make_flask(effects)
        flask.testing = testing  # testing: exceptions propagate through the middleware
        middleware = IdempotencyMiddleware(flask.wsgi_app, store, clock=clock, **options)
        flask.wsgi_app = middleware  # type: ignore[method-assign]
        harness = Harness(flask, middleware, store, effects, clock, path)
        made.append(harness)
        return harness

    yield build
    for harness in made:
        harness.effects.gate.set()
        harness.middleware.close()


def replayed(response: Any) -> bool:
    return response.headers.get("Idempotent-Replayed") == "true"


def test_first_request_runs_and_the_handler_sees_its_context(build: Any) -> None:
    h = build()
    response = h.post("k-1")
    assert response.status_code == 201
    assert response.get_json() == {"n": 1, "epoch": 1, "key": "k-1", "scope": "default"}
    (path, body, context), = h.effects.calls
    assert (path, body) == ("/items", b'{"invoice": 42}')  # the app still reads the body
    assert (context.scope, context.key, context.epoch) == ("default", "k-1", 1)
    assert not replayed(response)
    assert h.record("k-1").state is State.COMPLETED


def test_a_replay_answers_the_same_response_without_running_the_handler(build: Any) -> None:
    h = build()
    first = h.post("k-1")
    assert "session=s3cret" in first.headers["Set-Cookie"]
    again = h.post("k-1", {"invoice": 42})
    assert again.status_code == 201 and replayed(again)
    assert again.get_data() == first.get_data()
    assert again.headers["X-Custom"] == "kept" and again.headers["Content-Type"] == first.headers["Content-Type"]
    assert "Set-Cookie" not in again.headers and "Authorization" not in again.headers
    assert h.effects.count == 1
    # reordered JSON is the same request; a quoted key is the same key
    assert replayed(h.post('"k-1"', data=b'{ "invoice" : 42 }'))
    assert h.effects.count == 1


def test_the_same_key_for_another_request_is_422(build: Any) -> None:
    h = build()
    h.post("k")
    before = h.record("k")
    assert_problem(h.post("k", {"invoice": 43}), 422, "idempotency-key-reused")
    assert_problem(h.post("k", {"invoice": "42"}), 422, "idempotency-key-reused")
    assert_problem(h.post("k", path="/other"), 422, "idempotency-key-reused")
    assert_problem(h.post("k", method="PATCH"), 422, "idempotency-key-reused")
    assert h.effects.count == 1
    assert h.record("k") == before


def test_a_missing_or_malformed_key_is_400_and_the_handler_does_not_run(build: Any) -> None:
    h = build()
    assert_problem(h.post(None), 400, "missing-idempotency-key")
    assert_problem(h.post("x" * 256), 400, "malformed-idempotency-key")
    assert_problem(h.post('""'), 400, "malformed-idempotency-key")
    assert h.effects.count == 0
    # GET passes through, key or not
    assert h.client.get("/items", headers={"Idempotency-Key": "k"}).status_code == 201
    assert h.effects.count == 1 and h.effects.calls[0][2] is None


def test_a_missing_key_passes_through_when_not_required(build: Any) -> None:
    h = build(required=False)
    assert h.post(None).status_code == 201
    assert h.post(None).status_code == 201
    assert [context for _, _, context in h.effects.calls] == [None, None]
    assert h.effects.calls[1][1] == b'{"invoice": 42}'


@pytest.mark.parametrize("status", [404, 405, 408, 425, 429, 500, 503, 504])
def test_a_response_that_says_nothing_ran_or_come_back_releases_the_key(build: Any, status: int) -> None:
    h = build()
    assert h.post("k", mode="status", headers={"X-Status": str(status)}).status_code == status
    assert h.record("k").state is State.ABSENT
    retry = h.post("k")
    assert retry.status_code == 201 and not replayed(retry)
    assert retry.get_json()["epoch"] == 2
    assert h.effects.count == 2


@pytest.mark.parametrize(("path", "method", "status"), [("/itmes", "POST", 404), ("/other", "PATCH", 405)])
def test_flasks_routing_answer_releases_the_key_so_the_right_request_runs(
        build: Any, path: str, method: str, status: int) -> None:
    """A sender's typo in the URL (or a method the route does not take): no handler ran."""
    h = build()
    assert h.post("k", path=path, method=method).status_code == status and h.effects.count == 0
    assert h.record("k").state is State.ABSENT
    fixed = h.post("k")
    assert fixed.status_code == 201 and not replayed(fixed)
    assert h.effects.count == 1


@pytest.mark.parametrize("status", [200, 202, 400, 409, 422])
def test_every_other_response_completes_and_is_replayed(build: Any, status: int) -> None:
    h = build()
    assert h.post("k", mode="status", headers={"X-Status": str(status)}).status_code == status
    again = h.post("k")
    assert again.status_code == status and replayed(again)
    assert h.effects.count == 1


def test_which_statuses_release_is_the_release_statuses_option(build: Any) -> None:
    h = build(release_statuses=RELEASE_STATUSES - {404})
    assert h.post("k", path="/itmes").status_code == 404
    stored = h.post("k", path="/itmes")
    assert stored.status_code == 404 and replayed(stored)


def test_a_handler_that_raises_releases_the_key(build: Any) -> None:
    h = build()  # Flask turns the exception into a 500
    assert h.post("k", mode="raise").status_code == 500
    assert h.post("k").status_code == 201
    propagating = build(testing=True)  # the exception goes through the middleware
    with pytest.raises(RuntimeError):
        propagating.post("k", mode="raise")
    assert propagating.record("k").state is State.ABSENT
    assert propagating.post("k").get_json()["epoch"] == 2
    assert (h.effects.count, propagating.effects.count) == (2, 2)


def test_a_4xx_response_completes_and_is_replayed(build: Any) -> None:
    h = build()
    assert h.post("k", mode="400").status_code == 400
    again = h.post("k")
    assert again.status_code == 400 and replayed(again) and again.get_json() == {"error": "bad invoice"}
    assert h.effects.count == 1


def test_fences_probe_and_retention_with_an_injected_clock(build: Any) -> None:
    h = build(retention_seconds=100, secrets=SECRET, signature_tolerance_seconds=3600)
    first = h.post("k", fence=3)
    assert replayed(h.post("k", fence=2))  # completed: replayed whatever the fence
    answer = h.probe("k", 4).get_json()
    assert (answer["state"], answer["fence"], answer["response"]["status"]) == ("completed", 4, 201)
    assert base64.b64decode(answer["response"]["body"]) == first.get_data()
    assert h.probe("new", 5).get_json() == {"state": "absent", "key": "new", "fence": 5}
    assert_problem(h.post("new", fence=1), 409, "stale-fence")  # it would run: fenced out
    assert h.effects.count == 1
    h.clock.advance(100, microseconds=-1)
    assert replayed(h.post("k", fence=4))
    assert_problem(h.post("new", fence=1), 409, "stale-fence")
    h.clock.advance(microseconds=1)  # both records' retention is over: fence and all
    assert h.post("k", fence=1).get_json()["epoch"] == 2
    assert h.post("new", fence=1).status_code == 201
    assert h.effects.count == 3


def test_the_probe_is_post_only_signed_and_off_without_secrets(build: Any) -> None:
    h = build(secrets=SECRET)
    h.post("k")
    for method in ("GET", "PUT", "PATCH"):
        response = h.probe("k", 9, method=method)
        assert_problem(response, 405, "method-not-allowed")
        assert response.headers["Allow"] == "POST"
    unsigned = h.client.post("/items", data=b'{"key": "k", "fence": 9}', content_type=JSON,
                             headers={"Outbox-Reconcile": "probe", "Idempotency-Key": "k", "Outbox-Fence": "9"})
    assert_problem(unsigned, 401, "invalid-signature")
    assert h.record("k").min_fence == 0
    off = build()
    assert_problem(off.probe("k", 9), 403, "probe-disabled")
    assert off.record("k") is None
    assert h.effects.count == 1 and off.effects.count == 0


def test_a_json_body_that_cannot_be_fingerprinted_is_400_not_503(build: Any) -> None:
    h = build()
    for body in (b"[" * 100_000, b'{"a": "\\ud800"}'):
        assert_problem(h.post("k", data=body), 400, "invalid-json-body")
    assert h.record("k") is None and h.effects.count == 0


def test_a_malformed_content_length_is_400_not_500(build: Any) -> None:
    h = build()
    for value in ("abc", "-1", "²"):
        response = h.client.post("/items", data=b"{}", content_type=JSON,
                                 environ_overrides={"CONTENT_LENGTH": value}, headers={"Idempotency-Key": "k"})
        assert_problem(response, 400, "malformed-content-length")
    assert h.effects.count == 0


def test_a_body_over_the_limit_is_413_and_an_unavailable_store_503(build: Any) -> None:
    h = build(max_body_bytes=10)
    assert_problem(h.post("k", data=b"x" * 11), 413, "payload-too-large")
    assert h.record("k") is None
    assert h.effects.count == 0
    memory = MemoryRecordStore()
    effects = Effects()
    app = make_flask(effects)
    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, memory)  # type: ignore[method-assign]
    try:
        memory.available = False
        response = app.test_client().post("/items", data=b"{}", content_type=JSON, headers={"Idempotency-Key": "k"})
        assert_problem(response, 503, "store-unavailable")
        assert effects.count == 0
    finally:
        app.wsgi_app.close()  # type: ignore[attr-defined]


# -- a real WSGI server ----------------------------------------------------------------------


class ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_end_to_end_over_a_threaded_wsgiref_server(tmp_path: Path, clock: Clock) -> None:
    effects = Effects()
    flask = make_flask(effects)
    store = Watched(SqliteRecordStore(tmp_path / "served.db"))
    middleware = IdempotencyMiddleware(flask.wsgi_app, store, clock=clock, lease_seconds=30)
    server = make_server("127.0.0.1", 0, middleware, server_class=ThreadingServer, handler_class=QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/items"
    try:
        with httpx.Client(timeout=30) as client:
            headers = {"content-type": JSON, "idempotency-key": "w1", "x-mode": "gate"}

            def post() -> httpx.Response:
                return client.post(url, content=b'{"order": 1}', headers=headers)

            with ThreadPoolExecutor(10) as pool:
                first = pool.submit(post)
                assert effects.entered.wait(10)
                duplicates = [pool.submit(post) for _ in range(9)]
                busy = [future.result(20) for future in duplicates]  # answered while the handler is held
                effects.gate.set()
                done = first.result(20)
            assert done.status_code == 201 and done.json()["epoch"] == 1
            assert [r.status_code for r in busy] == [409] * 9
            assert all(r.headers["content-type"] == "application/problem+json" and r.headers["retry-after"] == "30"
                       for r in busy)
            # the outcome is recorded after the body went out: wait for it, then it replays
            asyncio.run(store.wait_finished(1))
            again = client.post(url, content=b'{"order": 1}', headers={**headers, "x-mode": "ok"})
            assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
            assert again.content == done.content and "set-cookie" not in again.headers
            mismatch = client.post(url, content=b'{"order": 2}', headers=headers)
            assert mismatch.status_code == 422 and mismatch.headers["content-type"] == "application/problem+json"
            assert client.post(url, content=b"{}", headers={"content-type": JSON}).status_code == 400
        assert effects.count == 1
    finally:
        server.shutdown()
        server.server_close()
        middleware.close()
