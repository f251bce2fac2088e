"""The store conformance suite, events: publishing and its fan-out, subscriptions, an operator's
delivery, and reading events back. Run on every backend of ``backends.STORE_FACTORIES`` with the
fixtures of ``test_store.py``."""

# ruff: noqa: F811 (the suite's fixtures are imported by name, and the functions here take them by that name)

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from outbox import FanoutTooLarge, IntentConflict, IntentQuery, NotFound, Status, UnknownDestination
from outbox.events import EventQuery, NewEvent
from outbox.grants import GrantSpec
from outbox.model import Approve, Cancel, Event, NewIntent, Ordering, Replay, Settle
from outbox.store import Store
from outbox.store.protocol import Claim
from outbox.topics import Subscription, action_id_for, matches

from .backends import CALLER_SQL
from .test_store import T0, destination, new, open_store, store, store_factory  # noqa: F401 (fixtures)
from .test_store import made as made_change

MAIL = {"host": "mail.example", "port": 25, "from_address": "outbox@example.com"}


def event(event_id: str, topic: str = "invoice.paid", *, scope: str = "acme", digest: str = "sha256:aa",
          payload: str = '{"n":1}', at: datetime = T0) -> NewEvent:
    return NewEvent(event_id=event_id, scope=scope, topic=topic, payload_json=payload, payload_digest=digest,
                    max_attempts=5, next_attempt_at=at, not_before=None, expires_at=None, created_at=at,
                    ordering_key=None, actor="test")


async def subscribe(store: Store, id: str, *patterns: str, scopes: tuple[str, ...] | None = None,
                    grant: str | None = "acme", **changes) -> None:
    """Register webhook destination ``id`` subscribed to ``patterns`` and, unless ``grant`` is
    None, grant scope ``grant`` to it."""
    await store.put_destination(destination(id, subscriptions=tuple(Subscription(p, scopes) for p in patterns),
                                            **changes))
    if grant is not None:
        await store.put_grant(f"g-{id}-{grant}", GrantSpec(scope=grant, destination=id), T0)


def fanned(published) -> dict[str, Status | None]:
    return {d.destination: d.status for d in published.event.fanout}


async def test_an_event_makes_one_intent_per_matching_granted_subscriber_in_one_commit(store):
    await subscribe(store, "exact", "invoice.paid")
    await subscribe(store, "prefix", "invoice.*")
    await subscribe(store, "all", "*")
    await subscribe(store, "other-topic", "invoice.sent", "user.*")
    await subscribe(store, "ungranted", "*", grant=None)
    await subscribe(store, "other-scope", "*", scopes=("globex",))
    await subscribe(store, "approval", "invoice.paid", requires_approval=True)
    published = await store.publish(event("e1"), granted_only=True)
    assert published.created
    assert fanned(published) == {"all": Status.PENDING, "approval": Status.HELD, "exact": Status.PENDING,
                                 "prefix": Status.PENDING}
    for d in published.event.fanout:
        intent = await store.get_intent(f"acme/{action_id_for('e1', d.destination)}")
        assert (intent.event_id, intent.payload, intent.destination) == ("e1", {"n": 1}, d.destination)
        assert [(e.kind, e.data) for e in (await store.history(intent.key)).events] == [
            ("enqueued", {"event_id": "e1"})]
    assert await store.get_event("acme/e1") == published.event


async def test_without_grants_as_the_authority_every_subscriber_gets_an_intent(store):
    await subscribe(store, "ungranted", "*", grant=None)
    await subscribe(store, "other-scope", "*", scopes=("globex",), grant=None)
    assert fanned(await store.publish(event("e1"), granted_only=False)) == {"ungranted": Status.PENDING}


async def test_a_grant_for_every_destination_counts_and_an_expired_one_does_not(store):
    await subscribe(store, "hook", "*", grant=None)
    await store.put_grant("late", GrantSpec(scope="acme", destination="*", expires_at=T0), T0)
    assert fanned(await store.publish(event("e1"), granted_only=True)) == {}
    await store.put_grant("late", GrantSpec(scope="acme", destination="*", expires_at=T0 + timedelta(days=1)), T0)
    assert fanned(await store.publish(event("e2"), granted_only=True)) == {"hook": Status.PENDING}


