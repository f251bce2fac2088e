"""The store conformance suite: every backend must pass exactly these tests, and they prove it.

The suite runs once per factory in ``backends.STORE_FACTORIES`` (SQLite and PostgreSQL); a new
dialect joins there, with its caller SQL in ``backends.CALLER_SQL``, and needs no tests of its
own for what the protocol promises. Another project can run the suite against its store by importing
the tests of ``test_moves.py`` (every move of the lifecycle by name) and then this module's tests
and fixtures (``from tests.conformance.test_store import *``) into a test module that defines its
own ``store_factory`` fixture. The tests hold no backend-specific branches; the last one fails if
some method of the store protocol was never called.
"""

from __future__ import annotations

import asyncio
import base64
import importlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

import pytest

from outbox import (
    Attempt,
    DestinationInUse,
    Enqueued,
    Event,
    IllegalTransition,
    Intent,
    IntentConflict,
    IntentQuery,
    LastAdmin,
    NotFound,
    OnUnknown,
    OutboxError,
    Outcome,
    Role,
    SecretsKeyError,
    StaleWrite,
    Status,
    StoreUnavailable,
    Submission,
    UnknownDestination,
)
from outbox.destinations import Destination
from outbox.grants import GrantSpec
from outbox.keyring import generate_key, key_id
from outbox.model import Approve, Cancel, Change, NewIntent, OnDead, Ordering, Release, Replay, Resolve, Settle, Start
from outbox.portal import PortalLink, PortalSession
from outbox.store import Store
from outbox.store.protocol import Claim
from outbox.store.records import FIRST, LAST
from outbox.tokens import ConsoleSession, TokenInfo

from .backends import CALLER_SQL, STORE_FACTORIES, StoreFactory
from .recording import REQUIRED, RecordingStore

T0 = datetime(2030, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)

#: By backend: the protocol methods the suite called, and the tests that ran (the last test's
#: evidence).
EXERCISED: dict[str, set[str]] = {}
RAN: dict[str, set[str]] = {}
#: The suite's other modules (run before this one), whose tests count towards its coverage.
SUITE = ("test_events", "test_flow", "test_moves")


@pytest.fixture(params=STORE_FACTORIES, ids=lambda factory: factory.__name__)
def store_factory(request: pytest.FixtureRequest) -> StoreFactory:
    """The backend under test."""
    return request.param


@pytest.fixture
async def open_store(
    store_factory: StoreFactory, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Callable[[], Awaitable[Store]]]:
    """Opens a fresh, unmigrated store of the backend under test, its calls recorded; every store
    it opened is closed after the test."""
    backend = store_factory.__name__
    RAN.setdefault(backend, set()).add(request.node.originalname)
    calls = EXERCISED.setdefault(backend, set())
    opened: list[Store] = []

    async def open_one() -> Store:
        directory = tmp_path / f"store-{len(opened)}"
        directory.mkdir()
        fresh = cast(Store, RecordingStore(await store_factory(directory), calls))
        await fresh.open()
        opened.append(fresh)
        return fresh

    try:
        yield open_one
    finally:
        for s in reversed(opened):
            await s.close()


@pytest.fixture
async def store(open_store: Callable[[], Awaitable[Store]]) -> Store:
    """An opened, migrated store with two destinations: ``billing``, and ``approvals`` (which
    requires approval)."""
    s = await open_store()
    await s.migrate()
    await s.put_destination(destination("billing"))
    await s.put_destination(destination("approvals", requires_approval=True))
    return s


async def made(store: Store, change: Change) -> Intent | None:
    """Apply one change alone: its answer, or its refusal raised."""
    [answer] = (await store.apply([change])).results
    if isinstance(answer, Exception):
        raise answer
    return answer


def destination(id: str, **changes) -> Destination:
    base = Destination(
        id=id, channel="webhook", settings={"url": f"https://{id}.example/hook"}, secrets=("whsec_x",),
        idempotent=True, retention_seconds=3600, on_unknown=OnUnknown.DECLARED,
        timeout_seconds=5.0, requires_approval=False, allow_private_network=False,
        disabled=False, created_at=T0, updated_at=T0,
    )
    return replace(base, **changes)


def new(action_id: str, *, scope: str = "acme", dest: str = "billing", digest: str = "sha256:aa",
        at: datetime = T0, key: str | None = None) -> tuple[NewIntent, Event]:
    return (
        NewIntent(action_id=action_id, scope=scope, destination=dest, payload_json='{"n":1}',
                  payload_digest=digest, max_attempts=5, next_attempt_at=at, not_before=None,
                  expires_at=None, created_at=at, ordering_key=key),
        Event(kind="enqueued", at=at, actor="test"),
    )


async def test_migrate_is_versioned_and_idempotent(store):
    assert await store.migrate() == []
    await store.ping()


async def test_a_new_database_is_ready_only_once_migrated(open_store):
    fresh = await open_store()
    with pytest.raises(StoreUnavailable):
        await fresh.ping()
    applied = await fresh.migrate()
    assert applied and applied == sorted(applied) and len(set(applied)) == len(applied)
    await fresh.ping()
    assert await fresh.migrate() == []
    assert await fresh.list_destinations() == [] and await fresh.count_by_status() == []


async def test_insert_creates_a_pending_intent_with_its_first_event(store):
    result = await store.insert_intent(*new("a1"))
    assert result.created
    intent = result.intent
    assert (intent.status, intent.fence, intent.attempts, intent.payload) == (Status.PENDING, 0, 0, {"n": 1})
    assert intent.created_at == T0 and intent.next_attempt_at == T0  # microseconds survive
    assert await store.get_intent("acme/a1") == intent
    history = await store.history("acme/a1")
    assert [(e.kind, e.actor) for e in history.events] == [("enqueued", "test")]
    assert history.attempts == []


async def test_an_intents_trace_context_is_kept_whichever_way_it_was_enqueued_and_claimed(store):
    """The create span's W3C context (``outbox.tracing``) goes in with the intent, alone or in a
    batch, and comes back on every read, a claim's included; none stays none."""
    kept = '{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","tracestate":"k=v"}'

    def traced(action_id: str, context: str | None = kept) -> tuple[NewIntent, Event]:
        intent, event = new(action_id)
        return replace(intent, trace_context=context), event

    assert (await store.insert_intent(*traced("t1"))).intent.trace_context == kept
    batch = await store.insert_intents([traced("t2"), traced("t3", None)])
    each = await store.insert_each([traced("t4")])
    assert [r.intent.trace_context for r in [*batch, *each] if isinstance(r, Enqueued)] == [kept, None, kept]
    assert [(await store.get_intent(f"acme/t{n}")).trace_context for n in (1, 2, 3, 4)] == [kept, kept, None, kept]
    claimed = (await store.apply([], claim=Claim("w", T0, T0 + timedelta(seconds=30), 10))).claimed  # a worker's
    assert {i.action_id: i.trace_context for i in claimed} == {"t1": kept, "t2": kept, "t3": None, "t4": kept}


async def test_the_same_operation_again_returns_the_existing_intent(store):
    first = await store.insert_intent(*new("a1"))
    again = await store.insert_intent(*new("a1", at=T0 + timedelta(seconds=5)))
    assert not again.created
    assert again.intent == first.intent
    assert len((await store.history("acme/a1")).events) == 1


