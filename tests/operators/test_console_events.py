"""The console's events pages over HTTP against a real outbox served by uvicorn: a search by
topic, scope and id, and an event's fan-out, each intent's status linking to its page."""

from __future__ import annotations

import re

import httpx

from outbox import DestinationSpec
from sender.email import EmailSpec

from ..conftest import SECRET
from .conftest import Ops
from .test_console_pages import console


async def test_events_are_searched_and_an_events_fan_out_links_to_its_intents(ops: Ops):
    for name in ("ledger", "crm"):
        await ops.box.put_destination(name, DestinationSpec(url=f"https://{name}.example/", secret=SECRET,
                                                            subscriptions=[{"topic": "invoice.*"}]))
    await ops.box.put_destination("mail", EmailSpec.model_validate({
        "channel": "email", "host": "mail.example", "from": "shop@example.com", "subscriptions": [{"topic": "*"}]}))
    await ops.box.publish(scope="acme", topic="invoice.paid", event_id="inv-1-paid", payload={"invoice": "<1>"})
    await ops.box.publish(scope="acme", topic="user.created", event_id="user-7", payload={"user": 7})
    async with console(ops) as http:
        overview = (await http.get("/console")).text
        found = (await http.get("/console/events", params={"topic": "invoice.*"})).text
        every = (await http.get("/console/events")).text
        by_id = (await http.get("/console/events", params={"event_id": "user-7", "scope": "acme"})).text
        refused = await http.get("/console/events", params={"topic": "Not a topic"})
        shown = (await http.get("/console/events/inv-1-paid", params={"scope": "acme"})).text
        missing = await http.get("/console/events/nope")
    assert "<a href=\"/console/events\">Events</a>" in overview
    assert "inv-1-paid" in found and "user-7" not in found
    assert every.index("user-7") < every.index("inv-1-paid")  # newest first
    assert "user-7" in by_id and "inv-1-paid" not in by_id
    assert refused.status_code == 400 and "malformed" in refused.text
    assert "<script" not in shown and "&lt;1&gt;" in shown and "<1>" not in shown
    assert "href='/console/intents/evt~inv-1-paid~ledger?scope=acme'" in shown
    assert re.search(r"evt~inv-1-paid~crm</a></td><td[^>]*><span class='pill pending'>pending", shown)
    assert "<span class='pill skipped'>skipped</span> the payload cannot be sent by the email channel" in shown
    assert missing.status_code == 404
    async with console(ops) as http:
        intent = (await http.get("/console/intents/evt~inv-1-paid~ledger", params={"scope": "acme"})).text
    assert "inv-1-paid" in intent
    async with httpx.AsyncClient(base_url=ops.url) as anonymous:
        for path in ("/console/events", "/console/events/inv-1-paid"):
            answer = await anonymous.get(path)
            assert answer.status_code == 303 and answer.headers["location"] == "/console/login"
