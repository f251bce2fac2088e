"""Properties of the receivers' middleware over random traffic, so the defects found by review
(a 503 for a body that can never succeed, a probe that reads or fences without authority) stay
fixed: whatever the keys, bodies, fences, methods and probe headers, the middleware itself never
answers 5xx, a probe never reaches the app, a probe that is not a signed POST neither reads nor
changes a record, and a handler whose answer completed the record (any status outside
``RELEASE_STATUSES``) never runs again for the same (scope, key).

Each example is a short sequence of requests against a fresh middleware, on a real SQLite file
or in memory. Bounded and derandomized, so the run is the same every time and takes seconds.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from receivers import RELEASE_STATUSES, IdempotencyMiddleware, MemoryRecordStore, SqliteRecordStore
from receivers.keys import MalformedFence, MalformedKey, identity, json_depth_exceeds, parse_fence, parse_key
from receivers.wire import sign
from receivers.wsgi import IdempotencyMiddleware as WsgiIdempotencyMiddleware

from .conftest import T0, Clock

SECRET = "whsec_" + base64.b64encode(b"p" * 32).decode()
OTHER_SECRET = "whsec_" + base64.b64encode(b"q" * 32).decode()
BOUNDED = settings(max_examples=100, deadline=None, derandomize=True, database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# -- what the traffic is made of ---------------------------------------------------------------

VALID_KEYS = ["k1", "k2", '"k1"', "order-7/acme", "a" * 255]
INVALID_KEYS = ["", " ", '""', '"a b"', "clé", "a" * 256, '"a\\b"', '"a"b"', "\x00"]
keys = st.one_of(st.sampled_from(VALID_KEYS), st.sampled_from(INVALID_KEYS), st.none(),
                 st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=6))

NAMES = st.text(max_size=3)


def containers(inner: st.SearchStrategy[Any], names: st.SearchStrategy[str] = NAMES) -> Any:
    return st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3)


def dumped(value: Any) -> bytes:
    return json.dumps(value).encode()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5), containers,
    max_leaves=6)
bodies = st.one_of(
    st.sampled_from([
        b'{"invoice": 42}', b'{ "invoice" : 42 }', b'{"invoice": 42.0}', b"", b"{}", b"[]",
        b"[" * 100_000, b"[" * 64 + b"]" * 64, b"[" * 65 + b"]" * 65, b'{"a":' * 70 + b"1" + b"}" * 70,
        b'"\\ud800"', b'{"\\udfff": 1}', b'["x\\ud800y"]', b'{"a": [1, 2', b"\xff\xfe[", b"NaN",
        b"1" * 5000,  # longer than Python converts to an int
    ]),
    json_values.map(dumped),
    st.binary(max_size=40),
)
fences = st.one_of(st.none(), st.integers(0, 10), st.just(10**18 - 1), st.integers(0, 10**18 - 1).map(str),
                   st.sampled_from(["-1", "abc", "1" * 19, "1.5", "", "\xb2", " 7 "]))
methods = st.sampled_from(["POST", "POST", "POST", "PATCH", "GET", "PUT", "DELETE"])
media_types = st.sampled_from(["application/json", "application/json", "application/problem+json",
                               "text/plain", None])
#: What the handler answers (x-mode, not part of the fingerprint).
modes = st.sampled_from(["201", "201", "400", "404", "409", "429", "503", "raise"])
#: none: a plain request; signed: the probe as the sender makes it; the others lie in one way each.
probes = st.sampled_from(["none", "none", "none", "signed", "unsigned", "forged", "other-key", "other-fence",
                          "empty-body"])


@dataclass
class Traffic:
    key: str | None
    body: bytes
    fence: int | str | None
    method: str
    media_type: str | None
    mode: str
    probe: str
    signed: bool


traffic = st.builds(Traffic, keys, bodies, fences, methods, media_types, modes, probes,
                    st.sampled_from([True, True, True, False]))


def headers_for(request: Traffic, at: float) -> tuple[bytes, list[tuple[str, str]]]:
    """The body and headers to send (header values latin-1, as they travel)."""
    body, headers = request.body, [("x-mode", request.mode)]
    if request.media_type is not None:
        headers.append(("content-type", request.media_type))
    if request.key is not None:
        headers.append(("idempotency-key", request.key))
    if request.fence is not None:
        headers.append(("outbox-fence", str(request.fence)))
    msg_id = request.key or ""
    if request.probe != "none":
        headers.append(("outbox-reconcile", "probe"))
        fence = request.fence if isinstance(request.fence, int) else 0
        asked = {"key": msg_id, "fence": fence}
        if request.probe == "other-key":
            asked["key"] = msg_id + "x"
        elif request.probe == "other-fence":
            asked["fence"] = fence + 1
        body = b"" if request.probe == "empty-body" else json.dumps(asked).encode()
    if request.signed and request.probe != "unsigned":
        secret = OTHER_SECRET if request.probe == "forged" else SECRET
        stamp = int(at)
        headers += [("webhook-id", msg_id), ("webhook-timestamp", str(stamp)),
                    ("webhook-signature", sign((secret,), msg_id, stamp, body))]
    return body, headers


# -- the app behind the middleware: each run of its handler is a side effect -------------------


@dataclass
class Runs:
    #: (scope, key) of each run under a claim; None for a request that passed through.
    made: list[tuple[str, str] | None] = field(default_factory=list)
    answered: dict[int, int] = field(default_factory=dict)  # run index -> status it answered


def asgi_app(runs: Runs) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        context = scope.get("state", {}).get("idempotency")
        runs.made.append((context.scope, context.key) if context else None)
        mode = dict(scope["headers"]).get(b"x-mode", b"201").decode()
        if mode == "raise":
            raise RuntimeError("the handler failed")
        runs.answered[len(runs.made) - 1] = int(mode)
        await send({"type": "http.response.start", "status": int(mode), "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": f"run {len(runs.made)}".encode()})

    return app


class Checker:
    """Checks each answer against the properties, remembering which keys completed."""

    def __init__(self, runs: Runs) -> None:
        self.runs = runs
        self.completed: set[tuple[str, str]] = set()

    def check(self, request: Traffic, status: int, before: int) -> None:
        new_runs = list(range(before, len(self.runs.made)))
        assert len(new_runs) <= 1
        if request.probe != "none":
            assert not new_runs, f"a probe reached the app: {request}"
        if status >= 500:
            # only the handler's own 5xx (or its exception) may come back as one
            assert new_runs and self.runs.answered.get(new_runs[0], 500) >= 500, (status, request)
        for run in new_runs:
            claimed = self.runs.made[run]
            if claimed is None:
                continue  # passed through, not covered
            assert claimed not in self.completed, f"the handler ran twice for {claimed}: {request}"
            if self.runs.answered.get(run, 500) not in RELEASE_STATUSES:
                self.completed.add(claimed)


# -- ASGI over a real SQLite file and in memory --------------------------------------------------


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="receivers-properties-") as where:
        yield Path(where)


def asgi_scenario(kind: str, where: Path, secrets: str | None, required: bool, requests: list[Traffic]) -> None:
    async def run() -> None:
        store = MemoryRecordStore() if kind == "memory" else SqliteRecordStore(
            where / f"{uuid.uuid4().hex}.db")
        runs, clock = Runs(), Clock(T0)
        middleware = IdempotencyMiddleware(asgi_app(runs), store, secrets=secrets, required=required, clock=clock)
        checker = Checker(runs)
        transport = httpx.ASGITransport(app=middleware, raise_app_exceptions=False)
        try:
            await middleware.idempotency.ready()
            async with httpx.AsyncClient(transport=transport, base_url="http://receiver.test") as client:
                for request in requests:
                    body, headers = headers_for(request, clock.now.timestamp())
                    before = len(runs.made)
                    ident = _identity(request.key)
                    record = await store.get(ident) if ident else None
                    response = await client.request(
                        request.method, "/hook", content=body,
                        headers=[(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers])
                    checker.check(request, response.status_code, before)
                    verified = (secrets is not None and request.signed and request.probe == "signed"
                                and request.method == "POST")
                    if request.probe != "none" and not verified:
                        # a probe that proves nothing neither reads nor fences anything
                        assert b"run " not in response.content, (response.content, request)
                        assert ident is None or await store.get(ident) == record, request
                    clock.advance(1)
        finally:
            await middleware.idempotency.aclose()

    asyncio.run(run())


def _identity(key: str | None) -> str | None:
    try:
        parsed = parse_key([key] if key is not None else [])
    except MalformedKey:
        return None
    return identity("default", parsed) if parsed is not None else None


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
@BOUNDED
@given(secrets=st.sampled_from([None, SECRET]), required=st.booleans(),
       requests=st.lists(traffic, min_size=1, max_size=10))
def test_random_traffic_never_gets_a_5xx_nor_a_second_run_asgi(
        kind: str, scratch: Path, secrets: str | None, required: bool, requests: list[Traffic]) -> None:
    asgi_scenario(kind, scratch, secrets, required, requests)


# -- WSGI, in memory --------------------------------------------------------------------------


def wsgi_app(runs: Runs) -> Any:
    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        environ["wsgi.input"].read()
        context = environ.get("idempotency")
        runs.made.append((context.scope, context.key) if context else None)
        mode = environ.get("HTTP_X_MODE", "201")
        if mode == "raise":
            start_response("500 Internal Server Error", [("content-type", "text/plain")])
            return [b"failed"]  # what a framework makes of an exception
        runs.answered[len(runs.made) - 1] = int(mode)
        start_response(f"{mode} Whatever", [("content-type", "text/plain")])
        return [f"run {len(runs.made)}".encode()]

    return app


@settings(BOUNDED, max_examples=60)
@given(secrets=st.sampled_from([None, SECRET]), requests=st.lists(traffic, min_size=1, max_size=8))
def test_random_traffic_never_gets_a_5xx_nor_a_second_run_wsgi(secrets: str | None, requests: list[Traffic]) -> None:
    from werkzeug.test import Client

    runs, clock = Runs(), Clock(T0)
    middleware = WsgiIdempotencyMiddleware(wsgi_app(runs), MemoryRecordStore(), secrets=secrets, clock=clock)
    checker = Checker(runs)
    try:
        client = Client(middleware)
        for request in requests:
            body, headers = headers_for(request, clock.now.timestamp())
            before = len(runs.made)
            response = client.open("/hook", method=request.method, data=body, headers=headers)
            checker.check(request, response.status_code, before)
            clock.advance(1)
    finally:
        middleware.close()


# -- the nesting count agrees with the parser ---------------------------------------------------


def depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    return 0


TRICKY = st.text(st.sampled_from('[]{}"\\ab'), max_size=6)  # brackets, quotes and escapes inside strings


def tricky_containers(inner: st.SearchStrategy[Any]) -> Any:
    return containers(inner, TRICKY)


nested = st.recursive(st.none() | st.integers() | TRICKY, tricky_containers, max_leaves=20)


@settings(BOUNDED, max_examples=200)
@given(value=nested, limit=st.integers(0, 8), indent=st.sampled_from([None, 1]))
def test_the_nesting_count_matches_the_parsed_depth(value: Any, limit: int, indent: int | None) -> None:
    text = json.dumps(value, indent=indent).encode()
    assert json_depth_exceeds(text, limit) == (depth(value) > limit), text


# -- the key's and the fence's grammar ---------------------------------------------------------

#: The grammar as the README states it, spelled as regular expressions (the parsers use string
#: methods, which must accept exactly the same texts).
KEY_GRAMMAR = re.compile(r"[\x21-\x7e]{1,255}")
FENCE_GRAMMAR = re.compile(r"[0-9]{1,18}")
#: Texts near the edges: ASCII controls, space and DEL, Latin-1, digits of other scripts
#: (Arabic-Indic, superscripts, fullwidth: str.isdigit says yes to them), long runs.
EDGY = st.text(st.sampled_from("a9Z~!\x00\t \x7f\x80é٣²９\"\\"), max_size=20) | st.text(max_size=8) | \
    st.integers(0, 300).map(lambda n: "k" * n) | st.integers(0, 10**20).map(str)


@settings(BOUNDED, max_examples=400)
@given(text=EDGY)
def test_a_key_is_accepted_exactly_when_the_grammar_says(text: str) -> None:
    unquoted = text.strip()
    try:
        parsed = parse_key([text])
    except MalformedKey:
        parsed = None
    if not (unquoted.startswith('"') and len(unquoted) >= 2 and unquoted.endswith('"')):
        assert (parsed is not None) == bool(KEY_GRAMMAR.fullmatch(unquoted)), repr(text)
    if parsed is not None:
        assert KEY_GRAMMAR.fullmatch(parsed), repr(text)


@settings(BOUNDED, max_examples=400)
@given(text=EDGY)
def test_a_fence_is_accepted_exactly_when_the_grammar_says(text: str) -> None:
    try:
        parsed = parse_fence([text])
    except MalformedFence:
        parsed = None
    assert (parsed is not None) == bool(FENCE_GRAMMAR.fullmatch(text.strip())), repr(text)
    if parsed is not None:
        assert parsed == int(text.strip()) < 10**18