@pytest.mark.parametrize(
    "changes,named",
    [({"digest": "sha256:bb"}, "payload_digest"), ({"dest": "approvals"}, "destination"),
     ({"key": "k1"}, "ordering_key")],
)
async def test_another_operation_under_the_same_action_id_is_a_conflict(store, changes, named):
    await store.insert_intent(*new("a1"))
    with pytest.raises(IntentConflict, match=named):
        await store.insert_intent(*new("a1", **changes))
    assert (await store.get_intent("acme/a1")).payload_digest == "sha256:aa"
    assert len((await store.history("acme/a1")).events) == 1


async def test_action_ids_are_unique_per_scope_not_across_scopes(store):
    ours = await store.insert_intent(*new("a1"))
    theirs = await store.insert_intent(*new("a1", scope="globex", digest="sha256:bb"))
    assert theirs.created and theirs.intent.seq != ours.intent.seq
    assert (await store.get_intent("globex/a1")).payload_digest == "sha256:bb"
    assert (await store.get_intent("acme/a1")).payload_digest == "sha256:aa"
    assert [i.scope for i in await store.intents_named("a1")] == ["acme", "globex"]
    assert await store.intents_named("nobody") == []


async def test_unknown_destination_is_refused_and_nothing_is_written(store):
    with pytest.raises(UnknownDestination, match="'nowhere' is not registered"):
        await store.insert_intent(*new("a1", dest="nowhere"))
    assert await store.get_intent("acme/a1") is None


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
    assert await store.get_intent("acme/b1") is None
    results = await store.insert_intents([new("b1"), new("b2")])
    assert [r.created for r in results] == [True, True]


async def test_a_batch_of_each_answers_every_intent_and_commits_the_rest(store):
    await store.insert_intent(*new("taken"))
    results = await store.insert_each([new("e1"), new("taken", digest="sha256:zz"), new("lost", dest="nowhere"),
                                       new("taken"), new("e2", key="k1"), new("e1", digest="sha256:zz")])
    assert [type(r).__name__ for r in results] == ["Enqueued", "IntentConflict", "UnknownDestination", "Enqueued",
                                                   "Enqueued", "IntentConflict"]
    assert [r.created for r in results if isinstance(r, Enqueued)] == [True, False, True]
    assert results[4].intent.ordering_key == "k1" and results[4].intent.status is Status.PENDING
    for key in ("acme/e1", "acme/e2"):  # each with its first event, as a single insert makes it
        history = await store.history(key)
        assert [(e.kind, e.actor, dict(e.data)) for e in history.events] == [("enqueued", "test", {})]
    assert await store.get_intent("acme/lost") is None
    assert (await store.get_intent("acme/taken")).payload_digest == "sha256:aa"


async def test_a_batch_is_stored_in_its_order_with_each_event_and_a_repeated_key_found(store):
    first, _ = new("o1", at=T0 + timedelta(seconds=1))
    noted = Event(kind="enqueued", at=T0, actor="batch", reason="why", data={"source": "import", "n": 2})
    results = await store.insert_intents([(first, noted), new("o2"), new("o1"), new("o3", scope="shop")])
    assert [(r.created, r.intent.key) for r in results] == [
        (True, "acme/o1"), (True, "acme/o2"), (False, "acme/o1"), (True, "shop/o3")]
    assert results[0].intent.seq < results[1].intent.seq < results[3].intent.seq  # the batch's order
    assert results[2].intent.seq == results[0].intent.seq
    assert results[2].intent.next_attempt_at == T0 + timedelta(seconds=1)  # the stored one, not the repeat's
    assert [(e.actor, e.reason, dict(e.data)) for e in (await store.history("acme/o1")).events] == [
        ("batch", "why", {"source": "import", "n": 2})]


async def test_an_illegal_move_raises_and_writes_nothing(store):
    before = (await store.insert_intent(*new("a1"))).intent
    with pytest.raises(IllegalTransition, match="'delivered' to 'cancelled'"):
        await store.apply([Cancel("acme/a1", Status.DELIVERED, (Event(kind="cancelled", at=T0, actor="op"),))])
    with pytest.raises(IllegalTransition, match="move 'resolve' cannot end in 'cancelled'"):
        await store.apply([Resolve("acme/a1", Status.CANCELLED, (Event(kind="resolved", at=T0, actor="op"),))])
    assert await store.get_intent("acme/a1") == before
    assert len((await store.history("acme/a1")).events) == 1


async def test_a_write_from_a_stale_status_or_fence_is_rejected(store):
    await store.insert_intent(*new("a1"))
    await store.claim("w", now=T0, lease_until=T0 + timedelta(seconds=30), limit=1)
    ev = (Event(kind="cancelled", at=T0, actor="w"),)
    with pytest.raises(StaleWrite, match="leased at fence 1, not pending;"):
        await made(store, Cancel("acme/a1", Status.PENDING, ev))
    with pytest.raises(StaleWrite, match="not leased at fence 7"):
        await made(store, Settle("acme/a1", 7, Status.DELIVERED, ev))
    assert (await store.get_intent("acme/a1")).status is Status.LEASED
    assert await made(store, Settle("acme/a1", 1, Status.DELIVERED, ev)) is None
    assert (await store.get_intent("acme/a1")).status is Status.DELIVERED
    with pytest.raises(NotFound):
        await made(store, Cancel("acme/ghost", Status.PENDING, ev))


async def test_applies_committed_together_are_each_conditional(store):
    """Concurrent applies share a transaction (SQLite) or wait on each other's row locks
    (PostgreSQL); each change is still checked against the intent as the changes before it
    left it, and a refused one writes nothing."""
    await store.insert_intents([new("c0"), new("c1", at=T0 + timedelta(hours=1)), new("c2"), new("c3")])
    await store.claim("w", now=T0, lease_until=T0 + timedelta(seconds=30), limit=10)  # c0, c2, c3: c1 is not due

    async def release(action_id: str, fence: int = 1) -> Intent | OutboxError | None:
        [answer] = (await store.apply([Release(f"acme/{action_id}", fence, T0, (Event(kind="released", at=T0,
                                                                                      actor="w"),))])).results
        return answer

    async def cancel(action_id: str) -> Intent | OutboxError | None:
        [answer] = (await store.apply([Cancel(f"acme/{action_id}", Status.PENDING,
                                              (Event(kind="cancelled", at=T0, actor="op"),))])).results
        return answer

    # the same intent twice at once: exactly one wins
    results = await asyncio.gather(release("c0"), release("c0"))
    assert sorted(type(r).__name__ for r in results) == ["NoneType", "StaleWrite"]
    # applies mixing good, stale (wrong fence) and missing intents
    results = await asyncio.gather(cancel("c1"), release("c2", fence=9), release("ghost"), release("c3"))
    assert [type(r).__name__ for r in results] == ["Intent", "StaleWrite", "NotFound", "NoneType"]
    assert isinstance(results[0], Intent) and results[0].status is Status.CANCELLED
    statuses = {i: (await store.get_intent(f"acme/c{i}")).status for i in range(4)}
    assert statuses == {0: Status.PENDING, 1: Status.CANCELLED, 2: Status.LEASED, 3: Status.PENDING}
    assert [e.kind for e in (await store.history("acme/c0")).events] == ["enqueued", "leased", "released"]
    assert [e.kind for e in (await store.history("acme/c2")).events] == ["enqueued", "leased"]


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
    await store.claim("w1", now=T0 + timedelta(minutes=1, seconds=30), lease_until=T0 + timedelta(hours=1), limit=5)
    assert await ids(statuses=[Status.LEASED]) == ["i1", "i0"]  # (the due ones: on PostgreSQL stored pending)
    assert await ids(statuses=[Status.PENDING]) == ["i6", "i5", "i4", "i3", "i2"]
    assert await ids(statuses=[Status.LEASED, Status.HELD]) == ["held", "i1", "i0"]
    assert await ids(scopes=["acme"], destination="billing") == ["i5", "i3", "i1"]
    assert await ids(scopes=[]) == []
    assert await ids(channel="webhook", limit=2) == ["held", "i6"]
    assert await ids(created_after=T0 + timedelta(minutes=2), created_before=T0 + timedelta(minutes=4)) == ["i3", "i2"]