@pytest.mark.parametrize("pattern", ["*", "invoice.*", "invoice.paid.*", "invoice.paid", "invoice", "invoice_x.*",
                                     "invoice-x.paid"])
async def test_the_store_matches_topics_as_the_pure_matcher_does(store, pattern):
    await subscribe(store, "hook", pattern)
    for n, topic in enumerate(["invoice", "invoice.paid", "invoice.paid.late", "invoices.paid", "invoice_x.y",
                               "invoice-x.paid", "user.invoice.paid"]):
        got = fanned(await store.publish(event(f"e{n}", topic), granted_only=True))
        assert bool(got) is matches(pattern, topic), (pattern, topic)


async def test_publishing_again_answers_the_same_fan_out_and_creates_nothing(store):
    await subscribe(store, "hook", "invoice.*")
    first = await store.publish(event("e1"), granted_only=True)
    await subscribe(store, "late", "invoice.*")  # a later subscription does not receive the old event
    again = await store.publish(event("e1", at=T0 + timedelta(seconds=5)), granted_only=True)
    assert not again.created and again.event == first.event
    assert await store.get_intent(f"acme/{action_id_for('e1', 'late')}") is None


@pytest.mark.parametrize("changes,named", [({"digest": "sha256:bb"}, "payload_digest"),
                                           ({"topic": "invoice.sent"}, "topic")])
async def test_another_event_under_the_same_id_is_a_conflict_that_writes_nothing(store, changes, named):
    await subscribe(store, "hook", "invoice.*")
    await store.publish(event("e1"), granted_only=True)
    with pytest.raises(IntentConflict, match=named) as refused:
        await store.publish(event("e1", **changes), granted_only=True)
    assert "globex" not in str(refused.value)
    assert (await store.get_event("acme/e1")).payload_digest == "sha256:aa"
    page = await store.list_events(EventQuery())
    assert [e.event_id for e in page.events] == ["e1"]


async def test_event_ids_are_per_scope(store):
    await subscribe(store, "hook", "*", grant=None)
    await store.put_grant("all", GrantSpec(scope="globex", destination="*"), T0)
    await store.put_grant("all-acme", GrantSpec(scope="acme", destination="*"), T0)
    await store.publish(event("e1"), granted_only=True)
    theirs = await store.publish(event("e1", scope="globex", digest="sha256:bb"), granted_only=True)
    assert theirs.created and [e.scope for e in await store.events_named("e1")] == ["acme", "globex"]
    assert await store.events_named("nobody") == []


async def test_a_subscriber_whose_channel_refuses_the_payload_is_skipped_and_the_others_get_theirs(store):
    await subscribe(store, "hook", "*")
    await subscribe(store, "mail", "*", channel="email", settings=MAIL)
    published = await store.publish(event("e1", payload='{"not":"an email"}'), granted_only=True)
    assert fanned(published) == {"hook": Status.PENDING, "mail": None}
    skipped = next(d for d in published.event.fanout if d.destination == "mail")
    assert "email channel" in skipped.skipped and skipped.action_id == action_id_for("e1", "mail")
    assert await store.get_intent(f"acme/{skipped.action_id}") is None
    assert (await store.get_event("acme/e1")).fanout == published.event.fanout


async def test_a_derived_action_id_held_by_another_operation_is_skipped(store):
    await subscribe(store, "hook", "*")
    await subscribe(store, "other", "*")
    taken = NewIntent(action_id=action_id_for("e1", "hook"), scope="acme", destination="hook", payload_json="{}",
                      payload_digest="sha256:zz", max_attempts=5, next_attempt_at=T0, not_before=None,
                      expires_at=None, created_at=T0)
    await store.insert_intent(taken, Event(kind="enqueued", at=T0, actor="test"))
    published = await store.publish(event("e1"), granted_only=True)
    assert fanned(published) == {"hook": None, "other": Status.PENDING}


