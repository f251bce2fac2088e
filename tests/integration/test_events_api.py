"""``/v1/events`` served by a real uvicorn over a real SQLite file: subscriptions on destinations,
publishing with its fan-out, idempotency and conflicts, scopes, batches, an operator's delivery to
a later subscriber, and reading events back."""

from __future__ import annotations

from typing import Any

import httpx

from ..conftest import SECRET
from ..problems import assert_problem
from .conftest import Api

MAIL = {"channel": "email", "host": "mail.example", "from": "outbox@example.com"}


def event(event_id: str, topic: str = "invoice.paid", scope: str = "acme", **fields: Any) -> dict[str, Any]:
    return {"event_id": event_id, "scope": scope, "topic": topic, "payload": {"invoice": event_id}, **fields}


async def register(admin: httpx.AsyncClient, id: str, subscriptions: list[dict[str, Any]], *,
                   grant: str | None = "acme", **spec: Any) -> dict[str, Any]:
    body = {**({"url": f"https://{id}.example/hook", "secret": SECRET} if "channel" not in spec else {}), **spec,
            "subscriptions": subscriptions}
    answer = await admin.put(f"/v1/destinations/{id}", json=body)
    assert answer.status_code in (200, 201), answer.text
    if grant is not None:
        assert (await admin.put(f"/v1/grants/{grant}-{id}", json={"scope": grant, "destination": id})).is_success
    return answer.json()


def fanout(answer: httpx.Response) -> dict[str, str | None]:
    return {d["destination"]: d["status"] for d in answer.json()["fanout"]}


async def test_subscriptions_are_part_of_the_destination_and_checked_whole(api: Api):
    async with api.client(api.admin) as admin:
        shown = await register(admin, "ledger", [{"topic": "invoice.*"}, {"topic": "user.created",
                                                                           "scopes": ["acme"]}])
        assert shown["subscriptions"] == [{"topic": "invoice.*", "scopes": None},
                                          {"topic": "user.created", "scopes": ["acme"]}]
        assert (await admin.get("/v1/destinations/billing")).json()["subscriptions"] == []
        for bad, field in [({"topic": "Invoice.Paid"}, "topic"), ({"topic": "invoice.*.paid"}, "topic"),
                           ({"topic": "invoice."}, "topic"), ({"topic": "invoice.paid\n"}, "topic"),
                           ({"topic": "*", "scopes": []}, "scopes"), ({"topic": "*", "extra": 1}, "extra")]:
            refused = await admin.put("/v1/destinations/ledger", json={
                "url": "https://ledger.example/hook", "subscriptions": [bad]})
            body = assert_problem(refused, 422, "invalid-input")
            assert any(e["field"].endswith(field) for e in body["errors"]), (bad, body)
        assert len((await admin.get("/v1/destinations/ledger")).json()["subscriptions"]) == 2


async def test_publishing_fans_out_to_granted_subscribers_of_its_scope_once(api: Api):
    async with api.client(api.admin) as admin, api.client(api.producer) as producer:
        await register(admin, "ledger", [{"topic": "invoice.*"}])
        await register(admin, "crm", [{"topic": "*", "scopes": ["shop"]}], grant="shop")
        await register(admin, "audit", [{"topic": "*"}], grant=None)  # no grant for acme: never receives
        created = await producer.post("/v1/events", json=event("inv-42-paid"))
        assert created.status_code == 201, created.text
        assert created.headers["location"] == "/v1/events/inv-42-paid?scope=acme"
        body = created.json()
        assert (body["event_id"], body["topic"], body["payload"]) == ("inv-42-paid", "invoice.paid",
                                                                      {"invoice": "inv-42-paid"})
        assert body["fanout"] == [{"destination": "ledger", "action_id": "evt~inv-42-paid~ledger",
                                   "status": "pending", "skipped": None}]
        intent = (await producer.get("/v1/intents/evt~inv-42-paid~ledger")).json()
        assert (intent["event_id"], intent["payload"], intent["scope"]) == ("inv-42-paid", body["payload"], "acme")

        again = await producer.post("/v1/events", json=event("inv-42-paid"))
        assert again.status_code == 200 and again.json() == body
        other = await producer.post("/v1/events", json={**event("inv-42-paid"), "payload": {"other": 1}})
        assert_problem(other, 409, "intent-conflict", "payload_digest")
        assert_problem(await producer.post("/v1/events", json=event("inv-42-paid", topic="invoice.sent")),
                       409, "intent-conflict", "topic")
        assert_problem(await producer.post("/v1/events", json=event("x", scope="globex")), 403, "forbidden-scope")
        assert fanout(await producer.post("/v1/events", json=event("s1", scope="shop"))) == {"crm": "pending"}
        listed = (await producer.get("/v1/intents", params={"destination": "audit"})).json()["items"]
        assert listed == []