async def test_destinations_are_registered_replaced_and_listed(store):
    assert await store.put_destination(destination("crm")) is True
    settings = {"url": "https://crm.example/v2", "nested": {"ports": [25, 587], "tls": True, "none": None}}
    assert await store.put_destination(destination("crm", settings=settings)) is False
    found = await store.get_destination("crm")
    assert found.settings == settings and found.secrets == ("whsec_x",)
    assert [d.id for d in await store.list_destinations()] == ["approvals", "billing", "crm"]
    assert await store.get_destination("nope") is None


async def test_a_destinations_retry_schedule_and_max_age_are_kept_and_cleared(store):
    await store.put_destination(destination("crm", retry_schedule=(5, 0.5, 3600), max_age_seconds=86_400))
    found = await store.get_destination("crm")
    assert (found.retry_schedule, found.max_age_seconds) == ((5, 0.5, 3600), 86_400)
    assert [d.retry_schedule for d in await store.list_destinations()] == [None, None, (5, 0.5, 3600)]
    await store.put_destination(destination("crm"))
    found = await store.get_destination("crm")
    assert (found.retry_schedule, found.max_age_seconds) == (None, None)


async def test_a_replay_or_a_resolve_to_retry_keeps_the_attempts_made_before_it(store):
    """What a destination's retry schedule counts from: it starts over after a replay."""
    ev = (Event(kind="attempt_finished", at=T0, actor="w1"),)
    await store.insert_intents([new("d1"), new("u1"), new("u2")])
    await claim_ids(store)
    for action_id, status in (("d1", Status.DEAD), ("u1", Status.UNKNOWN), ("u2", Status.UNKNOWN)):
        intent = await store.get_intent(f"acme/{action_id}")
        await made(store, Settle(intent.key, intent.fence, status, ev, attempts=3))
    assert (await store.get_intent("acme/d1")).replayed_after == 0
    await made(store, Replay("acme/d1", Status.DEAD, T0, 8, ev))
    await made(store, Resolve("acme/u1", Status.PENDING, ev, next_attempt_at=T0, max_attempts=8))
    await made(store, Resolve("acme/u2", Status.DELIVERED, ev))
    assert [(await store.get_intent(f"acme/{a}")).replayed_after for a in ("d1", "u1", "u2")] == [3, 3, 0]


async def stored_secrets(store: Store) -> dict[str, dict]:
    """Each destination's secrets as the database holds them, read with the caller's own SQL."""
    async with store.transaction() as tx:
        return {id: json.loads(text) for id, text in await tx.execute("SELECT id, secrets FROM destinations")}


async def test_secrets_are_stored_sealed_under_the_key_the_database_names(store):
    await store.put_destination(destination("crm", secrets=("whsec_new", "whsec_old")))
    key = await store.sealing_key()
    assert key == store.keyring.primary  # named by the first write of a secret
    stored = await stored_secrets(store)
    assert {value["key"] for value in stored.values()} == {key}
    assert "whsec_" not in json.dumps(stored)
    assert (await store.get_destination("crm")).secrets == ("whsec_new", "whsec_old")
    assert [d.secrets for d in await store.list_destinations()] == [("whsec_x",), ("whsec_x",),
                                                                    ("whsec_new", "whsec_old")]


async def test_a_write_under_a_key_the_keyring_lacks_is_refused_and_writes_nothing(store):
    async with store.transaction() as tx:
        await tx.execute("UPDATE secrets_key SET key_id = '0123456789abcdef'")
    with pytest.raises(SecretsKeyError, match="0123456789abcdef"):
        await store.put_destination(destination("crm"))
    assert await store.get_destination("crm") is None


def add_key(store: Store) -> str:
    """A new key put first in the store's key file (its keyring reads it when asked for it); its id."""
    new, path = generate_key(), store.keyring.path
    path.write_text(new + "\n" + path.read_text())
    return key_id(base64.b64decode(new))


async def test_resealing_moves_every_secret_to_a_new_key_in_one_go(store):
    key = add_key(store)
    async with store.transaction() as tx:  # one destination still as an older release stored it
        await tx.execute("""UPDATE destinations SET secrets = '["whsec_plain"]' WHERE id = 'approvals'""")
    assert await store.reseal_secrets(key) == 2
    assert await store.sealing_key() == key
    assert {value["key"] for value in (await stored_secrets(store)).values()} == {key}
    assert (await store.get_destination("approvals")).secrets == ("whsec_plain",)
    assert await store.reseal_secrets(key) == 0  # nothing left to seal


async def test_sealing_plain_secrets_leaves_sealed_ones_alone(store):
    key = await store.sealing_key()
    sealed = await stored_secrets(store)
    async with store.transaction() as tx:
        await tx.execute("""UPDATE destinations SET secrets = '["whsec_plain"]' WHERE id = 'approvals'""")
    assert await store.reseal_secrets(key, plain_only=True) == 1
    after = await stored_secrets(store)
    assert after["billing"] == sealed["billing"] and after["approvals"]["key"] == key
    assert (await store.get_destination("approvals")).secrets == ("whsec_plain",)


async def test_a_reseal_that_cannot_open_one_destination_changes_nothing(store):
    before = await stored_secrets(store)
    altered = {**before["billing"], "sealed": before["approvals"]["sealed"]}  # another row's value
    async with store.transaction() as tx:
        await tx.execute(f"UPDATE destinations SET secrets = '{json.dumps(altered)}' WHERE id = 'billing'")
    with pytest.raises(SecretsKeyError, match="'billing'"):
        await store.get_destination("billing")
    with pytest.raises(SecretsKeyError, match="'billing'"):
        await store.reseal_secrets(add_key(store))
    assert await stored_secrets(store) == {**before, "billing": altered}
    assert await store.sealing_key() == before["approvals"]["key"]


async def test_a_destination_is_deleted_only_when_nothing_refers_to_it(store):
    await store.insert_intent(*new("a1"))
    with pytest.raises(DestinationInUse, match="1 intent"):
        await store.delete_destination("billing")
    await made(store, Cancel("acme/a1", Status.PENDING, (Event(kind="cancelled", at=T0, actor="op"),)))
    with pytest.raises(DestinationInUse, match="disable it instead"):
        await store.delete_destination("billing")
    with pytest.raises(NotFound):
        await store.delete_destination("nope")
    await store.put_grant("g1", GrantSpec(scope="acme", destination="approvals"), T0)
    with pytest.raises(DestinationInUse, match="grants 'g1'"):
        await store.delete_destination("approvals")
    await store.delete_grant("g1")
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
    operator = TokenInfo("t2", Role.OPERATOR, (), None, T0, None)
    await store.insert_token(operator, "hash-2")
    assert (await store.count_active_tokens("operator"), await store.count_active_tokens("producer")) == (1, 0)
    assert await store.token_by_hash("hash-2") == operator
    assert {t.id: t.revoked_at for t in await store.list_tokens()} == {"t1": T0 + timedelta(seconds=1), "t2": None}


