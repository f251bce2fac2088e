"""A destination whose stored rate limit no time can follow (the issue's 1e-12, which the API took
then, written into the database by hand: plain sqlite3 on the real file, plain SQL on PostgreSQL),
while the service runs with its embedded sender and a real receiver. Before, every sender cycle
failed on it (SQLite: OverflowError in the claim; PostgreSQL: "year 33715 is out of range" reading
the claim's answer), an intent to any other destination was never sent, and ``/healthz`` said the
sender could not reach the database. Now the other destination's intents are delivered, that
one's wait unsent with the reason on its record (the API's answer, the console's page), and the
API refuses such a rate, naming the bound."""

from __future__ import annotations

from outbox import Status

from ..conftest import SECRET, eventually, rows
from ..problems import assert_problem
from ..receiver import Reply
from .conftest import OpenOps
from .test_console_oncall import headline
from .test_console_pages import console


async def test_a_destinations_rate_no_time_can_follow_holds_its_intents_and_the_others_are_delivered(
        open_ops: OpenOps, store_url: str):
    ops = await open_ops(worker=True, database_url=store_url)
    ops.receiver.script("/ok", Reply(200))
    ops.receiver.script("/edge", Reply(200))
    await ops.destination("hook", "/ok")
    spec = {"url": ops.receiver.url + "/edge", "secret": SECRET, "allow_private_network": True}
    async with ops.client(ops.admin) as admin:
        put = await admin.put("/v1/destinations/edge", json={**spec, "rate_limit": {"per_second": 1, "burst": 1}})
        assert put.status_code == 201 and put.json().get("unusable") is None
    await rows(ops.box.settings.database_url, "UPDATE destinations SET rate_per_second = 1e-12 WHERE id = 'edge'")
    await ops.enqueue("e1", destination="edge")
    await ops.enqueue("e2", destination="edge")
    await ops.enqueue("h1")

    async def delivered_and_held() -> bool:
        released = [e for e in await ops.events("e1") + await ops.events("e2") if e.kind.value == "released"]
        return await ops.status("h1") is Status.DELIVERED and bool(released)

    assert await eventually(delivered_and_held, 30), [(a, await ops.status(a)) for a in ("h1", "e1", "e2")]
    assert [r.headers["idempotency-key"] for r in ops.receiver.requests("/ok")] == ["acme/h1"]
    assert ops.receiver.requests("/edge") == []  # nothing sent to it
    for action_id in ("e1", "e2"):
        history = await ops.box.history(action_id)
        assert history.intent.status is Status.PENDING and history.attempts == []
    [released] = [e for e in await ops.events("e1") + await ops.events("e2") if e.kind.value == "released"]
    assert released.reason.startswith("destination 'edge' holds stored settings the outbox does not take: "
                                      "rate_limit {'per_second': 1e-12, 'burst': 1}")

    async with ops.client(None) as anyone:
        assert (await anyone.get("/healthz")).json() == {"status": "ok"}  # the sender's cycles go through
    async with ops.client(ops.operator) as operator:
        shown = (await operator.get("/v1/destinations/edge")).json()
    assert shown["rate_limit"] == {"per_second": 0.00001, "burst": 1}  # the nearest the API takes
    assert "rate_limit {'per_second': 1e-12, 'burst': 1} (it takes per_second from 0.00001" in shown["unusable"]
    async with console(ops) as http:
        page = (await http.get("/console/destinations/edge")).text
        assert "Nothing is sent to it</b>: it holds stored settings the outbox does not take" in page
        assert "unusable" in page and "1e-12" in page
        assert headline((await http.get("/console")).text)["settings unusable"] == \
            "1 /console/destinations?state=unusable"

    async with ops.client(ops.admin) as admin:
        for per_second in (1e-12, 1e-300, 5e-324):
            assert_problem(await admin.put("/v1/destinations/edge", json={
                **spec, "rate_limit": {"per_second": per_second, "burst": 1}}), 422, "invalid-input",
                "rate_limit.per_second: Input should be greater than or equal to 0.00001")
        fixed = await admin.put("/v1/destinations/edge", json={**spec, "rate_limit": {"per_second": 5, "burst": 1}})
        assert fixed.status_code == 200 and fixed.json()["unusable"] is None  # put again: usable


async def test_a_destinations_stored_subscriptions_the_api_refuses_fail_no_listing(open_ops: OpenOps, store_url: str):
    """Subscriptions written into the database by hand, not as the API keeps them. Before, reading
    that destination raised, so every listing of destinations failed with it (``GET
    /v1/destinations``, the console's overview, its destinations and its intents search: 500),
    and the sender logged a traceback for each of its intents. Now it reads as subscribing to
    nothing, says so in ``unusable``, and is held as any such destination is."""
    ops = await open_ops(worker=True, database_url=store_url)
    ops.receiver.script("/ok", Reply(200))
    ops.receiver.script("/edge", Reply(200))
    await ops.destination("hook", "/ok")
    await ops.destination("edge", "/edge", subscriptions=[{"topic": "invoice.*"}])
    await rows(ops.box.settings.database_url, "UPDATE destinations SET subscriptions = 'not json' WHERE id = 'edge'")
    await ops.enqueue("e1", destination="edge")
    await ops.enqueue("h1")

    async def delivered_and_held() -> bool:
        released = [e for e in await ops.events("e1") if e.kind.value == "released"]
        return await ops.status("h1") is Status.DELIVERED and bool(released)

    assert await eventually(delivered_and_held, 30), [(a, await ops.status(a)) for a in ("h1", "e1")]
    assert ops.receiver.requests("/edge") == []
    async with ops.client(ops.operator) as operator:
        listed = await operator.get("/v1/destinations")
        assert listed.status_code == 200, listed.text
        [edge] = [d for d in listed.json()["items"] if d["id"] == "edge"]
    assert edge["subscriptions"] == []
    assert edge["unusable"].startswith("stored settings the outbox does not take: subscriptions 'not json' (it "
                                       "takes at most 50 subscriptions, each a topic pattern and its scopes; "
                                       "read as [])")
    async with console(ops) as http:
        for path in ("/console", "/console/destinations", "/console/destinations/edge", "/console/intents"):
            assert (await http.get(path)).status_code == 200, path