async def test_a_subscriber_whose_channel_refuses_the_payload_is_skipped(api: Api):
    async with api.client(api.admin) as admin, api.client(api.producer) as producer:
        await register(admin, "ledger", [{"topic": "*"}])
        await register(admin, "mail", [{"topic": "*"}], **MAIL)
        answer = await producer.post("/v1/events", json=event("e1"))
        assert answer.status_code == 201
        [ledger, skipped] = answer.json()["fanout"]
        assert ledger["status"] == "pending" and skipped["destination"] == "mail"
        assert skipped["status"] is None and "cannot be sent by the email channel" in skipped["skipped"]
        assert_problem(await producer.get(f"/v1/intents/{skipped['action_id']}"), 404, "not-found")


async def test_a_later_subscriber_gets_nothing_until_an_operator_delivers(api: Api):
    async with api.client(api.admin) as admin, api.client(api.producer) as producer, \
            api.client(api.operator) as operator:
        await register(admin, "ledger", [{"topic": "invoice.*"}])
        await producer.post("/v1/events", json=event("e1"))
        await register(admin, "late", [{"topic": "invoice.*"}])
        assert fanout(await producer.get("/v1/events/e1")) == {"ledger": "pending"}
        assert_problem(await producer.post("/v1/events/e1/deliver", json={"destination": "late"}), 403, "forbidden")
        made = await operator.post("/v1/events/e1/deliver", json={"destination": "late", "reason": "catch up"})
        assert made.status_code == 201, made.text
        assert fanout(made) == {"late": "pending", "ledger": "pending"}
        again = await operator.post("/v1/events/e1/deliver", json={"destination": "late"})
        assert again.status_code == 200 and again.json() == made.json()
        history = (await operator.get("/v1/intents/evt~e1~late", params={"scope": "acme"})).json()["events"]
        assert [(e["kind"], e["reason"]) for e in history] == [("enqueued", "catch up")]
        assert_problem(await operator.post("/v1/events/nope/deliver", json={"destination": "late"}), 404,
                       "not-found")
        assert_problem(await operator.post("/v1/events/e1/deliver", json={"destination": "gone"}), 422,
                       "unknown-destination")


async def test_events_are_read_in_the_tokens_scopes_and_listed_with_a_cursor(api: Api):
    async with api.client(api.admin) as admin, api.client(api.producer) as producer:
        await register(admin, "ledger", [{"topic": "*"}])
        other, _ = await _token(admin, ["globex"])
        async with api.client(other) as globex:
            assert (await globex.post("/v1/events", json=event("e1", scope="globex"))).status_code == 201
            assert_problem(await globex.get("/v1/events/e2"), 404, "not-found")
        for n, topic in enumerate(["invoice.paid", "user.created", "invoice.sent"]):
            assert (await producer.post("/v1/events", json=event(f"e{n}", topic))).status_code == 201
        assert (await producer.get("/v1/events/e1")).json()["scope"] == "acme"  # globex's e1 is not readable
        async with api.client(api.operator) as operator:
            assert_problem(await operator.get("/v1/events/e1"), 409, "ambiguous-action-id", "name the scope too")
            assert (await operator.get("/v1/events/e1", params={"scope": "globex"})).json()["scope"] == "globex"
        first = (await producer.get("/v1/events", params={"limit": 2})).json()
        assert [e["event_id"] for e in first["items"]] == ["e2", "e1"] and first["next_cursor"]
        rest = (await producer.get("/v1/events", params={"limit": 2, "cursor": first["next_cursor"]})).json()
        assert [e["event_id"] for e in rest["items"]] == ["e0"] and rest["next_cursor"] is None
        topics = (await producer.get("/v1/events", params={"topic": "invoice.*"})).json()["items"]
        assert [e["event_id"] for e in topics] == ["e2", "e0"]
        assert_problem(await producer.get("/v1/events", params={"topic": "Invoice"}), 422, "invalid-input")
        assert_problem(await producer.get("/v1/events", params={"scope": "globex"}), 403, "forbidden-scope")


async def test_a_batch_answers_each_event_as_publishing_it_alone_would(api: Api):
    async with api.client(api.admin) as admin, api.client(api.producer) as producer:
        await register(admin, "ledger", [{"topic": "invoice.*"}])
        await producer.post("/v1/events", json=event("taken"))
        answer = await producer.post("/v1/events:batch", json={"events": [
            event("b1"), event("taken"), {**event("taken"), "payload": {"other": 1}}, event("bad", topic="Bad"),
            event("elsewhere", scope="globex"), "not an object", event("b2", topic="user.created"), event("b1")]})
        assert answer.status_code == 200, answer.text
        results = answer.json()["results"]
        assert [r["status"] for r in results] == [201, 200, 409, 422, 403, 422, 201, 200]
        assert results[0]["event"]["fanout"][0]["action_id"] == "evt~b1~ledger"
        assert "payload" not in results[0]["event"] and results[6]["event"]["fanout"] == []
        assert results[2]["problem"]["type"].endswith("intent-conflict")
        assert len((await producer.get("/v1/events")).json()["items"]) == 3
        assert_problem(await producer.post("/v1/events:batch", json={"events": []}), 422, "invalid-input")


async def _token(admin: httpx.AsyncClient, scopes: list[str]) -> tuple[str, dict[str, Any]]:
    made = (await admin.post("/v1/tokens", json={"role": "producer", "scopes": scopes})).json()
    return made["token"], made