async def test_the_last_active_admin_token_is_kept_unless_asked_not_to(store):
    for n in (1, 2):
        await store.insert_token(TokenInfo(f"a{n}", Role.ADMIN, (), None, T0, None), f"admin-{n}")
    await store.insert_token(TokenInfo("p1", Role.PRODUCER, ("acme",), None, T0, None), "producer-1")
    assert (await store.revoke_token("a1", T0)).revoked_at == T0
    with pytest.raises(LastAdmin, match="'a2' is the last active admin token"):
        await store.revoke_token("a2", T0)
    assert await store.token_by_hash("admin-2") is not None  # refused: still active
    with pytest.raises(NotFound):  # already revoked, not "last admin"
        await store.revoke_token("a1", T0)
    assert (await store.revoke_token("p1", T0)).revoked_at == T0  # other roles are never kept
    assert (await store.revoke_token("a2", T0, keep_an_admin=False)).revoked_at == T0
    assert await store.count_active_tokens("admin") == 0


async def test_two_revocations_at_once_never_leave_no_admin(store):
    """Each of the last two admin tokens revoked at the same moment: one is, one is refused."""
    for n in (1, 2):
        await store.insert_token(TokenInfo(f"a{n}", Role.ADMIN, (), None, T0, None), f"admin-{n}")
    results = await asyncio.gather(store.revoke_token("a1", T0), store.revoke_token("a2", T0),
                                   return_exceptions=True)
    assert sorted(type(r).__name__ for r in results) == ["LastAdmin", "TokenInfo"], results
    assert await store.count_active_tokens("admin") == 1


async def test_a_console_session_names_its_token_until_it_expires_is_closed_or_its_token_is_revoked(store):
    operator = TokenInfo("o1", Role.OPERATOR, (), "on call", T0, None)
    await store.insert_token(operator, "token-hash")
    hour = timedelta(hours=1)
    await store.open_console_session(ConsoleSession("s1", "o1", T0, T0 + hour), keep=5)
    await store.open_console_session(ConsoleSession("s2", "o1", T0, T0 + hour), keep=5)
    assert await store.console_session("s1", T0) == operator
    assert await store.console_session("s1", T0 + hour - timedelta(microseconds=1)) == operator
    assert await store.console_session("s1", T0 + hour) is None  # expired at its expires_at
    assert await store.console_session("token-hash", T0) is None  # the token's hash is no session
    assert await store.console_session("nothing", T0) is None
    await store.close_console_session("s1")
    await store.close_console_session("s1")  # closing again changes nothing
    assert await store.console_session("s1", T0) is None
    assert await store.console_session("s2", T0) == operator
    await store.revoke_token("o1", T0)
    assert await store.console_session("s2", T0) is None  # judged against the token's record


async def test_opening_a_console_session_drops_expired_ones_and_keeps_a_tokens_newest(store):
    for token_id in ("o1", "o2", "gone"):
        await store.insert_token(TokenInfo(token_id, Role.OPERATOR, (), None, T0, None), f"hash-{token_id}")
    await store.open_console_session(ConsoleSession("old", "o2", T0, T0 + timedelta(seconds=10)), keep=3)
    await store.open_console_session(ConsoleSession("revoked", "gone", T0, T0 + timedelta(days=1)), keep=3)
    await store.revoke_token("gone", T0)
    for n in range(5):
        at = T0 + timedelta(seconds=20 + n)
        await store.open_console_session(ConsoleSession(f"o1-{n}", "o1", at, at + timedelta(hours=1)), keep=3)
    async with store.transaction() as tx:
        left = [row[0] for row in await tx.execute("SELECT id_hash FROM console_sessions ORDER BY id_hash")]
    assert left == ["o1-2", "o1-3", "o1-4"]  # o2's expired, gone's revoked, o1's two oldest beyond 3
    assert await store.console_session("o1-4", T0 + timedelta(seconds=30)) is not None


async def test_a_portal_link_opens_once_before_it_expires_for_a_session_of_its_length(store):
    await store.insert_token(TokenInfo("p1", Role.PRODUCER, ("acme",), None, T0, None), "hash-p1")
    minute = timedelta(minutes=1)
    await store.insert_portal_link(PortalLink("l1", "p1", "acme", False, 3600, T0, T0 + 10 * minute))
    await store.insert_portal_link(PortalLink("l2", "p1", "acme", True, 60, T0, T0 + 10 * minute))
    await store.insert_portal_link(PortalLink("late", "p1", "acme", False, 60, T0, T0 + 10 * minute))
    assert await store.open_portal_link("late", "s-late", T0 + 10 * minute) is None  # expired at its expires_at
    opened = await store.open_portal_link("l1", "s1", T0 + minute)
    assert opened == PortalSession("acme", False, T0 + minute + timedelta(hours=1))
    assert await store.open_portal_link("l1", "s1-again", T0 + minute) is None  # once only
    assert await store.portal_session("s1-again", T0 + minute) is None
    assert await store.portal_session("s1", T0 + minute) == opened
    assert await store.portal_session("s1", T0 + minute + timedelta(hours=1)) is None  # ended at its end
    assert await store.portal_session("l1", T0 + minute) is None  # the link's hash is no session
    assert await store.open_portal_link("nothing", "s0", T0) is None
    assert await store.open_portal_link("l2", "s2", T0) == PortalSession("acme", True, T0 + minute)
    await store.close_portal_session("s1")  # signed out: the session and its link are gone
    await store.close_portal_session("s1")  # closing again changes nothing
    assert await store.portal_session("s1", T0 + minute) is None
    assert await store.open_portal_link("l1", "s1-reopened", T0 + minute) is None
    assert await store.portal_session("s2", T0) is not None  # another session stays open
    await store.revoke_token("p1", T0)
    assert await store.portal_session("s2", T0) is None  # judged against the minting token's record


async def test_of_concurrent_openings_of_a_portal_link_one_starts_a_session(store):
    await store.insert_token(TokenInfo("p1", Role.PRODUCER, ("acme",), None, T0, None), "hash-p1")
    await store.insert_portal_link(PortalLink("l1", "p1", "acme", False, 600, T0, T0 + timedelta(minutes=10)))
    opened = await asyncio.gather(*(store.open_portal_link("l1", f"s{n}", T0) for n in range(8)))
    assert sum(session is not None for session in opened) == 1
    assert [await store.portal_session(f"s{n}", T0) is not None for n in range(8)] == [s is not None for s in opened]


async def test_minting_a_portal_link_drops_expired_links_and_ended_sessions(store):
    for token_id in ("p1", "gone"):
        await store.insert_token(TokenInfo(token_id, Role.PRODUCER, ("*",), None, T0, None), f"hash-{token_id}")
    ten = timedelta(seconds=10)
    await store.insert_portal_link(PortalLink("unopened", "p1", "acme", False, 60, T0, T0 + ten))
    await store.insert_portal_link(PortalLink("ended", "p1", "acme", False, 60, T0, T0 + ten))
    await store.insert_portal_link(PortalLink("open", "p1", "acme", False, 3600, T0, T0 + ten))
    await store.insert_portal_link(PortalLink("revoked", "gone", "acme", False, 3600, T0, T0 + timedelta(hours=1)))
    await store.open_portal_link("ended", "s-ended", T0)
    await store.open_portal_link("open", "s-open", T0)
    await store.revoke_token("gone", T0)
    await store.insert_portal_link(PortalLink("new", "p1", "acme", False, 60, T0 + 2 * timedelta(minutes=1),
                                              T0 + timedelta(minutes=5)))
    async with store.transaction() as tx:
        left = [row[0] for row in await tx.execute("SELECT link_hash FROM portal_links ORDER BY link_hash")]
    assert left == ["new", "open"]  # unopened past its expiry, its session ended, its token revoked: gone


