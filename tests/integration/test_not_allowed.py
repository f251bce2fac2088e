"""A method a path does not answer is a 405 problem whose Allow names every method it does."""

from __future__ import annotations

import httpx

from outbox import Settings
from outbox.app.api import create_app

PROBLEM = "application/problem+json"


async def test_a_wrong_method_is_a_problem_naming_every_allowed_method(box):
    app = create_app(Settings(worker=False), outbox=box)  # routing answers before any route runs
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://outbox") as c:
        wrong = await c.post("/v1/destinations/billing", json={})
        intents = await c.delete("/v1/intents")
        probe = await c.post("/healthz")
    assert wrong.status_code == 405 and wrong.headers["content-type"] == PROBLEM
    assert wrong.headers["allow"] == "DELETE, GET, PUT"  # three routes, one per method
    assert wrong.json()["type"] == "urn:outbox:problem:method-not-allowed"
    assert "POST is not allowed on /v1/destinations/billing" in wrong.json()["detail"]
    assert intents.status_code == 405 and intents.headers["allow"] == "GET, POST"
    assert probe.status_code == 405 and probe.headers["allow"] == "GET"


async def test_a_wrong_method_on_a_console_page_names_its_methods_too(box):
    app = create_app(Settings(worker=False), outbox=box)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://outbox") as c:
        logout = await c.get("/console/logout")
        login = await c.put("/console/login")
    assert logout.status_code == 405 and logout.headers["allow"] == "POST"
    assert login.status_code == 405 and login.headers["allow"] == "GET, POST"


async def test_a_body_to_a_path_or_method_nothing_answers_is_not_read(box):
    """Bodies are checked only for a route that answers the request: anything else is its 404
    or 405, whatever its body, as before there was a body check in front of the routes."""
    app = create_app(Settings(worker=False), outbox=box)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://outbox") as c:
        nowhere = await c.post("/v1/nothing", content=b"{not json", headers={"content-type": "text/plain"})
        wrong = await c.put("/v1/intents", content=b"{not json", headers={"content-type": "text/plain"})
    assert nowhere.status_code == 404, nowhere.text
    assert wrong.status_code == 405 and wrong.headers["allow"] == "GET, POST", wrong.text
