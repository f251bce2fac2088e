"""``POST /v1/intents:batch`` served by a real uvicorn over a real SQLite file: each item is
answered as the single enqueue would answer it, in order, and the batch is one commit."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest

from ..conftest import snapshot
from .conftest import Api

PAYLOAD_LIMIT = 4096


@pytest.fixture
def api_settings(api_settings: dict[str, Any]) -> dict[str, Any]:
    """The API's, with payloads up to PAYLOAD_LIMIT and batches up to 64 KiB."""
    return {**api_settings, "max_payload_bytes": PAYLOAD_LIMIT, "max_batch_bytes": 64 * 1024}


def intent(action_id: str, scope: str = "acme", **fields) -> dict:
    return {"action_id": action_id, "scope": scope, "destination": "billing", "payload": {"n": action_id}, **fields}


def action_ids(db_path: Path) -> list[str]:
    with sqlite3.connect(db_path) as conn:
        return sorted(row[0] for row in conn.execute("SELECT action_id FROM intents"))


async def test_each_item_gets_the_single_answer_in_order(api: Api):
    async with api.client(api.producer) as c:
        assert (await c.post("/v1/intents", json=intent("old"))).status_code == 201
        assert (await c.post("/v1/intents", json=intent("taken"))).status_code == 201
        answer = await c.post("/v1/intents:batch", json={"intents": [
            intent("new-1"),
            intent("old"),                                          # the same again: 200
            {**intent("taken"), "payload": {"other": True}},        # another digest: 409
            {**intent("bad"), "max_attempts": 0},                   # invalid field: 422
            intent("elsewhere", scope="globex"),                    # not the token's scope: 403
            {**intent("big"), "payload": {"x": "y" * PAYLOAD_LIMIT}},  # payload over the limit: 413
            {**intent("nowhere"), "destination": "nope"},           # unknown destination: 422
            "not an object",
            intent("new-2"),
            intent("new-1"),                                        # repeated inside the batch: 200
        ]})
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [r["status"] for r in results] == [201, 200, 409, 422, 403, 413, 422, 422, 201, 200]
    assert results[0]["intent"]["action_id"] == "new-1" and results[0]["intent"]["status"] == "pending"
    assert results[1]["intent"]["action_id"] == "old"
    kinds = [r["problem"]["type"].rsplit(":", 1)[1] if "problem" in r else None for r in results]
    assert kinds == [None, None, "intent-conflict", "invalid-input", "forbidden-scope", "payload-too-large",
                     "unknown-destination", "invalid-input", None, None]
    assert results[3]["problem"]["errors"][0]["field"] == "max_attempts"
    assert "payload_digest" in results[2]["problem"]["detail"]
    assert results[9]["intent"]["payload_digest"] == results[0]["intent"]["payload_digest"]
    assert action_ids(api.db_path) == ["new-1", "new-2", "old", "taken"]


async def test_the_batch_is_one_commit(api: Api):
    """A failure inside the transaction (a trigger refusing the third insert) leaves none of the
    batch, not even the intents written before it."""
    with sqlite3.connect(api.db_path) as conn:
        conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON intents WHEN NEW.action_id = 'poison' "
                     "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")
    before = snapshot(api.db_path)
    async with api.client(api.producer) as c:
        answer = await c.post("/v1/intents:batch", json={"intents": [intent("a"), intent("b"), intent("poison"),
                                                                      intent("c")]})
    assert answer.status_code >= 500 and answer.headers["content-type"] == "application/problem+json"
    assert snapshot(api.db_path) == before


async def test_the_body_as_a_whole_is_refused_with_a_problem(api: Api):
    async with api.client(api.producer) as c:
        too_many = await c.post("/v1/intents:batch", json={"intents": [intent(f"i{n}") for n in range(501)]})
        empty = await c.post("/v1/intents:batch", json={"intents": []})
        not_a_list = await c.post("/v1/intents:batch", json={"intents": intent("x")})
        bare_list = await c.post("/v1/intents:batch", json=[intent("x")])
        not_json = await c.post("/v1/intents:batch", content=b"{nope", headers={"Content-Type": "application/json"})
        over = await c.post("/v1/intents:batch", content=json.dumps(
            {"intents": [intent(f"i{n}") | {"payload": {"x": "y" * 4000}} for n in range(17)]}),
            headers={"Content-Type": "application/json"})
    assert too_many.status_code == 422 and "500" in too_many.json()["detail"]
    assert empty.status_code == 422 and not_a_list.status_code == 422 and bare_list.status_code == 422
    assert not_json.status_code == 400
    assert over.status_code == 413 and "max_batch_bytes" in over.json()["detail"]
    for answer in (too_many, empty, not_a_list, bare_list, not_json, over):
        assert answer.headers["content-type"] == "application/problem+json"
    assert action_ids(api.db_path) == []


async def test_a_batch_of_maximal_payloads_within_the_stated_bound_is_taken(api: Api):
    """Each payload at its own limit; the whole under max_batch_bytes (64 KiB here) is accepted."""
    big = "y" * (PAYLOAD_LIMIT - len('{"x":""}'))
    async with api.client(api.producer) as c:
        answer = await c.post("/v1/intents:batch", json={"intents": [
            intent(f"m{n}") | {"payload": {"x": big}} for n in range(14)]})
    assert answer.status_code == 200, answer.text
    assert {r["status"] for r in answer.json()["results"]} == {201}


async def test_authorisation(api: Api):
    async with httpx.AsyncClient(base_url=api.url, timeout=10) as anonymous:
        assert (await anonymous.post("/v1/intents:batch", json={"intents": [intent("a")]})).status_code == 401
    async with api.client(api.admin) as c:  # an admin acts in every scope
        answer = await c.post("/v1/intents:batch", json={"intents": [intent("a", scope="globex")]})
    assert [r["status"] for r in answer.json()["results"]] == [201]
    async with api.client(api.producer) as c:
        answer = await c.post("/v1/intents:batch", json={"intents": [intent("b", scope="shop"),
                                                                      intent("c", scope="globex")]})
    assert [r["status"] for r in answer.json()["results"]] == [201, 403]
    assert "globex" in answer.json()["results"][1]["problem"]["detail"]
    assert action_ids(api.db_path) == ["a", "b"]


async def test_openapi_documents_the_batch(api: Api):
    async with api.client(api.producer) as c:
        document = (await c.get("/openapi.json")).json()
    operation = document["paths"]["/v1/intents:batch"]["post"]
    assert operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("BatchResult")
    body = document["components"]["schemas"]["BatchIn"]["properties"]["intents"]
    assert body["maxItems"] == 500 and body["items"]["$ref"].endswith("IntentIn")
    assert "BatchItem" in document["components"]["schemas"]
