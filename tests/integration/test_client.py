"""``outbox.client`` against a real ``outbox serve`` (uvicorn on loopback, a real SQLite file, the
embedded worker delivering to a real receiver); a tiny real proxy in front injects exact faults."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest

from outbox import DestinationSpec, Outbox, Role, Settings
from outbox.client import (
    AsyncClient,
    Client,
    Conflict,
    Enqueued,
    Forbidden,
    IntentConflict,
    InvalidInput,
    NotFound,
    OutboxError,
    RetryPolicy,
    Unauthorized,
    Unavailable,
    UnknownDestination,
    WaitTimeout,
)
from outbox.errors import IntentConflict as LibraryIntentConflict
from outbox.errors import InvalidInput as LibraryInvalidInput

from ..receiver import Receiver, Reply
from ..servers import Served
from .conftest import SECRET

FAST = RetryPolicy(attempts=4, initial_seconds=0.01, max_seconds=2.0)


@dataclass
class Service:
    url: str
    producer: str  # scope acme
    operator: str
    db_path: Path


@pytest.fixture
async def service(tmp_path: Path, receiver: Receiver, serve_api) -> AsyncIterator[Service]:
    """A served outbox whose worker delivers ``hook`` to a receiver answering 200, and whose
    ``silent`` destination (never granted) is revoked at once; ``parked`` requires approval."""
    receiver.script("/hook", Reply(200, headers={"External-Id": "rcpt"}))
    db_path = tmp_path / "client.db"
    async with await Outbox.open(f"sqlite:///{db_path}") as box:
        for name, extra in (("hook", {}), ("parked", {"requires_approval": True})):
            await box.put_destination(name, DestinationSpec(url=f"{receiver.url}/hook", secret=SECRET,
                                                            allow_private_network=True, timeout_seconds=5, **extra))
        producer, _ = await box.create_token(Role.PRODUCER, ["acme"])
        operator, _ = await box.create_token(Role.OPERATOR)
    url = serve_api(Settings(database_url=f"sqlite:///{db_path}", worker=True, authority="allow-all",
                             poll_seconds=0.05))
    yield Service(url, producer, operator, db_path)


def intents_in(db_path: Path) -> list[str]:
    import sqlite3

    with sqlite3.connect(db_path) as conn:
        return sorted(row[0] for row in conn.execute("SELECT action_id FROM intents"))


# -- the blocking client ----------------------------------------------------------------------


async def test_enqueue_get_and_wait_for_delivery(service: Service, receiver: Receiver):
    with Client(service.url, token=service.producer) as outbox:
        sent = outbox.enqueue("hook", {"invoice": 1}, scope="acme", action_id="inv-1")
        again = outbox.enqueue("hook", {"invoice": 1}, scope="acme", action_id="inv-1")
        generated = outbox.enqueue("hook", {"invoice": 2}, scope="acme")
        settled = outbox.wait("inv-1", scope="acme", timeout=20)
        shown = outbox.get("inv-1")
    assert sent.created and sent.intent.status == "pending" and sent.intent.payload == {"invoice": 1}
    assert not again.created and again.intent.payload_digest == sent.intent.payload_digest
    assert generated.created and len(generated.intent.action_id) == 36 and generated.intent.action_id[14] == "7"
    assert settled.status == "delivered" and settled.settled
    [attempt] = settled.attempts
    assert attempt["outcome"] == "delivered" and attempt["external_id"] == "rcpt"
    assert shown.status == "delivered" and shown.events[-1]["kind"] == "delivered"
    assert "acme/inv-1" in [r.headers["idempotency-key"] for r in receiver.requests("/hook")]


async def test_wait_times_out_with_the_intent_as_it_stands(service: Service):
    with Client(service.url, token=service.producer) as outbox:
        outbox.enqueue("parked", {"n": 1}, scope="acme", action_id="held-1")
        began = time.monotonic()
        with pytest.raises(WaitTimeout) as timed_out:
            outbox.wait("held-1", scope="acme", timeout=0.5)
    assert 0.5 <= time.monotonic() - began < 5
    assert timed_out.value.intent.status == "held" and isinstance(timed_out.value, TimeoutError)
    assert "held" in str(timed_out.value)


async def test_wait_returns_an_unknown_outcome_with_its_evidence(service: Service, receiver: Receiver):
    receiver.script("/slow", Reply(200, delay=2))
    async with await Outbox.open(f"sqlite:///{service.db_path}") as box:  # late, and not idempotent
        await box.put_destination("slow", DestinationSpec(url=f"{receiver.url}/slow", secret=SECRET,
                                                          allow_private_network=True, timeout_seconds=0.3,
                                                          idempotent=False))
    with Client(service.url, token=service.producer) as outbox:
        outbox.enqueue("slow", {"n": 1}, scope="acme", action_id="late-1")
        settled = outbox.wait("late-1", scope="acme", timeout=20)
    assert settled.status == "unknown" and settled.settled
    [attempt] = settled.attempts
    assert attempt["submission"] == "maybe_submitted" and attempt["outcome"] == "unknown"


async def test_list_iterates_every_page(service: Service):
    with Client(service.url, token=service.producer) as outbox:
        results = outbox.enqueue_many({"destination": "parked", "scope": "acme", "action_id": f"p-{n:02d}",
                                       "payload": {"n": n}} for n in range(23))
        listed = [i.action_id for i in outbox.list(status="held", page_size=5)]
        none = list(outbox.list(status="dead", scope=["acme"], page_size=5))
    assert all(isinstance(r, Enqueued) and r.created for r in results)
    assert listed == [f"p-{n:02d}" for n in reversed(range(23))] and none == []


async def test_problems_are_typed_errors_with_their_fields(service: Service):
    with Client(service.url, token=service.producer, retry=FAST) as outbox:
        outbox.enqueue("hook", {"n": 1}, scope="acme", action_id="taken")
        with pytest.raises(IntentConflict) as conflict:
            outbox.enqueue("hook", {"n": 2}, scope="acme", action_id="taken")
        with pytest.raises(InvalidInput) as invalid:
            outbox.enqueue("hook", {"n": 1}, scope="acme", max_attempts=0)
        with pytest.raises(UnknownDestination):
            outbox.enqueue("nowhere", {"n": 1}, scope="acme")
        with pytest.raises(Forbidden) as forbidden:
            outbox.enqueue("hook", {"n": 1}, scope="globex")
        with pytest.raises(NotFound):
            outbox.get("never", scope="acme")
    with Client(service.url, token="obx_nope_nope", retry=FAST) as stranger, pytest.raises(Unauthorized) as denied:
        stranger.get("taken")
    error = conflict.value
    assert isinstance(error, Conflict) and isinstance(error, LibraryIntentConflict) and isinstance(error, OutboxError)
    assert (error.status, error.kind) == (409, "intent-conflict") and "payload_digest" in error.detail
    assert error.type == "urn:outbox:problem:intent-conflict" and error.problem["instance"] == "/v1/intents"
    assert invalid.value.status == 422 and [e["field"] for e in invalid.value.errors] == ["max_attempts"]
    assert forbidden.value.kind == "forbidden-scope" and "globex" in forbidden.value.detail
    assert denied.value.status == 401


def test_a_token_is_needed(monkeypatch):
    monkeypatch.delenv("OUTBOX_TOKEN", raising=False)
    with pytest.raises(ValueError, match="OUTBOX_TOKEN"):
        Client("http://127.0.0.1:9")
    monkeypatch.setenv("OUTBOX_TOKEN", "from-env")
    with Client("http://127.0.0.1:9") as outbox:
        assert outbox._http.headers["authorization"] == "Bearer from-env"


async def test_enqueue_many_answers_each_item_in_order_across_batches(service: Service):
    items: list[dict[str, Any]] = [{"destination": "parked", "scope": "acme", "action_id": f"m-{n}",
                                    "payload": {"n": n}} for n in range(1203)]
    items[700] = {**items[700], "scope": "globex"}
    items[1202] = {**items[1202], "action_id": "bad id"}
    with Client(service.url, token=service.producer) as outbox:
        results = outbox.enqueue_many(items)
    assert len(results) == 1203
    assert isinstance(results[700], Forbidden) and isinstance(results[1202], InvalidInput)
    created = [r for r in results if isinstance(r, Enqueued)]
    assert len(created) == 1201 and all(r.created for r in created)
    assert [r.intent.action_id for r in created] == [f"m-{n}" for n in range(1203) if n not in (700, 1202)]
    assert created[0].intent.payload is None and created[0].intent.payload_digest.startswith("sha256:")
    assert len(intents_in(service.db_path)) == 1201


# -- the async client ---------------------------------------------------------------------------


async def test_the_async_client_does_the_same(service: Service):
    async with AsyncClient(service.url, token=service.producer) as outbox:
        sent = await outbox.enqueue("hook", {"invoice": 9}, scope="acme", action_id="a-9")
        [batched, refused] = await outbox.enqueue_many([
            {"destination": "hook", "scope": "acme", "action_id": "a-10", "payload": {"invoice": 10}},
            {"destination": "hook", "scope": "acme", "action_id": "a-9", "payload": {"other": 1}}])
        settled = await outbox.wait("a-9", scope="acme", timeout=20)
        shown = await outbox.get("a-10", scope="acme")
        listed = [i.action_id async for i in outbox.list(page_size=1)]
        with pytest.raises(NotFound):
            await outbox.wait("missing", timeout=1)
    assert sent.created and isinstance(batched, Enqueued) and batched.created
    assert isinstance(refused, IntentConflict) and refused.status == 409
    assert settled.status == "delivered" and settled.attempts[0]["outcome"] == "delivered"
    assert shown.action_id == "a-10" and sorted(listed) == ["a-10", "a-9"]


def test_both_clients_have_the_same_methods_and_arguments():
    import inspect

    public = {name for name in vars(Client) if not name.startswith("_") and name != "close"}
    assert public == {name for name in vars(AsyncClient) if not name.startswith("_") and name != "close"}
    assert {"enqueue", "enqueue_many", "get", "wait", "list"} <= public
    for name in public:
        assert inspect.signature(getattr(Client, name)).parameters.keys() == \
            inspect.signature(getattr(AsyncClient, name)).parameters.keys(), name


# -- retries, through a proxy injecting an exact fault -------------------------------------------


class Faulty:
    """An ASGI proxy to the outbox that answers the first ``faults`` requests to ``path`` with
    503 and ``Retry-After: 1`` *after* forwarding them (the outbox did the work; the answer is
    lost), and forwards everything else as is."""

    def __init__(self, upstream: str, path: str, faults: int, status: int = 503) -> None:
        self.upstream, self.path, self.faults, self.status = upstream, path, faults, status
        self.seen: list[tuple[float, bytes]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = [(k.decode(), v.decode()) for k, v in scope["headers"] if k.lower() not in (b"host",)]
        async with httpx.AsyncClient(base_url=self.upstream) as upstream:
            answer = await upstream.request(scope["method"], scope["path"], content=body, headers=headers,
                                            params=scope["query_string"].decode())
        if scope["path"] == self.path:
            self.seen.append((time.monotonic(), body))
            if len(self.seen) <= self.faults:
                await send({"type": "http.response.start", "status": self.status,
                            "headers": [(b"retry-after", b"1"), (b"content-type", b"application/problem+json")]})
                await send({"type": "http.response.body", "body": b'{"type":"urn:outbox:problem:store-unavailable",'
                            b'"title":"Store unavailable","status":503,"detail":"injected"}'})
                return
        await send({"type": "http.response.start", "status": answer.status_code,
                    "headers": [(k.encode(), v.encode()) for k, v in answer.headers.items()
                                if k.lower() not in ("content-length", "transfer-encoding", "content-encoding")]})
        await send({"type": "http.response.body", "body": answer.content})


@pytest.fixture
def proxy():
    started: list[Served] = []

    def start(app: Faulty) -> str:
        started.append(Served(app))
        return started[-1].url

    yield start
    for served in started:
        served.stop()


async def test_a_503_with_retry_after_is_retried_and_the_generated_action_id_stays(service: Service, proxy):
    faulty = Faulty(service.url, "/v1/intents", faults=1)
    with Client(proxy(faulty), token=service.producer, retry=FAST) as outbox:
        sent = outbox.enqueue("parked", {"n": 1}, scope="acme")  # no action id given: made here, once
    (first_at, first), (second_at, second) = faulty.seen
    assert first == second and second_at - first_at >= 0.9  # the same request, after Retry-After
    assert not sent.created  # the first try had created it; the retry found it
    assert intents_in(service.db_path) == [sent.intent.action_id]


async def test_the_async_client_retries_a_batch_alike(service: Service, proxy):
    faulty = Faulty(service.url, "/v1/intents:batch", faults=2, status=429)
    async with AsyncClient(proxy(faulty), token=service.producer, retry=FAST) as outbox:
        results = await outbox.enqueue_many({"destination": "parked", "scope": "acme", "payload": {"n": n}}
                                            for n in range(3))
    assert len(faulty.seen) == 3 and len({body for _, body in faulty.seen}) == 1
    assert [r.created for r in results if isinstance(r, Enqueued)] == [False, False, False]
    assert len(intents_in(service.db_path)) == 3


async def test_retries_end_and_other_4xx_are_never_retried(service: Service, proxy):
    faulty = Faulty(service.url, "/v1/intents", faults=10)
    with Client(proxy(faulty), token=service.producer,
                retry=RetryPolicy(attempts=3, max_seconds=0.05)) as outbox:
        with pytest.raises(Unavailable) as unavailable:
            outbox.enqueue("parked", {"n": 1}, scope="acme", action_id="u-1")
        assert len(faulty.seen) == 3 and unavailable.value.retry_after == 1.0
        faulty.faults = 0
        outbox.enqueue("parked", {"n": 1}, scope="acme", action_id="u-2")
        with pytest.raises(IntentConflict):
            outbox.enqueue("parked", {"n": 2}, scope="acme", action_id="u-2")
    assert len(faulty.seen) == 5  # the conflict was asked once


async def test_an_operator_approves_and_rejects_held_intents(service: Service, receiver: Receiver):
    with Client(service.url, token=service.producer) as producer, \
            Client(service.url, token=service.operator) as operator:
        held = [producer.enqueue("parked", {"n": n}, scope="acme", action_id=f"held-{n}").intent for n in range(3)]
        assert [i.status for i in held] == ["held"] * 3
        with pytest.raises(InvalidInput):  # another payload than the one looked at: nothing approved
            operator.approve("held-0", payload_digest=held[1].payload_digest, reason="wrong one", scope="acme")
        with pytest.raises(Forbidden):  # a producer's token may not approve
            producer.approve("held-0", payload_digest=held[0].payload_digest, reason="mine", scope="acme")
        approved = operator.approve("held-0", payload_digest=held[0].payload_digest, reason="looked", scope="acme")
        assert approved.status == "pending"
        assert producer.wait("held-0", scope="acme", timeout=10).status == "delivered"
        assert operator.reject("held-1", reason="not today", scope="acme").status == "cancelled"
    async with AsyncClient(service.url, token=service.operator) as aoperator:
        assert (await aoperator.approve("held-2", payload_digest=held[2].payload_digest, reason="looked",
                                        scope="acme")).status == "pending"
        with pytest.raises(Conflict):  # no longer held
            await aoperator.reject("held-2", reason="too late", scope="acme")


async def test_an_approval_whose_answer_is_lost_is_not_sent_again(service: Service, proxy):
    with Client(service.url, token=service.producer) as producer:
        held = producer.enqueue("parked", {"n": 1}, scope="acme", action_id="lost-1").intent
    faulty = Faulty(service.url, "/v1/intents/lost-1/approve", faults=1)
    # the caller learns it does not know; the client does not guess
    with Client(proxy(faulty), token=service.operator, retry=FAST) as operator, pytest.raises(Unavailable):
        operator.approve("lost-1", payload_digest=held.payload_digest, reason="looked", scope="acme")
    assert len(faulty.seen) == 1  # asked once: a second approval would have met "not held"
    with Client(service.url, token=service.producer) as producer:
        assert producer.get("lost-1", scope="acme").status in ("pending", "leased", "delivered")


def test_connection_errors_are_retried_then_raised(unanswered_port: int):
    with Client(f"http://127.0.0.1:{unanswered_port}", token="t",
                retry=RetryPolicy(attempts=3, initial_seconds=0.01), timeout=0.2) as outbox:
        began = time.monotonic()
        with pytest.raises(httpx.TransportError):
            outbox.get("x")
    assert time.monotonic() - began >= 0.4  # three tries of 0.2 s each, at least two of them timed out


async def test_a_time_the_api_refuses_is_refused_before_any_request(service: Service):
    """The client builds the times it sends by the API's rule: a naive one, or one outside the
    range, raises the library's InvalidInput naming it, and nothing is sent."""
    bad = {"not_before": datetime(2030, 1, 1),
           "expires_at": datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone(-timedelta(hours=1)))}
    with Client(service.url, token=service.producer) as outbox:
        for name, value in bad.items():
            with pytest.raises(LibraryInvalidInput, match=f"^{name}: "):
                outbox.enqueue("hook", {"n": 1}, scope="acme", **{name: value})
            with pytest.raises(LibraryInvalidInput, match=f"^{name}: "):
                outbox.enqueue_many([{"destination": "hook", "payload": {}, "scope": "acme", name: value}])
        with pytest.raises(LibraryInvalidInput, match="^created_after: "):
            list(outbox.list(created_after=bad["expires_at"]))
        taken = outbox.enqueue("hook", {"n": 2}, scope="acme", not_before=datetime(2030, 1, 1, 1, tzinfo=timezone(
            timedelta(hours=1))))
    assert taken.intent.data["not_before"] == "2030-01-01T00:00:00Z"
    assert intents_in(service.db_path) == [taken.intent.action_id]


# -- what a producer host imports -----------------------------------------------------------------


def test_the_client_imports_neither_the_store_nor_the_server():
    """Nor the receivers' engine and record stores, nor the service's settings: of ``receivers``
    only the wire contract it speaks."""
    code = ("import sys, outbox.client\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('fastapi', 'starlette', 'aiosqlite',"
            " 'asyncpg', 'uvicorn', 'sender', 'aiokafka', 'aiosmtplib', 'pydantic_settings', 'psycopg',"
            " 'prometheus_client', 'cryptography') or m.startswith(('outbox.store', 'outbox.outbox', 'outbox.api',"
            " 'outbox.routes', 'outbox.settings', 'receivers.')) and m != 'receivers.wire')\n"
            "print(heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