async def test_publish_each_decides_each_event_on_its_own_in_one_commit(store):
    await subscribe(store, "hook", "*")
    await store.publish(event("taken"), granted_only=True)
    results = await store.publish_each([event("e1"), event("taken", digest="sha256:bb"), event("e2"),
                                        event("e1")], granted_only=True)
    assert [type(r).__name__ for r in results] == ["Published", "IntentConflict", "Published", "Published"]
    assert [r.created for r in results if not isinstance(r, Exception)] == [True, True, False]
    assert fanned(results[3]) == {"hook": Status.PENDING}
    assert len((await store.list_events(EventQuery())).events) == 3


async def test_an_event_and_its_intents_commit_and_roll_back_with_the_callers_sql(store):
    await subscribe(store, "hook", "*")
    sql = CALLER_SQL[store.dialect]
    async with store.transaction() as tx:
        await tx.execute(sql.create)
    with pytest.raises(RuntimeError, match="payment failed"):
        async with store.transaction() as tx:
            await tx.execute(sql.insert, (1, 100))
            assert (await tx.publish(event("e1"), granted_only=True)).created
            raise RuntimeError("payment failed")
    assert await store.get_event("acme/e1") is None
    assert await store.get_intent(f"acme/{action_id_for('e1', 'hook')}") is None
    async with store.transaction() as tx:
        await tx.execute(sql.insert, (1, 100))
        await tx.publish(event("e1"), granted_only=True)
    assert fanned(await store.publish(event("e1"), granted_only=True)) == {"hook": Status.PENDING}


async def test_an_operators_delivery_makes_the_destinations_intent_once(store):
    await subscribe(store, "hook", "*")
    await store.publish(event("e1"), granted_only=True)
    await store.put_destination(destination("late"))  # neither subscribed nor granted: the operator's choice
    new = NewIntent(action_id=action_id_for("e1", "late"), scope="acme", destination="late", payload_json='{"n":1}',
                    payload_digest="sha256:aa", max_attempts=5, next_attempt_at=T0, not_before=None,
                    expires_at=None, created_at=T0, event_id="e1")
    first = Event(kind="enqueued", at=T0, actor="op", reason="catch up", data={"event_id": "e1"})
    made, shown = await store.deliver_event(new, first)
    assert made.created and made.intent.event_id == "e1" and made.intent.status is Status.PENDING
    assert {d.destination: d.status for d in shown.fanout} == {"hook": Status.PENDING, "late": Status.PENDING}
    again, _ = await store.deliver_event(new, first)
    assert not again.created and again.intent.seq == made.intent.seq
    with pytest.raises(NotFound):
        await store.deliver_event(replace(new, event_id="nope", action_id=action_id_for("nope", "late")), first)
    assert await store.get_intent(f"acme/{action_id_for('nope', 'late')}") is None
    with pytest.raises(UnknownDestination):
        await store.deliver_event(replace(new, destination="gone", action_id=action_id_for("e1", "gone")), first)


async def test_events_are_listed_newest_first_by_scope_topic_id_and_time_with_a_cursor(store):
    await subscribe(store, "hook", "invoice.*")
    for n, (scope, topic) in enumerate([("acme", "invoice.paid"), ("globex", "invoice.paid"),
                                        ("acme", "user.created"), ("acme", "invoice.sent.late")]):
        await store.publish(event(f"e{n}", topic, scope=scope, at=T0 + timedelta(minutes=n)), granted_only=True)

    async def ids(**query) -> list[str]:
        return [e.event_id for e in (await store.list_events(EventQuery(**query))).events]

    assert await ids() == ["e3", "e2", "e1", "e0"]
    assert await ids(scopes=["acme"]) == ["e3", "e2", "e0"] and await ids(scopes=[]) == []
    assert await ids(topic="invoice.*") == ["e3", "e1", "e0"]
    assert await ids(topic="invoice.paid") == ["e1", "e0"] and await ids(topic="*") == await ids()
    assert await ids(event_id="e2") == ["e2"]
    assert await ids(created_after=T0 + timedelta(minutes=1), created_before=T0 + timedelta(minutes=3)) == ["e2", "e1"]
    page = await store.list_events(EventQuery(limit=3))
    assert [e.event_id for e in page.events] == ["e3", "e2", "e1"] and page.next_seq is not None
    assert await ids(before_seq=page.next_seq) == ["e0"]
    assert {d.destination for d in page.events[0].fanout} == {"hook"}


