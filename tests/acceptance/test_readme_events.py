"""The README's events walkthrough runs as printed against ``outbox serve`` in a directory of its
own: two destinations subscribe, one publish fans out to both, and the answer is what the README
shows; only the admin token and the port are this run's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx

from .test_readme import README, bash, shell_block_after
from .test_service import Service

HEADING = "### Events and subscriptions"


def test_the_events_walkthrough_fans_one_event_out_to_its_subscribers(tmp_path: Path):
    service = Service(tmp_path, "--no-worker")
    try:
        admin = service.first_admin_token()
        assert admin is not None
        block = shell_block_after(HEADING)
        shown = bash(block.replace("ADMIN=obx_...", f"ADMIN={admin}")
                     .replace("localhost:8080", f"127.0.0.1:{service.port}"), tmp_path)
        again = httpx.get(f"{service.url}/v1/events/invoice-42-paid", params={"scope": "acme"},
                          headers={"Authorization": f"Bearer {admin}"}).json()
        intent = httpx.get(f"{service.url}/v1/intents/evt~invoice-42-paid~ledger",
                           headers={"Authorization": f"Bearer {admin}"}).json()
    finally:
        service.stop()
    assert "HTTP/1.1 201 Created" in shown and "location: /v1/events/invoice-42-paid?scope=acme" in shown
    published = json.loads(shown[shown.index('{"event_id"'):])
    assert published == again
    assert published["fanout"] == [
        {"destination": "crm", "action_id": "evt~invoice-42-paid~crm", "status": "pending", "skipped": None},
        {"destination": "ledger", "action_id": "evt~invoice-42-paid~ledger", "status": "pending", "skipped": None}]
    assert (intent["event_id"], intent["payload"]) == ("invoice-42-paid", {"amount_cents": 1999, "invoice": 42})
    # the answer the README prints is this one, abbreviated where it says "..."
    text = README.read_text()
    printed = re.search(r"```\nHTTP/1.1 201 Created\n.*?```", text[text.index(HEADING):], re.S)
    assert printed is not None
    for destination in published["fanout"]:
        assert json.dumps(destination, separators=(",", ":")) in printed.group(0).replace("\n  ", "")