async def test_callers_sql_and_enqueue_commit_together(store):
    sql = CALLER_SQL[store.dialect]
    async with store.transaction() as tx:
        await tx.execute(sql.create)
    async with store.transaction() as tx:
        await tx.execute(sql.insert, (1, 100))
        assert (await tx.insert_intent(*new("order-1"))).created
    async with store.transaction() as tx:
        assert (await tx.execute(sql.count))[0][0] == 1
    assert (await store.get_intent("acme/order-1")).status is Status.PENDING


async def test_callers_sql_and_enqueue_roll_back_together(store):
    sql = CALLER_SQL[store.dialect]
    async with store.transaction() as tx:
        await tx.execute(sql.create)
    with pytest.raises(RuntimeError, match="payment failed"):
        async with store.transaction() as tx:
            await tx.execute(sql.insert, (1, 100))
            await tx.insert_intent(*new("order-1"))
            raise RuntimeError("payment failed")
    assert await store.get_intent("acme/order-1") is None
    async with store.transaction() as tx:
        assert (await tx.execute(sql.count))[0][0] == 0


async def test_a_conflicting_enqueue_inside_a_transaction_rolls_back_the_callers_row(store):
    sql = CALLER_SQL[store.dialect]
    await store.insert_intent(*new("order-1"))
    async with store.transaction() as tx:
        await tx.execute(sql.create)
    with pytest.raises(IntentConflict):
        async with store.transaction() as tx:
            await tx.execute(sql.insert, (1, 100))
            await tx.insert_intent(*new("order-1", digest="sha256:changed"))
    async with store.transaction() as tx:
        assert (await tx.execute(sql.count))[0][0] == 0


async def test_history_of_an_unknown_intent_is_empty(store):
    history = await store.history("acme/ghost")
    assert history.attempts == [] and history.events == [] and history.intent is None


async def test_history_is_one_snapshot_of_the_intent_and_its_events(store):
    """Read while a writer moves the intent back and forth: each history's intent is the one its
    last event left (an update stamps the intent with its event's time), never older or newer."""
    await store.insert_intent(*new("snap"))
    moves = 150

    async def writer() -> None:
        for n in range(1, moves + 1):
            at = T0 + timedelta(milliseconds=n)
            if n % 2:
                [leased] = await store.claim("w", now=at, lease_until=at + timedelta(seconds=30), limit=1)
            else:
                await made(store, Release("acme/snap", leased.fence, at, (Event(kind="released", at=at, actor="w"),)))

    async def reader() -> int:
        seen = 0
        while not done.is_set() or not seen:
            history = await store.history("acme/snap")
            last = history.events[-1]
            assert history.intent is not None
            assert (history.intent.updated_at, history.intent.status) == (
                last.at, Status.LEASED if last.kind == "leased" else Status.PENDING), last
            seen += 1
        return seen

    done = asyncio.Event()
    task = asyncio.create_task(writer())
    task.add_done_callback(lambda _: done.set())
    try:
        reads = await asyncio.gather(reader(), reader())
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert min(reads) > 1


# -- the sender's operations ---------------------------------------------------------------



def attempt(number: int, fence: int, *, at: datetime = T0, **done) -> Attempt:
    return Attempt(attempt_id=f"att-{number}-{fence}", number=number, fence=fence, worker="w1",
                   started_at=at, finished_at=done.get("finished_at"), submission=done.get("submission"),
                   outcome=done.get("outcome"), status_code=done.get("status_code"), reply=None,
                   external_id=done.get("external_id"), error=done.get("error"), duration_ms=None)


async def test_claim_leases_due_intents_oldest_first_and_bumps_their_fence(store):
    for i, minutes in enumerate((3, 1, 2, 60)):
        await store.insert_intent(*new(f"c{i}", at=T0 + timedelta(minutes=minutes)))
    now = T0 + timedelta(minutes=5)
    claimed = await store.claim("w1", now=now, lease_until=now + timedelta(seconds=30), limit=10)
    assert [i.action_id for i in claimed] == ["c1", "c2", "c0"]  # c3 is not due yet
    assert all(i.status is Status.LEASED and i.fence == 1 and i.lease_owner == "w1" for i in claimed)
    assert claimed[0].lease_expires_at == now + timedelta(seconds=30)
    assert [e.kind for e in (await store.history("acme/c1")).events] == ["enqueued", "leased"]
    assert await store.claim("w2", now=now, lease_until=now, limit=10) == []
    assert await store.next_due_at() == T0 + timedelta(minutes=60)


async def test_concurrent_claimers_never_get_the_same_intent(store):
    await store.insert_intents([new(f"c{i}") for i in range(50)])
    batches = await asyncio.gather(*(store.claim(f"w{n}", now=T0, lease_until=T0, limit=7) for n in range(10)))
    ids = [i.action_id for batch in batches for i in batch]
    assert len(ids) == len(set(ids)) == 50


async def test_attempts_are_recorded_fenced_and_finished(store):
    await store.insert_intent(*new("a1"))
    [intent] = await store.claim("w1", now=T0, lease_until=T0 + timedelta(seconds=30), limit=1)
    started = attempt(1, intent.fence)
    await made(store, Start("acme/a1", intent.fence, started, Event(kind="attempt_started", at=T0, actor="w1")))
    assert (await store.history("acme/a1")).attempts == [started]
    assert await store.first_submission_at("acme/a1") == T0
    done = replace(started, finished_at=T0 + timedelta(seconds=1), submission=Submission.SUBMITTED,
                   outcome=Outcome.DELIVERED, status_code=200, external_id="ext-9")
    ev = (Event(kind="delivered", at=T0 + timedelta(seconds=1), actor="w1"),)
    with pytest.raises(StaleWrite):
        await made(store, Settle("acme/a1", intent.fence + 1, Status.DELIVERED, ev, attempts=1, attempt=done))
    assert (await store.history("acme/a1")).attempts == [started]
    await made(store, Settle("acme/a1", intent.fence, Status.DELIVERED, ev, attempts=1, attempt=done))
    final = await store.get_intent("acme/a1")
    assert final.status is Status.DELIVERED and final.attempts == 1
    assert (await store.history("acme/a1")).attempts == [done]