async def test_subscriptions_are_replaced_with_their_destination_and_removed_with_it(store):
    await subscribe(store, "hook", "invoice.*")
    assert (await store.get_destination("hook")).subscriptions == (Subscription("invoice.*"),)
    await store.put_destination(destination("hook", subscriptions=(Subscription("user.*", ("acme", "globex")),)))
    assert (await store.get_destination("hook")).subscriptions == (Subscription("user.*", ("acme", "globex")),)
    assert fanned(await store.publish(event("e1", "invoice.paid"), granted_only=True)) == {}
    assert fanned(await store.publish(event("e2", "user.created"), granted_only=True)) == {"hook": Status.PENDING}
    await store.put_destination(destination("fresh", subscriptions=(Subscription("*"),)))
    await store.delete_destination("fresh")
    assert await store.get_destination("fresh") is None
    await store.put_destination(destination("fresh"))  # registered again: none of the old subscriptions
    await store.put_grant("g-fresh", GrantSpec(scope="acme", destination="fresh"), T0)
    assert "fresh" not in fanned(await store.publish(event("e3", "user.created"), granted_only=True))


async def test_concurrent_publishes_of_one_event_make_one_fan_out(store):
    await subscribe(store, "hook", "*")
    await subscribe(store, "other", "*")
    results = await asyncio.gather(*(store.publish(event("e1"), granted_only=True) for _ in range(4)))
    assert sorted(r.created for r in results) == [False, False, False, True]
    assert len({r.event.fanout for r in results}) == 1
    page = await store.list_events(EventQuery())
    assert [e.event_id for e in page.events] == ["e1"]


# -- an event's payload, stored once -----------------------------------------------------------

#: A payload large enough that a copy of it per intent would show in what is stored.
BIG = '{"note":"' + "x" * 20_000 + '"}'
OTHER = '{"note":"' + "y" * 10_000 + '"}'


async def stored_payload_bytes(store: Store) -> int:
    """The bytes of payload the store holds, in its intents and its events together."""
    async with store.transaction() as tx:
        [(found,)] = await tx.execute(CALLER_SQL[store.dialect].payload_bytes)
    return int(found)


async def test_an_events_payload_is_stored_once_however_many_intents_it_makes(store):
    for n in range(8):
        await subscribe(store, f"d{n}", "*")
    before = await stored_payload_bytes(store)
    published = await store.publish(event("e1", payload=BIG), granted_only=True)
    assert len(published.event.fanout) == 8
    assert await stored_payload_bytes(store) - before == len(BIG)  # the event's copy only, not 1 + 8
    await store.publish_each([event("e2", payload=BIG), event("e3", payload=OTHER)], granted_only=True)
    async with store.transaction() as tx:
        await tx.publish(event("e4", payload=BIG), granted_only=True)
    await store.put_destination(destination("late"))
    late = NewIntent(action_id=action_id_for("e1", "late"), scope="acme", destination="late", payload_json=BIG,
                     payload_digest="sha256:aa", max_attempts=5, next_attempt_at=T0, not_before=None,
                     expires_at=None, created_at=T0, event_id="e1")
    made, shown = await store.deliver_event(late, Event(kind="enqueued", at=T0, actor="op", data={"event_id": "e1"}))
    assert made.created and len(shown.fanout) == 9 and made.intent.payload_json == BIG
    assert await stored_payload_bytes(store) - before == 3 * len(BIG) + len(OTHER)
    for n in range(8):
        for event_id, payload in (("e1", BIG), ("e2", BIG), ("e3", OTHER), ("e4", BIG)):
            assert (await store.get_intent(f"acme/{action_id_for(event_id, f'd{n}')}")).payload_json == payload
    assert (await store.get_intent(f"acme/{late.action_id}")).payload_json == BIG


