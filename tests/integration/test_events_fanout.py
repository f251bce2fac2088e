"""An event's fan-out through the served API (a real uvicorn over a real SQLite file, its embedded
sender delivering to a real receiver): the payload stored once and delivered byte for byte to
every subscriber, and the limit on how many intents one event may make (``max_fanout``), answered
422 per event and per batch item with nothing written, and counted in ``/metrics``."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from outbox.digest import canonical_json, payload_digest

from ..conftest import SECRET, eventually, rows
from ..problems import assert_problem
from ..receiver import Receiver, Reply
from .conftest import Api

MAX_FANOUT = 6
#: A payload of about 20 KB, with characters canonical JSON writes as they are and ones it escapes.
PAYLOAD = {"order": 7, "note": "é\u2028\"x" * 4000, "lines": [{"sku": f"s{n}", "qty": n} for n in range(50)]}


SERVED = {"max_payload_bytes": 64 * 1024, "worker": True, "poll_seconds": 0.05}


@pytest.fixture
def api_settings() -> dict[str, Any]:
    return SERVED


def db(api: Api) -> str:
    return f"sqlite:///{api.db_path}"


async def register(admin: httpx.AsyncClient, id: str, topic: str, url: str) -> None:
    answer = await admin.put(f"/v1/destinations/{id}", json={
        "url": url, "secret": SECRET, "allow_private_network": True, "subscriptions": [{"topic": topic}]})
    assert answer.status_code in (200, 201), answer.text


async def test_an_events_payload_is_stored_once_and_every_subscriber_receives_it_byte_for_byte(
        api: Api, receiver: Receiver):
    names = [f"d{n}" for n in range(MAX_FANOUT)]
    async with api.client(api.admin) as admin, api.client(api.producer) as producer:
        for name in names:
            receiver.script(f"/{name}", Reply(200))
            await register(admin, name, "order.*", f"{receiver.url}/{name}")
        assert (await admin.put("/v1/grants/acme-all", json={"scope": "acme", "destination": "*"})).is_success
        published = await producer.post("/v1/events", json={"event_id": "o7", "scope": "acme",
                                                            "topic": "order.shipped", "payload": PAYLOAD})
        assert published.status_code == 201, published.text
        body = canonical_json(PAYLOAD)
        # the payload is in the event's row alone, however many intents it made
        assert await rows(db(api), "SELECT count(*), sum(length(payload)) FROM intents") == [(MAX_FANOUT, 0)]
        assert await rows(db(api), "SELECT payload FROM topic_events") == [(body.decode(),)]

        async def delivered() -> bool:
            shown = (await producer.get("/v1/events/o7")).json()
            return all(d["status"] == "delivered" for d in shown["fanout"])

        assert await eventually(delivered, timeout=20)
        for name in names:
            [request] = receiver.requests(f"/{name}")
            assert request.body == body, name
            assert request.headers["idempotency-key"] == f"acme/evt~o7~{name}"
            intent = (await producer.get(f"/v1/intents/evt~o7~{name}")).json()
            assert (intent["payload"], intent["payload_digest"]) == (PAYLOAD, payload_digest(PAYLOAD))
        listed = (await producer.get("/v1/intents", params={"limit": 50})).json()["items"]
        assert sorted(i["action_id"] for i in listed) == [f"evt~o7~{name}" for name in names]
        assert all(i["payload"] == PAYLOAD for i in listed)


@pytest.mark.parametrize("api_settings", [{**SERVED, "max_fanout": MAX_FANOUT}])
async def test_an_event_past_max_fanout_is_422_naming_the_limit_and_the_count_and_writes_nothing(api: Api):
    async with api.client(api.admin) as admin, api.client(api.producer) as producer:
        for n in range(MAX_FANOUT):
            await register(admin, f"d{n}", "*", f"https://d{n}.example/hook")
        await register(admin, "invoices", "invoice.*", "https://invoices.example/hook")
        assert (await admin.put("/v1/grants/acme-all", json={"scope": "acme", "destination": "*"})).is_success

        refused = await producer.post("/v1/events", json={"event_id": "big", "scope": "acme", "topic": "invoice.paid",
                                                         "payload": {"n": 1}})
        problem = assert_problem(refused, 422, "fanout-too-large", "OUTBOX_MAX_FANOUT")
        assert (problem["fanout"], problem["max_fanout"]) == (MAX_FANOUT + 1, MAX_FANOUT)
        assert "7 destinations" in problem["detail"] and f"({MAX_FANOUT}," in problem["detail"]
        assert await rows(db(api), "SELECT count(*) FROM topic_events") == [(0,)]
        assert await rows(db(api), "SELECT count(*) FROM intents") == [(0,)]

        batch = await producer.post("/v1/events:batch", json={"events": [
            {"event_id": "small", "scope": "acme", "topic": "user.created", "payload": {"n": 2}},
            {"event_id": "big", "scope": "acme", "topic": "invoice.paid", "payload": {"n": 1}}]})
        assert batch.status_code == 200, batch.text
        small, big = batch.json()["results"]
        assert small["status"] == 201 and len(small["event"]["fanout"]) == MAX_FANOUT  # at the limit: made
        assert big["status"] == 422 and big["problem"]["type"].endswith("fanout-too-large")
        assert (big["problem"]["fanout"], big["problem"]["max_fanout"]) == (MAX_FANOUT + 1, MAX_FANOUT)
        assert await rows(db(api), "SELECT event_id FROM topic_events") == [("small",)]
        assert await rows(db(api), "SELECT count(*) FROM intents") == [(MAX_FANOUT,)]

        metrics = (await producer.get("/metrics")).text
        assert "outbox_fanout_refused_total 2.0" in metrics, metrics
        assert "outbox_intents_fanned_out_total 6.0" in metrics


@pytest.mark.parametrize("api_settings", [{**SERVED, "max_batch_fanout": 2 * MAX_FANOUT}])
async def test_a_batch_past_max_batch_fanout_is_refused_item_by_item_once_its_budget_is_spent(api: Api):
    """One request's events may make ``max_batch_fanout`` intents together: the events past it
    answer 422 in their places, nothing of them written, and a later batch takes them."""
    async with api.client(api.admin) as admin, api.client(api.producer) as producer:
        for n in range(MAX_FANOUT):
            await register(admin, f"d{n}", "*", f"https://d{n}.example/hook")
        assert (await admin.put("/v1/grants/acme-all", json={"scope": "acme", "destination": "*"})).is_success
        events = [{"event_id": f"e{n}", "scope": "acme", "topic": "order.placed", "payload": {"n": n}}
                  for n in range(3)]
        batch = await producer.post("/v1/events:batch", json={"events": events})
        assert batch.status_code == 200, batch.text
        assert [r["status"] for r in batch.json()["results"]] == [201, 201, 422]
        past = batch.json()["results"][2]["problem"]
        assert past["type"].endswith("fanout-too-large") and "OUTBOX_MAX_BATCH_FANOUT" in past["detail"]
        assert (past["fanout"], past["max_fanout"]) == (3 * MAX_FANOUT, 2 * MAX_FANOUT)
        assert await rows(db(api), "SELECT event_id FROM topic_events ORDER BY seq") == [("e0",), ("e1",)]
        again = await producer.post("/v1/events:batch", json={"events": events[2:]})
        assert [r["status"] for r in again.json()["results"]] == [201]
        assert await rows(db(api), "SELECT count(*) FROM intents") == [(3 * MAX_FANOUT,)]
