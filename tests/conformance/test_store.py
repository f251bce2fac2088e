"""The store conformance suite: every backend must pass exactly these tests.

A backend joins by adding a factory to BACKENDS (and, for the caller's-own-SQL tests, its
dialect's statements to CALLER_SQL).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from outbox import (
    Channel,
    DestinationInUse,
    Event,
    IllegalTransition,
    IntentConflict,
    IntentQuery,
    NotFound,
    OnUnknown,
    Role,
    StaleWrite,
    Status,
    UnknownDestination,
)
from outbox.destinations import Destination
from outbox.model import NewIntent
from outbox.store import SqliteStore, Store
from outbox.tokens import TokenInfo

T0 = datetime(2030, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)

BACKENDS: dict[str, Callable[[Path], Awaitable[Store]]] = {}


def backend(name: str):
    def register(factory):
        BACKENDS[name] = factory
        return factory
    return register


@backend("sqlite")
async def _sqlite(tmp: Path) -> Store:
    return SqliteStore(tmp / "conformance.db")


CALLER_SQL = {
    "sqlite": {
        "create": "CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER NOT NULL)",
        "insert": "INSERT INTO orders (id, total) VALUES (?, ?)",
        "count": "SELECT count(*) FROM orders",
    },
}


@pytest.fixture(params=sorted(BACKENDS))
async def store(request, tmp_path) -> AsyncIterator[Store]:
    s = await BACKENDS[request.param](tmp_path)
    await s.open()
    await s.migrate()
    await s.put_destination(destination("billing"))
    await s.put_destination(destination("approvals", requires_approval=True))
    try:
        yield s
    finally:
        await s.close()


def destination(id: str, **changes) -> Destination:
    base = Destination(
        id=id, channel=Channel.WEBHOOK, url=f"https://{id}.example/hook", secrets=("whsec_x",),
        idempotent=True, retention_seconds=3600, on_unknown=OnUnknown.DECLARED,
        timeout_seconds=5.0, requires_approval=False, allow_private_network=False,
        disabled=False, created_at=T0, updated_at=T0,
    )
    return replace(base, **changes)


def new(action_id: str, *, scope: str = "acme", dest: str = "billing", digest: str = "sha256:aa",
        at: datetime = T0) -> tuple[NewIntent, Event]:
    return (
        NewIntent(action_id=action_id, scope=scope, destination=dest, payload_json='{"n":1}',
                  payload_digest=digest, max_attempts=5, next_attempt_at=at, not_before=None,
                  expires_at=None, created_at=at),
        Event(kind="enqueued", at=at, actor="test"),
    )


async def test_migrate_is_versioned_and_idempotent(store):
    assert await store.migrate() == []
    await store.ping()


async def test_insert_creates_a_pending_intent_with_its_first_event(store):
    result = await store.insert_intent(*new("a1"))
    assert result.created
    intent = result.intent
    assert (intent.status, intent.fence, intent.attempts, intent.payload) == (Status.PENDING, 0, 0, {"n": 1})
    assert intent.created_at == T0 and intent.next_attempt_at == T0  # microseconds survive
    assert await store.get_intent("a1") == intent
    history = await store.history("a1")
    assert [(e.kind, e.actor) for e in history.events] == [("enqueued", "test")]
    assert history.attempts == []


async def test_the_same_operation_again_returns_the_existing_intent(store):
    first = await store.insert_intent(*new("a1"))
    again = await store.insert_intent(*new("a1", at=T0 + timedelta(seconds=5)))
    assert not again.created
    assert again.intent == first.intent
    assert len((await store.history("a1")).events) == 1


@pytest.mark.parametrize(
    "changes,named",
    [({"digest": "sha256:bb"}, "payload_digest"), ({"scope": "globex"}, "scope"),
     ({"dest": "approvals"}, "destination")],
)
async def test_another_operation_under_the_same_action_id_is_a_conflict(store, changes, named):
    await store.insert_intent(*new("a1"))
    with pytest.raises(IntentConflict, match=named):
        await store.insert_intent(*new("a1", **changes))
    assert (await store.get_intent("a1")).payload_digest == "sha256:aa"
    assert len((await store.history("a1")).events) == 1


async def test_unknown_destination_is_refused_and_nothing_is_written(store):
    with pytest.raises(UnknownDestination, match="'nowhere' is not registered"):
        await store.insert_intent(*new("a1", dest="nowhere"))
    assert await store.get_intent("a1") is None


async def test_destinations_requiring_approval_hold_new_intents(store):
    result = await store.insert_intent(*new("a1", dest="approvals"))
    assert result.intent.status is Status.HELD


async def test_concurrent_duplicates_create_exactly_one_intent(store):
    results = await asyncio.gather(*(store.insert_intent(*new("dup")) for _ in range(20)))
    assert sum(r.created for r in results) == 1
    assert len({r.intent.seq for r in results}) == 1


async def test_concurrent_writers_fail_independently(store):
    await store.insert_intent(*new("taken"))
    results = await asyncio.gather(
        *(store.insert_intent(*new(f"ok{i}")) for i in range(10)),
        store.insert_intent(*new("taken", digest="sha256:other")),
        return_exceptions=True,
    )
    assert isinstance(results[-1], IntentConflict)
    assert all(r.created for r in results[:-1])
    assert len((await store.list_intents(IntentQuery(limit=50))).intents) == 11


async def test_a_batch_is_recorded_whole_or_not_at_all(store):
    await store.insert_intent(*new("taken"))
    with pytest.raises(IntentConflict):
        await store.insert_intents([new("b1"), new("b2"), new("taken", digest="sha256:zz")])
    assert await store.get_intent("b1") is None
    results = await store.insert_intents([new("b1"), new("b2")])
    assert [r.created for r in results] == [True, True]


async def test_update_moves_status_applies_changes_and_appends_an_event(store):
    await store.insert_intent(*new("a1"))
    later = T0 + timedelta(seconds=1)
    intent = await store.update_intent(
        "a1", expected=Status.PENDING, status=Status.LEASED,
        events=[Event(kind="leased", at=later, actor="worker-1", data={"fence": 1})],
        changes={"lease_owner": "worker-1", "lease_expires_at": later + timedelta(seconds=30), "fence": 1},
    )
    assert (intent.status, intent.lease_owner, intent.fence, intent.updated_at) == (
        Status.LEASED, "worker-1", 1, later)
    events = (await store.history("a1")).events
    assert [e.kind for e in events] == ["enqueued", "leased"]
    assert events[-1].data == {"fence": 1}


async def test_an_illegal_transition_raises_and_writes_nothing(store):
    before = (await store.insert_intent(*new("a1"))).intent
    with pytest.raises(IllegalTransition, match="'pending' to 'delivered'"):
        await store.update_intent("a1", expected=Status.PENDING, status=Status.DELIVERED,
                                  events=[Event(kind="delivered", at=T0, actor="x")])
    assert await store.get_intent("a1") == before
    assert len((await store.history("a1")).events) == 1


async def test_a_write_from_a_stale_status_or_fence_is_rejected(store):
    await store.insert_intent(*new("a1"))
    ev = Event(kind="leased", at=T0, actor="w")
    await store.update_intent("a1", expected=Status.PENDING, status=Status.LEASED, events=[ev],
                              changes={"fence": 1})
    with pytest.raises(StaleWrite, match="leased at fence 1"):
        await store.update_intent("a1", expected=Status.PENDING, status=Status.LEASED, events=[ev])
    with pytest.raises(StaleWrite, match="not leased at fence 7"):
        await store.update_intent("a1", expected=Status.LEASED, status=Status.DELIVERED,
                                  events=[ev], fence=7)
    assert (await store.get_intent("a1")).status is Status.LEASED
    done = await store.update_intent("a1", expected=Status.LEASED, status=Status.DELIVERED,
                                     events=[ev], fence=1)
    assert done.status is Status.DELIVERED
    with pytest.raises(NotFound):
        await store.update_intent("ghost", expected=Status.PENDING, status=Status.LEASED, events=[ev])


async def test_only_known_columns_can_be_updated(store):
    await store.insert_intent(*new("a1"))
    with pytest.raises(ValueError, match="payload"):
        await store.update_intent("a1", expected=Status.PENDING, status=Status.LEASED,
                                  events=[Event(kind="x", at=T0, actor="x")], changes={"payload": "{}"})


async def test_listing_filters_and_pages_newest_first_without_gaps(store):
    for i in range(7):
        await store.insert_intent(*new(f"i{i}", scope="acme" if i % 2 else "globex",
                                       at=T0 + timedelta(minutes=i)))
    await store.insert_intent(*new("held", dest="approvals", at=T0 + timedelta(minutes=10)))
    seen, before = [], None
    while True:
        page = await store.list_intents(IntentQuery(limit=3, before_seq=before))
        seen += [i.action_id for i in page.intents]
        if page.next_seq is None:
            break
        before = page.next_seq
    assert seen == ["held", "i6", "i5", "i4", "i3", "i2", "i1", "i0"]

    async def ids(**query) -> list[str]:
        return [i.action_id for i in (await store.list_intents(IntentQuery(**query))).intents]

    assert await ids(statuses=[Status.HELD]) == ["held"]
    assert await ids(scopes=["acme"], destination="billing") == ["i5", "i3", "i1"]
    assert await ids(scopes=[]) == []
    assert await ids(channel=Channel.WEBHOOK, limit=2) == ["held", "i6"]
    assert await ids(created_after=T0 + timedelta(minutes=2), created_before=T0 + timedelta(minutes=4)) == ["i3", "i2"]


async def test_destinations_are_registered_replaced_and_listed(store):
    assert await store.put_destination(destination("crm")) is True
    assert await store.put_destination(destination("crm", url="https://crm.example/v2")) is False
    found = await store.get_destination("crm")
    assert found.url == "https://crm.example/v2" and found.secrets == ("whsec_x",)
    assert [d.id for d in await store.list_destinations()] == ["approvals", "billing", "crm"]
    assert await store.get_destination("nope") is None


async def test_a_destination_is_deleted_only_when_nothing_refers_to_it(store):
    await store.insert_intent(*new("a1"))
    with pytest.raises(DestinationInUse, match="1 intent"):
        await store.delete_destination("billing")
    await store.update_intent("a1", expected=Status.PENDING, status=Status.CANCELLED,
                              events=[Event(kind="cancelled", at=T0, actor="op")])
    with pytest.raises(DestinationInUse, match="disable it instead"):
        await store.delete_destination("billing")
    with pytest.raises(NotFound):
        await store.delete_destination("nope")
    await store.delete_destination("approvals")
    assert await store.get_destination("approvals") is None


async def test_tokens_are_found_by_hash_until_revoked(store):
    info = TokenInfo("t1", Role.PRODUCER, ("acme", "globex"), "ci", T0, None)
    await store.insert_token(info, "hash-1")
    assert await store.token_by_hash("hash-1") == info
    assert await store.count_active_tokens("producer") == 1
    revoked = await store.revoke_token("t1", T0 + timedelta(seconds=1))
    assert revoked.revoked_at == T0 + timedelta(seconds=1)
    assert await store.token_by_hash("hash-1") is None
    assert await store.count_active_tokens("producer") == 0
    assert [t.id for t in await store.list_tokens()] == ["t1"]
    with pytest.raises(NotFound):
        await store.revoke_token("t1", T0)


async def test_callers_sql_and_enqueue_commit_together(store):
    sql = CALLER_SQL[store.dialect]
    async with store.transaction() as tx:
        await tx.execute(sql["create"])
    async with store.transaction() as tx:
        await tx.execute(sql["insert"], (1, 100))
        assert (await tx.insert_intent(*new("order-1"))).created
    async with store.transaction() as tx:
        assert (await tx.execute(sql["count"]))[0][0] == 1
    assert (await store.get_intent("order-1")).status is Status.PENDING


async def test_callers_sql_and_enqueue_roll_back_together(store):
    sql = CALLER_SQL[store.dialect]
    async with store.transaction() as tx:
        await tx.execute(sql["create"])
    with pytest.raises(RuntimeError, match="payment failed"):
        async with store.transaction() as tx:
            await tx.execute(sql["insert"], (1, 100))
            await tx.insert_intent(*new("order-1"))
            raise RuntimeError("payment failed")
    assert await store.get_intent("order-1") is None
    async with store.transaction() as tx:
        assert (await tx.execute(sql["count"]))[0][0] == 0


async def test_a_conflicting_enqueue_inside_a_transaction_rolls_back_the_callers_row(store):
    sql = CALLER_SQL[store.dialect]
    await store.insert_intent(*new("order-1"))
    async with store.transaction() as tx:
        await tx.execute(sql["create"])
    with pytest.raises(IntentConflict):
        async with store.transaction() as tx:
            await tx.execute(sql["insert"], (1, 100))
            await tx.insert_intent(*new("order-1", digest="sha256:changed"))
    async with store.transaction() as tx:
        assert (await tx.execute(sql["count"]))[0][0] == 0


async def test_history_of_an_unknown_intent_is_empty(store):
    history = await store.history("ghost")
    assert history.attempts == [] and history.events == []