async def test_every_reader_of_an_events_intents_reads_the_events_own_payload(store):
    await subscribe(store, "hook", "*")
    await subscribe(store, "limited", "*", max_in_flight=10)  # claimed through the flow-control path
    await subscribe(store, "ordered", "*", ordering=Ordering.KEY)
    await subscribe(store, "approval", "*", requires_approval=True)
    await store.insert_intent(*new("direct"))  # an intent's own payload, beside
    before = await stored_payload_bytes(store)
    await store.publish(replace(event("e1", payload=BIG), ordering_key="k"), granted_only=True)
    await store.publish(replace(event("e2", payload=OTHER, digest="sha256:bb"), ordering_key="k"), granted_only=True)
    assert await stored_payload_bytes(store) - before == len(BIG) + len(OTHER)
    sent = {f"acme/{action_id_for(e, d)}": payload for e, payload in (("e1", BIG), ("e2", OTHER))
            for d in ("hook", "limited", "ordered", "approval")}
    sent["acme/direct"] = '{"n":1}'

    def read(intents) -> dict[str, str]:
        return {i.key: i.payload_json for i in intents}

    assert read([await store.get_intent(key) for key in sent]) == sent
    assert read([(await store.history(key)).intent for key in sent]) == sent
    assert read((await store.list_intents(IntentQuery(limit=50))).intents) == sent
    assert read([i for d in ("hook", "limited") for i in await store.intents_named(action_id_for("e1", d))]) == {
        f"acme/{action_id_for('e1', d)}": BIG for d in ("hook", "limited")}
    assert (await store.get_event("acme/e2")).payload_json == OTHER
    assert (await store.waiting_behind(f"acme/{action_id_for('e2', 'ordered')}")).payload_json == BIG
    claimed = (await store.apply([], claim=Claim("w1", T0, T0 + timedelta(seconds=30), 50))).claimed
    assert read(claimed) == {key: payload for key, payload in sent.items()
                             if "approval" not in key and key != f"acme/{action_id_for('e2', 'ordered')}"}
    expired = await store.expired_leases(T0 + timedelta(seconds=31), 50)
    assert read(i for i, _ in expired) == read(claimed)
    hook = await store.get_intent(f"acme/{action_id_for('e1', 'hook')}")
    ev = (Event(kind="dead_lettered", at=T0, actor="w1"),)
    await made_change(store, Settle(hook.key, hook.fence, Status.DEAD, ev))
    replayed = await made_change(store, Replay(hook.key, Status.DEAD, T0, 5, (Event(kind="replayed", at=T0,
                                                                                      actor="op"),)))
    assert replayed.payload_json == BIG
    waiting = f"acme/{action_id_for('e2', 'ordered')}"
    cancelled = await made_change(store, Cancel(waiting, Status.PENDING, (Event(kind="cancelled", at=T0, actor="op"),)))
    assert cancelled.payload_json == OTHER
    held = f"acme/{action_id_for('e2', 'approval')}"
    approved = await made_change(store, Approve(held, "sha256:bb", T0 + timedelta(hours=1), "op", T0,
                                                (Event(kind="approved", at=T0, actor="op"),)))
    assert approved.payload_json == OTHER


