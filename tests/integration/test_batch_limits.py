"""Every batch route takes the same limits, served by a real uvicorn over a real SQLite file:
``POST /v1/intents:batch`` and ``POST /v1/events:batch`` take a body up to ``max_batch_bytes``,
and hold each item's payload to the single route's limits in that item's place."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from outbox.app.api import create_app
from outbox.app.web import routes
from outbox.digest import MAX_NESTING
from outbox.settings import Settings

from ..problems import assert_problem
from .conftest import Api

PAYLOAD_LIMIT = 4096
BATCH_LIMIT = 256 * 1024


@pytest.fixture
def api_settings(api_settings: dict[str, Any]) -> dict[str, Any]:
    """The API's, with payloads up to PAYLOAD_LIMIT and batches up to BATCH_LIMIT: a batch may be
    far larger than one payload and its envelope."""
    return {**api_settings, "max_payload_bytes": PAYLOAD_LIMIT, "max_batch_bytes": BATCH_LIMIT}


def intent(n: int, payload: Any) -> dict[str, Any]:
    return {"action_id": f"i{n}", "scope": "acme", "destination": "billing", "payload": payload}


def event(n: int, payload: Any) -> dict[str, Any]:
    return {"event_id": f"e{n}", "scope": "acme", "topic": "invoice.paid", "payload": payload}


#: Each batch route: its path, the name of its list, and an item of it.
BATCHES: dict[str, tuple[str, str, Callable[[int, Any], dict[str, Any]]]] = {
    "intents": ("/v1/intents:batch", "intents", intent),
    "events": ("/v1/events:batch", "events", event),
}


@pytest.fixture(params=sorted(BATCHES))
def batch(request: pytest.FixtureRequest) -> tuple[str, str, Callable[[int, Any], dict[str, Any]]]:
    return BATCHES[request.param]


def nested(depth: int) -> Any:
    """A payload whose arrays nest ``depth`` levels."""
    value: Any = "deep"
    for _ in range(depth):
        value = [value]
    return value


def body(name: str, items: list[dict[str, Any]]) -> bytes:
    return json.dumps({name: items}).encode()


async def test_a_batch_is_bounded_by_max_batch_bytes_not_by_one_payload(api: Api, batch):
    """The events' batch was held to one payload and its envelope (4096 + 65536 bytes here):
    50 payloads of 4 KB were a 413 there, and 200 to the intents' batch."""
    path, name, item = batch
    full = {"x": "y" * (PAYLOAD_LIMIT - len('{"x":""}'))}  # each payload at its own limit
    taken = body(name, [item(n, full) for n in range(50)])
    over = body(name, [item(n, full) for n in range(70)])
    assert PAYLOAD_LIMIT + 64 * 1024 < len(taken) < BATCH_LIMIT < len(over)
    async with api.client(api.producer) as c:
        answer = await c.post(path, content=taken, headers={"content-type": "application/json"})
        refused = await c.post(path, content=over, headers={"content-type": "application/json"})
    assert answer.status_code == 200, answer.text
    assert [r["status"] for r in answer.json()["results"]] == [201] * 50
    assert_problem(refused, 413, "payload-too-large", f"the limit is {BATCH_LIMIT} (max_batch_bytes)")


async def test_each_item_is_held_to_the_single_routes_limits_in_its_place(api: Api, batch):
    """A payload nested as deep as one may be (64 levels) made the whole events' batch a 422; one
    level deeper made the whole of either batch a 422, where the single route answers it alone."""
    path, name, item = batch
    single = path.removesuffix(":batch")
    items = [item(0, {"n": 0}), item(1, nested(MAX_NESTING)), item(2, nested(MAX_NESTING + 1)),
             item(3, {"x": "y" * PAYLOAD_LIMIT}), item(4, {"n": 4})]
    async with api.client(api.producer) as c:
        answer = await c.post(path, content=body(name, items), headers={"content-type": "application/json"})
        alone = [await c.post(single, json=one) for one in items[2:4]]
        too_deep = await c.post(path, content=body(name, [item(5, nested(MAX_NESTING + 2))]),
                                headers={"content-type": "application/json"})
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [r["status"] for r in results] == [201, 201, 422, 413, 201]
    for result, single_answer in zip(results[2:4], alone, strict=True):  # as the single route answers each
        assert (result["status"], result["problem"]["type"]) == (single_answer.status_code,
                                                                 single_answer.json()["type"])
    assert f"deeper than {MAX_NESTING} levels" in results[2]["problem"]["detail"]
    assert_problem(too_deep, 422, "invalid-input", f"a payload may nest {MAX_NESTING} levels")


def test_every_route_that_takes_a_batch_has_the_batch_limits():
    """Told by the body it takes (a ``shapes.Batch``), not by a list of paths to keep up."""
    from outbox.app.routes.bodies import takes_batch

    app = create_app(settings=Settings(database_url="sqlite:///:memory:"))
    batches = sorted(route.path for route in routes(app.router) if takes_batch(route))
    assert batches == sorted(path for path, _, _ in BATCHES.values())
