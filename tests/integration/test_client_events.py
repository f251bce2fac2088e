"""``outbox.client``'s events against a real served outbox (uvicorn on loopback, a real SQLite
file, the embedded worker delivering to a real receiver): publish, publish_many, get_event."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from outbox import DestinationSpec, Outbox, Role, Settings
from outbox.client import AsyncClient, Client, Enqueued, IntentConflict, InvalidInput, PayloadTooLarge, Published

from ..receiver import Receiver, Reply
from .conftest import SECRET


@pytest.fixture
async def served(tmp_path: Path, receiver: Receiver, serve_api) -> AsyncIterator[tuple[str, str]]:
    """A served outbox whose ``hook`` subscribes to ``invoice.*`` and is delivered to a receiver
    answering 200; the URL and a producer token for scope acme."""
    receiver.script("/hook", Reply(200))
    db_path = tmp_path / "client.db"
    async with await Outbox.open(f"sqlite:///{db_path}") as box:
        await box.put_destination("hook", DestinationSpec(url=f"{receiver.url}/hook", secret=SECRET,
                                                          allow_private_network=True,
                                                          subscriptions=[{"topic": "invoice.*"}]))
        producer, _ = await box.create_token(Role.PRODUCER, ["acme"])
    yield serve_api(Settings(database_url=f"sqlite:///{db_path}", worker=True, authority="allow-all",
                             poll_seconds=0.05)), producer


async def test_publish_get_event_and_wait_for_its_intent(served: tuple[str, str], receiver: Receiver):
    url, token = served
    with Client(url, token=token) as outbox:
        published = outbox.publish("invoice.paid", {"invoice": 1}, scope="acme", event_id="inv-1-paid")
        again = outbox.publish("invoice.paid", {"invoice": 1}, scope="acme", event_id="inv-1-paid")
        generated = outbox.publish("invoice.sent", {"invoice": 2}, scope="acme", max_attempts=3)
        [delivery] = published.event.fanout
        settled = outbox.wait(delivery["action_id"], scope="acme", timeout=20)
        shown = outbox.get_event("inv-1-paid")
        with pytest.raises(IntentConflict):
            outbox.publish("invoice.paid", {"invoice": 99}, scope="acme", event_id="inv-1-paid")
        with pytest.raises(TypeError, match="unexpected"):
            outbox.publish("invoice.paid", {}, scope="acme", destination="hook")
    # the same fan-out (its intent may have been leased by the worker in between)
    assert published.created and not again.created
    assert [(d["destination"], d["action_id"]) for d in again.event.fanout] == [("hook", "evt~inv-1-paid~hook")]
    assert delivery == {"destination": "hook", "action_id": "evt~inv-1-paid~hook", "status": "pending",
                        "skipped": None}
    assert generated.created and generated.event.event_id[14] == "7"  # a UUIDv7 fixed before the first try
    assert settled.status == "delivered" and settled.data["event_id"] == "inv-1-paid"
    assert shown.fanout[0]["status"] == "delivered"
    assert "acme/evt~inv-1-paid~hook" in [r.headers["idempotency-key"] for r in receiver.requests("/hook")]


async def test_publish_many_answers_each_event_in_order(served: tuple[str, str]):
    url, token = served
    async with AsyncClient(url, token=token) as outbox:
        await outbox.publish("invoice.paid", {"n": 0}, scope="acme", event_id="taken")
        results = await outbox.publish_many([
            {"topic": "invoice.paid", "payload": {"n": 1}, "scope": "acme", "event_id": "b1"},
            {"topic": "invoice.paid", "payload": {"n": 9}, "scope": "acme", "event_id": "taken"},
            {"topic": "Not A Topic", "payload": {}, "scope": "acme"},
            {"topic": "user.created", "payload": {}, "scope": "acme", "event_id": "b2"}])
        shown = await outbox.get_event("b1", scope="acme")
    assert [type(r) for r in results] == [Published, IntentConflict, InvalidInput, Published]
    assert results[0].created and results[0].event.fanout[0]["action_id"] == "evt~b1~hook"
    assert results[3].event.fanout == () and shown.event_id == "b1"


async def test_publish_many_takes_what_enqueue_many_takes(served: tuple[str, str]):
    """15 events of 100 KB in one request (under the client's 16 MiB) raised PayloadTooLarge: the
    events' batch was held to one payload and its envelope, where the intents' batch took them."""
    url, token = served
    big = "x" * 100_000
    with Client(url, token=token) as outbox:
        published = outbox.publish_many([{"topic": "user.created", "payload": {"n": n, "big": big}, "scope": "acme",
                                          "event_id": f"big-{n}"} for n in range(15)])
        enqueued = outbox.enqueue_many([{"destination": "hook", "payload": {"n": n, "big": big}, "scope": "acme",
                                         "action_id": f"big-{n}"} for n in range(15)])
    assert [(type(r), r.created) for r in published] == [(Published, True)] * 15
    assert [(type(r), r.created) for r in enqueued] == [(Enqueued, True)] * 15


async def test_a_payload_the_limit_takes_is_taken_alone_as_in_a_batch_however_its_json_is_written(
        served: tuple[str, str]):
    """The client writes JSON as ``json.dumps`` does, every character outside ASCII as an escape
    (``\\u6f22``, six bytes for three of UTF-8). A payload of 900 KB (canonical JSON, under the
    1 MiB limit) was 1.8 MB as sent, and the single routes refused the body unread (413, "the
    limit is 1114112 (payload 1048576 + envelope)") where both batches took the same payload."""
    url, token = served
    text = "\u6f22" * 300_000  # 900,000 bytes of UTF-8
    over = "\u6f22" * 350_000  # 1,050,000 bytes: over max_payload_bytes however written
    with Client(url, token=token) as outbox:
        enqueued = outbox.enqueue("hook", {"t": text}, scope="acme", action_id="wide-1")
        published = outbox.publish("user.created", {"t": text}, scope="acme", event_id="wide-2")
        [batched] = outbox.enqueue_many([{"destination": "hook", "payload": {"t": text}, "scope": "acme",
                                          "action_id": "wide-3"}])
        with pytest.raises(PayloadTooLarge, match="payload is 1050008 bytes of canonical JSON"):
            outbox.enqueue("hook", {"t": over}, scope="acme", action_id="wide-4")
        [refused] = outbox.enqueue_many([{"destination": "hook", "payload": {"t": over}, "scope": "acme",
                                          "action_id": "wide-5"}])
    assert enqueued.created and published.created and isinstance(batched, Enqueued) and batched.created
    assert isinstance(refused, PayloadTooLarge)