async def test_activity_counts_attempts_by_minute_the_latest_failures_and_the_backlog(store):
    hour = T0.replace(second=0, microsecond=0)  # 12:00, the window's start
    await store.insert_intents([new("old", at=hour - timedelta(hours=2)), new("a1"), new("a2")])
    await store.insert_intent(*new("h1", dest="approvals", at=hour + timedelta(seconds=90)))
    await store.claim("w1", now=T0, lease_until=T0 + timedelta(hours=9), limit=3)

    async def finish(action_id: str, number: int, at: datetime, status: Status, outcome: Outcome, fence: int = 1,
                     **facts) -> None:
        done = replace(attempt(number, fence, at=at), attempt_id=f"{action_id}-{number}", finished_at=at,
                       outcome=outcome, duration_ms=100.0, **facts)
        finished = (Event(kind="attempt_finished", at=at, actor="w1"),)
        await made(store, Settle(f"acme/{action_id}", fence, status, finished,
                                 next_attempt_at=at + timedelta(seconds=10), attempts=number, attempt=done))

    await finish("old", 1, hour - timedelta(hours=1), Status.DELIVERED, Outcome.DELIVERED)  # before the window
    await finish("a1", 1, T0 + timedelta(seconds=10), Status.DELIVERED, Outcome.DELIVERED)
    await finish("a2", 1, T0 + timedelta(seconds=20), Status.PENDING, Outcome.RETRYABLE, status_code=503,
                 error="older")
    again = T0 + timedelta(seconds=30)  # a2 due again
    assert [i.action_id for i in await store.claim("w1", now=again, lease_until=again + timedelta(hours=9),
                                                   limit=3)] == ["a2"]
    await finish("a2", 2, T0 + timedelta(seconds=70), Status.PENDING, Outcome.RETRYABLE, fence=2, status_code=503,
                 error="down")

    seen = await store.activity(hour, T0 + timedelta(seconds=120))
    assert sorted((m.destination, m.minute, m.outcome, m.count, m.duration_ms, m.last_at) for m in seen.minutes) == [
        ("billing", hour, "delivered", 1, 100.0, T0 + timedelta(seconds=10)),
        ("billing", hour, "retryable", 1, 100.0, T0 + timedelta(seconds=20)),
        ("billing", hour + timedelta(minutes=1), "retryable", 1, 100.0, T0 + timedelta(seconds=70))]
    assert [(f.destination, f.at, f.outcome, f.status_code, f.error) for f in seen.failures] == [
        ("billing", T0 + timedelta(seconds=70), "retryable", 503, "down")]
    assert sorted((w.destination, w.count, w.oldest_due_at) for w in seen.waiting) == [
        ("approvals", 1, None), ("billing", 1, T0 + timedelta(seconds=80))]
    assert sorted((s.since, s.until or hour + timedelta(days=1), s.count) for s in seen.backlog) == [
        (hour, hour, 1),  # a1: enqueued and delivered within 12:00
        (hour, hour + timedelta(days=1), 1),  # a2: still open
        (hour + timedelta(minutes=1), hour + timedelta(days=1), 1)]  # h1: held since 12:01
    later = await store.activity(hour + timedelta(hours=1), T0)  # a2 is not due yet at T0
    assert (later.minutes, later.failures) == ([], [])
    assert sorted((w.destination, w.count, w.oldest_due_at) for w in later.waiting) == [
        ("approvals", 1, None), ("billing", 1, None)]
    assert [(s.since, s.until, s.count) for s in later.backlog] == [(hour + timedelta(hours=1), None, 2)]


async def test_a_destinations_failed_attempts_and_counts_by_status(store):
    await store.insert_intents([new("f1"), new("f2"), new("ok"), new("gone", at=T0 - timedelta(hours=2))])
    await store.insert_intent(*new("other", dest="approvals"))
    for i in await store.claim("w1", now=T0, lease_until=T0 + timedelta(hours=9), limit=5):
        at = {"f1": T0 + timedelta(seconds=5), "f2": T0 + timedelta(seconds=9), "ok": T0 + timedelta(seconds=7),
              "gone": T0 - timedelta(hours=2), "other": T0 + timedelta(seconds=3)}[i.action_id]
        outcome = Outcome.DELIVERED if i.action_id == "ok" else Outcome.RETRYABLE
        done = replace(attempt(1, i.fence, at=at), attempt_id=f"{i.action_id}-1", finished_at=at,
                       submission=Submission.SUBMITTED, outcome=outcome, status_code=503, error=f"{i.action_id} down")
        status = Status.DELIVERED if outcome is Outcome.DELIVERED else Status.DEAD
        await made(store, Settle(i.key, i.fence, status, (Event(kind="attempt_finished", at=at, actor="w1"),),
                                 attempts=1, attempt=done))
    found = await store.failed_attempts("billing", T0 - timedelta(hours=1), 10)
    assert [(f.action_id, f.scope, f.number, f.at, f.submission, f.outcome, f.status_code, f.error)
            for f in found] == [
        ("f2", "acme", 1, T0 + timedelta(seconds=9), "submitted", "retryable", 503, "f2 down"),
        ("f1", "acme", 1, T0 + timedelta(seconds=5), "submitted", "retryable", 503, "f1 down")]
    assert [f.action_id for f in await store.failed_attempts("billing", T0 - timedelta(hours=1), 1)] == ["f2"]
    assert await store.failed_attempts("nowhere", T0 - timedelta(hours=1), 10) == []
    assert await store.destination_counts("billing") == {"dead": 3, "delivered": 1}
    assert await store.destination_counts("nowhere") == {}


async def test_leases_are_renewed_only_while_held_and_expired_ones_are_found(store):
    await store.insert_intents([new("l1"), new("l2")])
    claimed = await store.claim("w1", now=T0, lease_until=T0 + timedelta(seconds=10), limit=2)
    held = [(i.key, i.fence) for i in claimed]
    assert await store.renew_leases(held, T0 + timedelta(seconds=60)) == []
    assert await store.renew_leases([("acme/l1", 99)], T0 + timedelta(seconds=90)) == ["acme/l1"]
    await made(store, Start("acme/l2", 1, attempt(1, 1), Event(kind="attempt_started", at=T0, actor="w1")))
    assert await store.expired_leases(T0 + timedelta(seconds=59), 10) == []
    expired = await store.expired_leases(T0 + timedelta(seconds=61), 10)
    assert [(i.action_id, a.attempt_id if a else None) for i, a in expired] == [
        ("l1", None), ("l2", "att-1-1")]


async def test_first_submission_ignores_attempts_that_provably_never_left(store):
    await store.insert_intent(*new("a1"))
    await store.claim("w1", now=T0, lease_until=T0 + timedelta(seconds=30), limit=1)
    never = attempt(1, 1, finished_at=T0, submission=Submission.NOT_SUBMITTED, outcome=Outcome.RETRYABLE)
    await made(store, Settle("acme/a1", 1, Status.PENDING, (Event(kind="attempt_finished", at=T0, actor="w1"),),
                             next_attempt_at=T0, attempts=1, attempt=never))
    assert await store.first_submission_at("acme/a1") is None
    await store.claim("w1", now=T0, lease_until=T0 + timedelta(seconds=30), limit=1)
    later = attempt(2, 2, at=T0 + timedelta(seconds=5))
    await made(store, Start("acme/a1", 2, later, Event(kind="attempt_started", at=later.started_at, actor="w1")))
    assert await store.first_submission_at("acme/a1") == T0 + timedelta(seconds=5)


async def test_a_destination_can_be_disabled(store):
    await store.disable_destination("billing", T0 + timedelta(hours=1))
    found = await store.get_destination("billing")
    assert found.disabled and found.updated_at == T0 + timedelta(hours=1)


async def test_grants_have_revisions_expire_and_prefer_an_exact_destination(store):
    assert await store.list_grants() == []
    grant, created = await store.put_grant("g1", GrantSpec(scope="acme", destination="*"), T0)
    assert created and grant.revision == 1
    grant, created = await store.put_grant("g1", GrantSpec(scope="acme", destination="*", note="again"), T0)
    assert not created and grant.revision == 2 and grant.note == "again"
    await store.put_grant("g2", GrantSpec(scope="acme", destination="billing",
                                          expires_at=T0 + timedelta(hours=1)), T0)
    assert (await store.find_grant("acme", "billing", T0)).id == "g2"
    assert (await store.find_grant("acme", "billing", T0 + timedelta(hours=2))).id == "g1"
    assert await store.find_grant("globex", "billing", T0) is None
    assert [g.id for g in await store.list_grants()] == ["g1", "g2"]
    assert await store.get_grant("g2") == (await store.list_grants())[1]
    found = await store.get_grant("g2")
    assert (found.scope, found.destination, found.revision, found.expires_at) == (
        "acme", "billing", 1, T0 + timedelta(hours=1))
    await store.delete_grant("g1")
    assert await store.find_grant("acme", "billing", T0 + timedelta(hours=2)) is None
    assert await store.get_grant("g1") is None
    with pytest.raises(NotFound):
        await store.delete_grant("g1")


