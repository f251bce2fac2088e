"""``Outbox.publish`` and its companions as a library caller uses them, on both stores: what is
checked before anything is written, the caller's own transaction (on PostgreSQL, the caller's own
asyncpg connection), an operator's delivery, and the metrics."""

from __future__ import annotations

import pytest

from outbox import DestinationSpec, IntentConflict, InvalidInput, NotFound, Outbox, Settings, Status
from outbox.grants import GrantSpec
from outbox.intake import MAX_EVENT_KEY

from ..conftest import SECRET, open_box, rows


async def subscribed(url: str) -> Outbox:
    """An outbox on ``url`` whose ledger subscribes to invoice.* (granted to acme) and whose late does not."""
    box = await open_box(url)
    await box.put_destination("ledger", DestinationSpec(url="https://ledger.example/", secret=SECRET,
                                                        subscriptions=[{"topic": "invoice.*"}]))
    await box.put_destination("late", DestinationSpec(url="https://late.example/", secret=SECRET))
    await box.put_grant("acme", GrantSpec(scope="acme", destination="ledger"))
    return box


async def test_bad_events_are_refused_before_anything_is_written(store_url: str):
    box = await subscribed(store_url)
    try:
        for bad, named in [({"topic": "Invoice.Paid"}, "topic"), ({"topic": "invoice.*"}, "topic"),
                           ({"event_id": "no/slash"}, "event_id"), ({"scope": "a b"}, "scope"),
                           ({"max_attempts": 0}, "max_attempts"), ({"payload": float("nan")}, "NaN"),
                           ({"event_id": "e" * 100, "scope": "s" * (MAX_EVENT_KEY - 99)}, "scope and event_id")]:
            with pytest.raises(InvalidInput, match=named):
                await box.publish(**{"scope": "acme", "topic": "invoice.paid", "payload": {}, **bad})
        assert await rows(store_url, "SELECT count(*) FROM topic_events") == [(0,)]
        published = await box.publish(scope="s" * (MAX_EVENT_KEY - 100), topic="invoice.paid",
                                      event_id="e" * 100, payload={})
        assert published.created  # the longest scope and event id together that fit
    finally:
        await box.close()


async def test_a_publish_commits_and_rolls_back_with_the_callers_own_writes(store_url: str):
    box = await subscribed(store_url)
    try:
        with pytest.raises(RuntimeError, match="payment failed"):
            async with box.transaction() as tx:
                assert (await tx.publish(scope="acme", topic="invoice.paid", event_id="e1", payload={})).created
                raise RuntimeError("payment failed")
        with pytest.raises(NotFound):
            await box.get_event("e1")
        async with box.transaction() as tx:
            await tx.publish(scope="acme", topic="invoice.paid", event_id="e1", payload={})
        assert [d.status for d in (await box.get_event("e1")).fanout] == [Status.PENDING]
        if store_url.startswith("postgres"):
            import asyncpg

            conn = await asyncpg.connect(store_url)
            try:
                async with conn.transaction():
                    async with box.transaction(connection=conn) as tx:
                        await tx.publish(scope="acme", topic="invoice.paid", event_id="e2", payload={})
                    assert await rows(store_url, "SELECT count(*) FROM topic_events WHERE event_id = 'e2'") == [(0,)]
            finally:
                await conn.close()
            assert len((await box.get_event("e2", scope="acme")).fanout) == 1
    finally:
        await box.close()


async def test_an_operators_delivery_and_the_metrics(store_url: str):
    box = await subscribed(store_url)
    try:
        await box.publish(scope="acme", topic="invoice.paid", event_id="e1", payload={"n": 1})
        await box.publish(scope="acme", topic="invoice.paid", event_id="e1", payload={"n": 1})
        with pytest.raises(IntentConflict, match="payload_digest"):
            await box.publish(scope="acme", topic="invoice.paid", event_id="e1", payload={"n": 2})
        made, event = await box.deliver_event("e1", "late", actor="op", reason="subscribed late")
        again, _ = await box.deliver_event("e1", "late", actor="op")
        assert made.created and not again.created and made.intent.payload == {"n": 1}
        assert {d.destination for d in event.fanout} == {"ledger", "late"}
        history = await box.history(made.intent.action_id, scope="acme")
        assert [(e.actor, e.reason) for e in history.events] == [("op", "subscribed late")]
        assert box.metrics.events_published._value.get() == 1
        assert box.metrics.intents_fanned_out._value.get() == 2
        with pytest.raises(NotFound):
            await box.deliver_event("nope", "late")
    finally:
        await box.close()


async def test_without_grants_as_the_authority_every_subscriber_gets_an_intent(store_url: str):
    box = await subscribed(store_url)
    await box.close()
    async with await Outbox.open(store_url, settings=Settings(database_url=store_url, authority="allow-all")) as box:
        await box.put_destination("ungranted", DestinationSpec(url="https://u.example/", secret=SECRET,
                                                               subscriptions=[{"topic": "*"}]))
        published = await box.publish(scope="globex", topic="invoice.paid", payload={})
        assert {d.destination for d in published.event.fanout} == {"ledger", "ungranted"}



async def test_intents_of_events_published_before_migration_0018_send_their_events_stored_payload(
        store_url: str, monkeypatch: pytest.MonkeyPatch):
    """Rows written as releases before 0018 wrote them (each intent of an event with its own copy
    of the payload) are converted: each then sends the event's, stored once, and a row whose copy is
    not the event's (written by hand) keeps its own."""
    from outbox.store import migrator
    from outbox.store.postgres import store as postgres_dialect
    from outbox.store.sqlite import store as sqlite_dialect

    module = sqlite_dialect if store_url.startswith("sqlite:") else postgres_dialect
    with monkeypatch.context() as patched:
        # (and 0021's columns, which today's registration of the destination writes)
        patched.setattr(module, "scripts_for", lambda name: [m for m in migrator.scripts_for(name)
                                                             if m.version < 18 or m.version == 21])
        box = await open_box(store_url)
        await box.close()
    at = "1700000000000000" if store_url.startswith("sqlite:") else "now()"
    payload, digest = '{"invoice":42}', "sha256:" + "a" * 64
    await rows(store_url, f"""INSERT INTO topic_events (event_key, event_id, scope, topic, payload, payload_digest,
                                                        actor, created_at)
                              VALUES ('acme/e1', 'e1', 'acme', 'invoice.paid', '{payload}', '{digest}', 'api', {at})""")
    for action_id, copy, copied_digest in (("evt~e1~billing", payload, digest),
                                           ("evt~e1~hand", '{"by":"hand"}', "sha256:" + "b" * 64)):
        await rows(store_url, f"""
            INSERT INTO intents (intent_key, action_id, scope, destination, channel, payload, payload_digest, status,
                                 max_attempts, next_attempt_at, created_at, updated_at, event_id)
            VALUES ('acme/{action_id}', '{action_id}', 'acme', 'billing', 'webhook', '{copy}', '{copied_digest}',
                    'pending', 5, {at}, {at}, {at}, 'e1')""")
    box = await Outbox.open(store_url)  # migrates 0018
    try:
        assert (await box.get("evt~e1~billing", scope="acme")).payload_json == payload
        assert (await box.get("evt~e1~hand", scope="acme")).payload_json == '{"by":"hand"}'
        assert sorted(await rows(store_url, "SELECT action_id, payload, payload_event FROM intents")) == [
            ("evt~e1~billing", "", 1), ("evt~e1~hand", '{"by":"hand"}', None)]
    finally:
        await box.close()
