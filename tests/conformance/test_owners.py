"""The store conformance suite, tenant-owned destinations: an owned destination is reached by its
owner's intents and events only (its grant implied, no other scope's able to reach it), listed by
owner, kept within its owner's limits counted in the store's transaction, and keeps a rotation's
window. Run on every backend of ``backends.STORE_FACTORIES`` with the fixtures of ``test_store.py``."""

# ruff: noqa: F811 (the suite's fixtures are imported by name, and the functions here take them by that name)

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from outbox import TenantLimit, UnknownDestination
from outbox.grants import GrantSpec
from outbox.tenants import TenantLimits
from outbox.topics import Subscription

from .test_events import event
from .test_store import T0, destination, new, open_store, store, store_factory  # noqa: F401 (fixtures)


async def test_an_owned_destination_is_reached_by_its_owners_intents_only(store):
    await store.put_destination(destination("t-acme", owner="acme"))
    mine = await store.insert_intent(*new("a1", dest="t-acme"))
    assert mine.created and mine.intent.destination == "t-acme"
    with pytest.raises(UnknownDestination) as refused:  # the same answer as for no destination at all
        await store.insert_intent(*new("a1", scope="globex", dest="t-acme"))
    assert str(refused.value) == "destination 't-acme' is not registered"
    [taken, other] = await store.insert_each([new("a2", dest="t-acme"), new("a2", scope="globex", dest="t-acme")])
    assert taken.created and isinstance(other, UnknownDestination)
    assert await store.get_intent("globex/a1") is None and await store.get_intent("globex/a2") is None


async def test_an_owned_destination_receives_its_owners_events_only_without_a_grant(store):
    every = (Subscription("*", None),)
    await store.put_destination(destination("t-acme", owner="acme", subscriptions=every))
    await store.put_destination(destination("shared", subscriptions=every))
    await store.put_grant("g-globex-all", GrantSpec(scope="globex", destination="*"), T0)  # '*' reaches no owned one
    await store.put_grant("g-acme-shared", GrantSpec(scope="acme", destination="shared"), T0)
    for granted_only in (True, False):
        ours = await store.publish(event(f"e-{granted_only}"), granted_only=granted_only)
        theirs = await store.publish(event(f"e-{granted_only}", scope="globex"), granted_only=granted_only)
        assert sorted(d.destination for d in ours.event.fanout) == ["shared", "t-acme"]
        assert [d.destination for d in theirs.event.fanout] == ["shared"]
    [ours, theirs] = await store.publish_each([event("b1"), event("b1", scope="globex")], granted_only=True)
    assert sorted(d.destination for d in ours.event.fanout) == ["shared", "t-acme"]
    assert [d.destination for d in theirs.event.fanout] == ["shared"]


async def test_destinations_are_listed_by_owner_and_keep_their_rotation_window(store):
    until = T0 + timedelta(hours=24)
    await store.put_destination(destination("t-b", owner="acme", secrets=("whsec_new", "whsec_old"),
                                            previous_secrets_until=until))
    await store.put_destination(destination("t-a", owner="acme"))
    await store.put_destination(destination("t-g", owner="globex"))
    assert [d.id for d in await store.list_destinations(owner="acme")] == ["t-a", "t-b"]
    assert [d.id for d in await store.list_destinations(owner="nobody")] == []
    assert [d.owner for d in await store.list_destinations()] == [None, None, "acme", "acme", "globex"]
    found = await store.get_destination("t-b")
    assert found.previous_secrets_until == until
    assert found.live_secrets(until - timedelta(microseconds=1)) == ("whsec_new", "whsec_old")
    assert found.live_secrets(until) == ("whsec_new",)


async def test_an_owners_limits_are_counted_in_the_put_and_a_refused_put_writes_nothing(store):
    limits = TenantLimits(destinations=2, subscriptions=3)
    subscribed = tuple(Subscription(f"t{i}.*", ("acme",)) for i in range(2))
    assert await store.put_destination(destination("t-1", owner="acme", subscriptions=subscribed), limits=limits)
    assert not await store.put_destination(destination("t-1", owner="acme", subscriptions=subscribed),
                                           limits=limits)  # replacing one is not one more
    with pytest.raises(TenantLimit):  # 2 + 2 subscriptions > 3
        await store.put_destination(destination("t-2", owner="acme", subscriptions=subscribed), limits=limits)
    assert await store.get_destination("t-2") is None
    assert await store.put_destination(destination("t-2", owner="acme"), limits=limits)
    with pytest.raises(TenantLimit) as refused:
        await store.put_destination(destination("t-3", owner="acme"), limits=limits)
    assert refused.value.limit == 2 and await store.get_destination("t-3") is None
    assert await store.put_destination(destination("t-3", owner="globex"), limits=limits)  # its own count
    assert await store.put_destination(destination("t-4", owner="acme"))  # without limits: an admin's put


async def test_concurrent_puts_of_one_owner_never_pass_its_limit(store):
    limits = TenantLimits(destinations=3, subscriptions=100)
    results = await asyncio.gather(*(store.put_destination(destination(f"t-{i}", owner="acme"), limits=limits)
                                     for i in range(8)), return_exceptions=True)
    assert sum(r is True for r in results) == 3
    assert all(isinstance(r, TenantLimit) for r in results if r is not True)
    assert len(await store.list_destinations(owner="acme")) == 3