# -- housekeeping and metrics ------------------------------------------------------------


async def finish(store, action_id: str, status: Status, at: datetime) -> None:
    """Move an intent on, its last change at ``at``: a pending one to cancelled, a leased one (at
    fence 1) to delivered with its attempt."""
    key = f"acme/{action_id}"
    if status is Status.CANCELLED:
        await made(store, Cancel(key, Status.PENDING, (Event(kind="cancelled", at=at, actor="op"),)))
        return
    done = replace(attempt(1, 1, at=at, finished_at=at, submission=Submission.SUBMITTED,
                           outcome=Outcome.DELIVERED, status_code=200), attempt_id=f"att-{action_id}")
    await made(store, Settle(key, 1, Status.DELIVERED, (Event(kind="delivered", at=at, actor="w1"),), attempts=1,
                             attempt=done))


async def test_prune_deletes_finished_intents_older_than_the_cutoff_oldest_first_with_their_history(store):
    later = T0 + timedelta(days=1)  # not due when the others are claimed
    await store.insert_intents([new("d1"), new("c1", at=later), new("d2"), new("open", at=later), new("recent")])
    await store.claim("w1", now=T0, lease_until=T0 + timedelta(hours=1), limit=10)  # d1, d2, recent
    for name, status, minutes in (("d2", Status.DELIVERED, 3), ("c1", Status.CANCELLED, 2),
                                  ("d1", Status.DELIVERED, 1), ("recent", Status.DELIVERED, 10)):
        await finish(store, name, status, T0 + timedelta(minutes=minutes))
    cutoff = T0 + timedelta(minutes=5)
    assert await store.prune(cutoff, dry_run=True, limit=None) == ["d1", "c1", "d2"]
    assert await store.get_intent("acme/d1") is not None  # a dry run deletes nothing
    assert await store.prune(cutoff, dry_run=False, limit=1) == ["d1"]
    assert await store.get_intent("acme/d1") is None
    history = await store.history("acme/d1")
    assert (history.intent, history.attempts, history.events) == (None, [], [])
    assert await store.prune(cutoff, dry_run=False, limit=None) == ["c1", "d2"]
    assert await store.prune(cutoff, dry_run=False, limit=None) == []
    left = await store.list_intents(IntentQuery())
    assert sorted(i.action_id for i in left.intents) == ["open", "recent"]
    assert len((await store.history("acme/recent")).attempts) == 1


async def test_the_backlog_is_counted_by_status_and_channel(store):
    assert await store.count_by_status() == []
    await store.insert_intents([new("p1"), new("p2"), new("p3"), new("h1", dest="approvals")])
    await store.claim("w1", now=T0, lease_until=T0 + timedelta(seconds=30), limit=1)
    assert sorted(await store.count_by_status()) == [
        ("held", "webhook", 1), ("leased", "webhook", 1), ("pending", "webhook", 2)]


async def test_due_times_count_only_pending_intents(store):
    assert await store.next_due_at() is None
    assert await store.oldest_due_at(T0) is None
    await store.insert_intents([new("soon", at=T0 + timedelta(minutes=1)), new("later", at=T0 + timedelta(minutes=3)),
                                new("held", dest="approvals", at=T0)])
    assert await store.next_due_at() == T0 + timedelta(minutes=1)  # the held intent is not waiting for a time
    assert await store.oldest_due_at(T0) is None  # nothing is due yet
    assert await store.oldest_due_at(T0 + timedelta(minutes=2)) == T0 + timedelta(minutes=1)
    assert await store.oldest_due_at(T0 + timedelta(minutes=5)) == T0 + timedelta(minutes=1)
    [claimed] = await store.claim("w1", now=T0 + timedelta(minutes=2), lease_until=T0 + timedelta(minutes=3), limit=5)
    assert claimed.action_id == "soon"
    assert await store.next_due_at() == T0 + timedelta(minutes=3)
    assert await store.oldest_due_at(T0 + timedelta(minutes=2)) is None


# -- times written by hand, beyond what a datetime holds --------------------------------------


async def written_by_hand(store: Store, statement: str, *parameters: str) -> None:
    async with store.transaction() as tx:
        await tx.execute(statement, parameters)


async def test_a_time_no_datetime_can_hold_fails_no_read_of_the_rows_beside_it(store):
    """Such a time (the issue's requests stored them on SQLite; anyone can write them by hand)
    made every read that met its row raise OverflowError: each claim, each listing, the due
    times, the history. It reads as the nearest time that can be read, the intent says which,
    and what is due, expired or older stays so."""
    sql = CALLER_SQL[store.dialect]
    await store.insert_intents([new(name) for name in ("expired", "never", "latest", "fine")])
    await store.put_grant("g1", GrantSpec(scope="acme", destination="*"), T0)
    await written_by_hand(store, sql.before_year_1, "expired")
    await written_by_hand(store, sql.after_year_9999, "never")
    await written_by_hand(store, sql.latest, "latest")
    await written_by_hand(store, sql.grant_earliest)

    listed = {i.action_id: i for i in (await store.list_intents(IntentQuery())).intents}
    assert listed["fine"].unreadable is None and listed["fine"].expires_at is None
    assert listed["expired"].expires_at == FIRST
    assert listed["expired"].unreadable is not None and "expires_at before 0001-01-01T00:00:00Z" in \
        listed["expired"].unreadable
    for name in ("never", "latest"):
        assert listed[name].next_attempt_at == LAST
        assert "next_attempt_at after 9999-12-31T23:59:59.999999Z" in (listed[name].unreadable or "")
    claimed = await store.claim("w1", now=T0, lease_until=T0 + timedelta(seconds=30), limit=10)
    assert sorted(i.action_id for i in claimed) == ["expired", "fine"]
    assert await store.next_due_at() == LAST  # never and latest wait
    assert [i.unreadable is not None for i in sorted(claimed, key=lambda i: i.action_id)] == [True, False]
    activity = await store.activity(T0 - timedelta(hours=1), T0)
    assert [(w.count, w.oldest_due_at) for w in activity.waiting] == [(4, None)]
    assert await store.oldest_due_at(T0) is None

    history = await store.history("acme/expired")
    assert history.intent is not None and history.intent.unreadable and len(history.events) == 2
    assert [i.action_id for i in await store.intents_named("never")] == ["never"]
    await made(store, Settle("acme/expired", history.intent.fence, Status.DEAD,
                             (Event(kind="dead_lettered", at=T0, actor="w1"),)))
    dead = await store.get_intent("acme/expired")
    assert dead.status is Status.DEAD and dead.expires_at == FIRST and dead.unreadable
    for name, status in (("expired", Status.DEAD), ("never", Status.PENDING)):
        cancelled = await made(store, Cancel(f"acme/{name}", status, (Event(kind="cancelled", at=T0, actor="op"),)))
        assert cancelled is not None and cancelled.status is Status.CANCELLED and cancelled.unreadable

    grant = await store.get_grant("g1")
    assert grant is not None and grant.expires_at == FIRST  # long expired, as stored
    assert await store.find_grant("acme", "billing", T0) is None


