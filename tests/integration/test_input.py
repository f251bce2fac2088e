"""What the API refuses at the edge, served by a real uvicorn over a real SQLite file (and a real
PostgreSQL where the store decides): times that are not RFC 3339 strings with an offset or fall
outside the range the stores hold and the sender computes with. Each is a problem that names
what is wrong, and stores nothing."""

from __future__ import annotations

import json

import httpx
import pytest

from outbox import DestinationSpec, Outbox, Role, Settings
from outbox.timestamps import LATEST

from ..conftest import SECRET, snapshot
from .test_api import INTENT, Api, assert_problem, open_api

#: Times the API refuses, and words the refusal says.
BAD_TIMES = [
    ("0001-01-01T00:00:00+01:00", "outside the times"),  # before year 1 once the offset is applied
    ("9999-12-31T23:59:59-01:00", "outside the times"),  # after 9999 once the offset is applied
    ("9999-06-01T00:00:00Z", "outside the times"),  # a datetime, but no room for a lease or a backoff
    (0, "not a time"),  # read as the Unix epoch, once
    ("0", "not an RFC 3339 time"),
    ("1700000000", "not an RFC 3339 time"),
    (True, "not a time"),
    ("2030-02-30T00:00:00Z", "not a time"),
    ("2030-01-01T00:00:00+0100", "not an RFC 3339 time"),
]


@pytest.fixture
async def api(db_path, db_url, serve_api) -> Api:
    """The API as test_api.py serves it."""
    return await open_api(db_path, db_url, serve_api)


# -- times --------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["not_before", "expires_at"])
@pytest.mark.parametrize("value,words", BAD_TIMES)
async def test_an_intent_time_outside_the_range_or_not_rfc_3339_is_refused(api: Api, field, value, words):
    """The first two stored the row and answered 500 on SQLite; every later claim then failed."""
    before = snapshot(api.db_path)
    async with api.client(api.producer) as c:
        assert_problem(await c.post("/v1/intents", json={**INTENT, field: value}), 422, "invalid-input",
                       f"{field}: ")
        refused = await c.post("/v1/intents:batch", json={"intents": [{**INTENT, field: value}]})
        assert refused.status_code == 200
        [item] = refused.json()["results"]
        assert item["status"] == 422 and item["problem"]["errors"][0]["field"] == field
        assert words in item["problem"]["detail"], item
    assert snapshot(api.db_path) == before


@pytest.mark.parametrize("value,words", BAD_TIMES)
async def test_every_other_time_a_client_sends_is_held_to_the_same_rule(api: Api, value, words):
    """A grant's expiry, a listing's and a bulk replay's created_after/created_before."""
    before = snapshot(api.db_path)
    async with api.client(api.admin) as c:
        grant = await c.put("/v1/grants/g", json={"scope": "acme", "destination": "billing", "expires_at": value})
        assert_problem(grant, 422, "invalid-input", "expires_at: ")
        for name in ("created_after", "created_before"):
            replay = await c.post("/v1/replay", json={"reason": "r", "filter": {name: value}})
            assert_problem(replay, 422, "invalid-input", f"filter.{name}: ")
            listed = await c.get("/v1/intents", params={name: json.dumps(value) if not isinstance(value, str)
                                                         else value})
            assert_problem(listed, 422, "invalid-input", f"{name}: ")
    assert snapshot(api.db_path) == before


async def test_the_ends_of_the_range_are_taken_with_any_offset(api: Api):
    async with api.client(api.producer) as c:
        last = await c.post("/v1/intents", json={**INTENT, "action_id": "last",
                                                 "not_before": "9999-01-01T00:59:59.999999+01:00"})
        assert last.status_code == 201, last.text
        assert last.json()["not_before"] == last.json()["next_attempt_at"] == "9998-12-31T23:59:59.999999Z"
        first = await c.post("/v1/intents", json={**INTENT, "action_id": "first",
                                                  "expires_at": "0001-01-01T00:00:00z"})
        assert first.status_code == 201 and first.json()["expires_at"] == "0001-01-01T00:00:00Z"
        listed = await c.get("/v1/intents", params={"created_after": "0001-01-01T00:00:00Z",
                                                    "created_before": LATEST.isoformat()})
        assert [i["action_id"] for i in listed.json()["items"]] == ["first", "last"]


async def test_times_are_refused_on_postgresql_too(pg_url, serve_api):
    """There, both answered 500 (and stored nothing)."""
    async with await Outbox.open(pg_url) as box:
        await box.put_destination("billing", DestinationSpec(url="https://billing.example/", secret=SECRET))
        producer, _ = await box.create_token(Role.PRODUCER, ["acme"])
    url = serve_api(Settings(database_url=pg_url, worker=False))
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {producer}"}) as c:
        for field, value in (("expires_at", "0001-01-01T00:00:00+01:00"), ("not_before", "9999-12-31T23:59:59-01:00")):
            assert_problem(await c.post("/v1/intents", json={**INTENT, field: value}), 422, "invalid-input", field)
            batch = await c.post("/v1/intents:batch", json={"intents": [{**INTENT, field: value}]})
            assert batch.json()["results"][0]["status"] == 422
        assert (await c.get("/v1/intents")).json()["items"] == []
