"""``outbox.app.api.create_app`` is the API alone: what runs beside it and the authority check its
replays ask are handed in by the composition root (``outbox.app.service.create_service``)."""

from __future__ import annotations

import httpx

from outbox import Settings, Status
from outbox.app.api import create_app

from ..problems import assert_problem
from .conftest import Ops, serve_in_loop


async def test_the_api_alone_runs_no_sender_and_refuses_replays(ops: Ops):
    await ops.dead_letters("dead-1")
    app = create_app(Settings(database_url="sqlite:///unused.db", worker=True), outbox=ops.box)
    async with serve_in_loop(app) as url, httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {ops.operator}"}, timeout=30) as c:
        assert getattr(app.state, "worker", None) is None  # worker=True asks create_service for one
        assert (await c.get("/healthz")).json() == {"status": "ok"}
        refused = await c.post("/v1/intents/dead-1/replay", json={"reason": "try again"})
        assert_problem(refused, 409, "authority-denied", "this app was given no authority check")
        dry = await c.post("/v1/replay", json={"reason": "all of them", "dry_run": False})
        assert dry.status_code == 200 and dry.json()["replayed"] == 0
        assert "no authority check" in dry.json()["refused"]["dead-1"]
    assert await ops.status("dead-1") is Status.DEAD


async def test_the_service_replays_through_the_configured_authority(ops: Ops):
    await ops.dead_letters("dead-2")  # ops serves create_service: grants, and acme has one
    async with ops.client(ops.operator) as c:
        replayed = await c.post("/v1/intents/dead-2/replay", json={"reason": "receiver fixed"})
    assert replayed.status_code == 200 and replayed.json()["status"] == "pending"