# -- ordering per key --------------------------------------------------------------------------


async def ordered(store: Store, on_dead: OnDead = OnDead.BLOCK, **changes) -> None:
    """Register ``ordered``: a destination that delivers each ordering key in enqueue order."""
    await store.put_destination(destination("ordered", ordering=Ordering.KEY, ordering_on_dead=on_dead, **changes))


async def claim_ids(store: Store, now: datetime = T0, limit: int = 50) -> list[str]:
    claimed = await store.claim("w1", now=now, lease_until=now + timedelta(seconds=30), limit=limit)
    return sorted(i.action_id for i in claimed)


async def settle(store: Store, action_id: str, status: Status, next_attempt_at: datetime | None = None) -> None:
    """Move a leased intent on, as a worker's outcome would."""
    intent = await store.get_intent(f"acme/{action_id}")
    await made(store, Settle(intent.key, intent.fence, status, (Event(kind="attempt_finished", at=T0, actor="w1"),),
                             next_attempt_at=next_attempt_at))


async def test_an_ordered_key_is_claimed_one_intent_at_a_time_in_enqueue_order(store):
    await ordered(store)
    await store.insert_intents([new("a1", dest="ordered", key="k1"), new("b1", dest="ordered", key="k2"),
                                new("a2", dest="ordered", key="k1"), new("n1", dest="ordered"),
                                new("a3", dest="ordered", key="k1"), new("b2", dest="ordered", key="k2")])
    assert (await store.get_intent("acme/a1")).ordering_key == "k1"
    assert await claim_ids(store) == ["a1", "b1", "n1"]  # each key's first; an intent without a key waits for none
    assert await claim_ids(store) == []
    assert [(await store.waiting_behind(f"acme/{a}")).action_id for a in ("a2", "a3", "b2")] == ["a1", "a1", "b1"]
    in_flight = await store.waiting_behind("acme/a2")  # the earlier one in flight, read with its lease
    assert (in_flight.status, in_flight.lease_owner, in_flight.fence) == (Status.LEASED, "w1", 1)
    assert await store.waiting_behind("acme/a1") is None  # leased: it waits for nothing
    await settle(store, "a1", Status.DELIVERED)
    assert await claim_ids(store) == ["a2"]
    assert (await store.waiting_behind("acme/a3")).action_id == "a2"
    await settle(store, "a2", Status.DELIVERED)
    await settle(store, "b1", Status.DELIVERED)
    assert await claim_ids(store) == ["a3", "b2"]


async def test_concurrent_claimers_never_lease_two_intents_of_one_key(store):
    await ordered(store)
    await store.insert_intents([new(f"k{k}-{n}", dest="ordered", key=f"k{k}") for n in range(5) for k in range(10)])
    batches = await asyncio.gather(*(store.claim(f"w{n}", now=T0, lease_until=T0, limit=7) for n in range(10)))
    assert sorted(i.action_id for batch in batches for i in batch) == sorted(f"k{k}-0" for k in range(10))


async def test_a_retry_of_the_head_keeps_its_key_waiting_and_unordered_destinations_ignore_keys(store):
    await ordered(store)
    await store.insert_intents([new("a1", dest="ordered", key="k1"), new("a2", dest="ordered", key="k1"),
                                new("u1", key="k1"), new("u2", key="k1")])  # billing does not order
    assert await claim_ids(store) == ["a1", "u1", "u2"]
    await settle(store, "a1", Status.PENDING, next_attempt_at=T0 + timedelta(hours=1))  # backing off
    assert await claim_ids(store, now=T0 + timedelta(minutes=1)) == []
    assert await store.next_due_at() == T0 + timedelta(hours=1)  # a2, due long ago, is not: it waits for a1
    assert (await store.waiting_behind("acme/a2")).status is Status.PENDING
    assert await store.waiting_behind("acme/u2") is None
    assert await claim_ids(store, now=T0 + timedelta(hours=2)) == ["a1"]


async def test_a_held_intent_keeps_its_key_waiting(store):
    await ordered(store, requires_approval=True)
    await store.insert_intents([new("h1", dest="ordered", key="k1"), new("h2", dest="ordered", key="k1")])
    await made(store, Approve("acme/h2", "sha256:aa", T0 + timedelta(hours=1), "op", T0,
                              (Event(kind="approved", at=T0, actor="op"),)))
    assert await claim_ids(store) == []
    assert (await store.waiting_behind("acme/h2")).action_id == "h1"


@pytest.mark.parametrize("on_dead", list(OnDead))
async def test_a_dead_letter_blocks_its_key_until_replayed_unless_the_destination_skips_it(store, on_dead):
    await ordered(store, on_dead)
    await store.insert_intents([new("a1", dest="ordered", key="k1"), new("a2", dest="ordered", key="k1")])
    await store.insert_intents([new("a1", scope="globex", dest="ordered", key="k1")])  # same key, later, elsewhere
    assert await claim_ids(store) == ["a1"]
    await settle(store, "a1", Status.DEAD)
    if on_dead is OnDead.SKIP:
        assert await claim_ids(store) == ["a2"]
        return
    assert await claim_ids(store) == []
    behind = await store.waiting_behind("acme/a2")
    assert (behind.action_id, behind.status) == ("a1", Status.DEAD)
    assert (await store.waiting_behind("globex/a1")).key == "acme/a1"  # another scope's intent is in the way too
    await made(store, Replay("acme/a1", Status.DEAD, T0, 5, (Event(kind="replayed", at=T0, actor="op"),)))
    assert await claim_ids(store) == ["a1"]  # the replayed one goes first
    await settle(store, "a1", Status.DELIVERED)
    assert await claim_ids(store) == ["a2"]


async def test_a_revoked_intent_blocks_its_key_until_cancelled(store):
    await ordered(store)
    await store.insert_intents([new("r1", dest="ordered", key="k1"), new("r2", dest="ordered", key="k1")])
    await claim_ids(store)
    await settle(store, "r1", Status.REVOKED)
    assert await claim_ids(store) == []
    await made(store, Cancel("acme/r1", Status.REVOKED, (Event(kind="cancelled", at=T0, actor="op"),)))
    assert await claim_ids(store) == ["r2"]


async def test_keys_are_per_destination(store):
    await ordered(store)
    await store.put_destination(destination("ordered-too", ordering=Ordering.KEY))
    await store.insert_intents([new("a1", dest="ordered", key="k1"), new("b1", dest="ordered-too", key="k1")])
    assert await claim_ids(store) == ["a1", "b1"]



# -- the suite's own coverage (keep this test last) ------------------------------------------


def test_every_protocol_method_is_exercised(store_factory, request):
    """Every method of the store and transaction protocols was called by this suite (this module
    and those of SUITE) for this backend. It runs after the others (pytest keeps definition order,
    and runs the modules of a directory by name) and needs all of them."""
    backend = store_factory.__name__
    modules = [vars(importlib.import_module(f"{__package__}.{name}")) for name in SUITE] + [globals()]
    suite = {name for names in modules for name in names if name.startswith("test_")} - {request.node.originalname}
    skipped = sorted(suite - RAN.get(backend, set()))
    if skipped:
        pytest.skip(f"only a run of the whole suite proves its coverage ({len(skipped)} of its tests did not run)")
    missing = sorted(REQUIRED - EXERCISED[backend])
    assert not missing, f"the suite never calls {', '.join(missing)}: add a test that does"