async def test_pruning_some_of_an_events_intents_keeps_its_payload_for_the_rest(store):
    for n in range(3):
        await subscribe(store, f"d{n}", "*")
    await store.publish(event("e1", payload=BIG), granted_only=True)
    keys = [f"acme/{action_id_for('e1', f'd{n}')}" for n in range(3)]

    async def withdraw(key: str) -> None:
        await made_change(store, Cancel(key, Status.PENDING, (Event(kind="cancelled", at=T0, actor="op"),)))

    async def delete_the_event() -> None:
        async with store.transaction() as tx:
            await tx.execute(CALLER_SQL[store.dialect].delete_event)

    for key in keys[:2]:
        await withdraw(key)
    assert await store.prune(T0 + timedelta(days=1), dry_run=False, limit=None) == [
        action_id_for("e1", "d0"), action_id_for("e1", "d1")]
    assert [await store.get_intent(key) for key in keys[:2]] == [None, None]
    assert (await store.get_intent(keys[2])).payload_json == BIG
    shown = await store.get_event("acme/e1")
    assert shown.payload_json == BIG and [d.destination for d in shown.fanout] == ["d2"]
    with pytest.raises(Exception, match="intents that remain"):  # the payload an intent sends stays with it
        await delete_the_event()
    assert (await store.get_intent(keys[2])).payload_json == BIG
    await withdraw(keys[2])
    assert await store.prune(T0 + timedelta(days=1), dry_run=False, limit=None) == [action_id_for("e1", "d2")]
    assert (await store.get_event("acme/e1")).payload_json == BIG  # events are kept: pruning removes intents
    await delete_the_event()  # with no intent left to send it, the event (and its payload) may go
    assert await store.get_event("acme/e1") is None


async def test_an_event_past_max_fanout_is_refused_writing_nothing_and_one_recorded_is_answered(store):
    for n in range(3):
        await subscribe(store, f"d{n}", "*")
    await subscribe(store, "invoices", "invoice.*")  # invoice.paid reaches 4, user.created 3
    with pytest.raises(FanoutTooLarge, match="max_fanout") as refused:
        await store.publish(event("e1"), granted_only=True, max_fanout=3)
    assert (refused.value.fanout, refused.value.max_fanout) == (4, 3)
    assert await store.get_event("acme/e1") is None
    assert (await store.list_intents(IntentQuery())).intents == []
    with pytest.raises(FanoutTooLarge):
        async with store.transaction() as tx:
            await tx.publish(event("e1"), granted_only=True, max_fanout=3)
    assert await store.get_event("acme/e1") is None
    first = await store.publish(event("e1"), granted_only=True, max_fanout=4)  # at the limit: made
    assert first.created and len(first.event.fanout) == 4
    again = await store.publish(event("e1"), granted_only=True, max_fanout=1)  # recorded already: as it stands
    assert not again.created and again.event == first.event
    with pytest.raises(IntentConflict):
        await store.publish(event("e1", digest="sha256:bb"), granted_only=True, max_fanout=1)
    results = await store.publish_each([event("e2"), event("e3", "user.created"), event("e1"), event("e2")],
                                       granted_only=True, max_fanout=3)
    assert [type(r).__name__ for r in results] == ["FanoutTooLarge", "Published", "Published", "FanoutTooLarge"]
    assert results[0].details() == {"fanout": 4, "max_fanout": 3}
    assert results[1].created and len(results[1].event.fanout) == 3
    assert not results[2].created and results[2].event == first.event
    assert await store.get_event("acme/e2") is None
    assert len((await store.list_intents(IntentQuery())).intents) == 7


async def test_a_batch_past_max_batch_fanout_refuses_the_events_that_would_take_it_past(store):
    """The batch's budget is spent in order: an event that would take it past is refused in its
    place, writing nothing of it; an event recorded already is answered as it stands, whatever
    the budget."""
    for n in range(3):
        await subscribe(store, f"d{n}", "*")  # every event reaches 3
    first = await store.publish(event("e0"), granted_only=True)
    results = await store.publish_each([event("e1"), event("e2"), event("e0"), event("e3")],
                                       granted_only=True, max_batch_fanout=7)
    assert [type(r).__name__ for r in results] == ["Published", "Published", "Published", "FanoutTooLarge"]
    assert results[0].created and results[1].created
    assert not results[2].created and results[2].event == first.event  # past the budget, but recorded already
    assert "max_batch_fanout" in results[3].message and results[3].details() == {"fanout": 9, "max_fanout": 7}
    assert await store.get_event("acme/e3") is None
    assert len((await store.list_intents(IntentQuery())).intents) == 9
