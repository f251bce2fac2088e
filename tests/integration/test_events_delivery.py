"""An event's fan-out delivered for real: one publish reaches a webhook receiver over uvicorn, the
test SMTP server and a Kafka-protocol broker, each through its own intent; and a fan-out that
fails in the middle of its commit leaves nothing behind, on both stores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from outbox import DestinationSpec, Status
from outbox.grants import GrantSpec
from outbox.store import intake
from sender.email import EmailSpec
from sender.kafka import KafkaSpec
from tests.conftest import SECRET, eventually, open_box, rows
from tests.kafka import Broker
from tests.receiver import Receiver, Reply
from tests.smtp import SmtpServer

from .conftest import SenderEnv
from .test_kafka import records

#: A payload every channel can carry: an email message is JSON to a webhook and to a topic.
MESSAGE = {"to": ["Ann <ann@example.org>"], "subject": "Order 7 shipped", "text": "It is on its way."}
SUBSCRIBED = [{"topic": "order.*"}]


async def test_one_event_reaches_a_webhook_a_mailbox_and_a_topic_each_through_its_own_intent(
        env: SenderEnv, receiver: Receiver, tmp_path: Path):
    receiver.script("/hook", Reply(200))
    smtp = SmtpServer().start()
    broker = Broker("noida", tmp_path).start()
    try:
        await broker.create_topic("orders")
        await env.destination(f"{receiver.url}/hook", "hook", subscriptions=SUBSCRIBED)
        await env.box.put_destination("mail", EmailSpec.model_validate({
            "channel": "email", "host": "127.0.0.1", "port": smtp.port, "from": "Shop <shop@example.com>",
            "allow_private_network": True, "tls": "none", "allow_insecure": True, "subscriptions": SUBSCRIBED}))
        await env.box.put_destination("log", KafkaSpec.model_validate({
            "channel": "kafka", "bootstrap_servers": [broker.bootstrap], "topic": "orders", "secret": SECRET,
            "allow_private_network": True, "timeout_seconds": 2.0, "subscriptions": SUBSCRIBED}))
        await env.destination(f"{receiver.url}/other", "other", subscriptions=[{"topic": "invoice.*"}])

        published = await env.box.publish(scope="acme", topic="order.shipped", event_id="order-7-shipped",
                                          payload=MESSAGE)
        assert published.created
        assert {d.destination: d.status for d in published.event.fanout} == {
            "hook": Status.PENDING, "log": Status.PENDING, "mail": Status.PENDING}

        async def all_delivered() -> bool:
            event = await env.box.get_event("order-7-shipped", scope="acme")
            return all(d.status is Status.DELIVERED for d in event.fanout)

        async with env.running():
            assert await eventually(all_delivered, timeout=20)
        [request] = receiver.requests("/hook")
        assert request.headers["idempotency-key"] == "acme/evt~order-7-shipped~hook"
        [mail] = smtp.received
        assert mail.message["Subject"] == "Order 7 shipped"
        assert mail.message["Message-ID"] == "<acme/evt~order-7-shipped~mail@example.com>"
        [record] = await records(broker, "orders")
        assert dict(record.headers)["idempotency-key"] == b"acme/evt~order-7-shipped~log"
        assert receiver.requests("/other") == []
        metrics = env.box.metrics
        assert metrics.events_published._value.get() == 1 and metrics.intents_fanned_out._value.get() == 3
    finally:
        smtp.stop()
        broker.stop()


async def test_a_fan_out_that_fails_in_its_commit_leaves_no_event_and_no_intent(
        store_url: str, monkeypatch: pytest.MonkeyPatch):
    box = await open_box(store_url)
    try:
        for id in ("a", "b", "c"):
            await box.put_destination(id, DestinationSpec(url=f"https://{id}.example/", secret=SECRET,
                                                          subscriptions=[{"topic": "*"}]))
        await box.put_grant("acme", GrantSpec(scope="acme", destination="*"))

        def fails_after_the_intents_are_written(*args: Any) -> Any:
            raise RuntimeError("the database went away mid-commit")

        monkeypatch.setattr(intake, "fanout_of", fails_after_the_intents_are_written)  # (both stores' steps)
        with pytest.raises(RuntimeError, match="mid-commit"):
            await box.publish(scope="acme", topic="order.shipped", event_id="e1", payload={"n": 1})
        assert await rows(store_url, "SELECT count(*) FROM topic_events") == [(0,)]
        assert await rows(store_url, "SELECT count(*) FROM intents") == [(0,)]
        monkeypatch.undo()
        published = await box.publish(scope="acme", topic="order.shipped", event_id="e1", payload={"n": 1})
        assert published.created and len(published.event.fanout) == 3
        assert await rows(store_url, "SELECT count(*) FROM intents WHERE event_id = 'e1'") == [(3,)]
    finally:
        await box.close()
