"""The worker's lease bookkeeping: the room its leases leave, the order they are picked in, and
what the heartbeat renews."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from outbox import Intent, Status
from outbox.clock import ManualClock
from sender.heartbeat import Heartbeat
from sender.leases import LEASES_PER_SLOT, Lease, Leases

NOW = datetime(2030, 1, 1, tzinfo=UTC)
BASE = Intent(1, "a1", "acme", "hook", "webhook", "{}", "sha256:x", Status.LEASED, 0, 5,
              NOW, None, None, "w", NOW, 1, NOW, NOW, None)


def intent(n: int, fence: int = 1) -> Intent:
    return dataclasses.replace(BASE, seq=n, action_id=f"a{n}", fence=fence)


def taking(taken: list[str], *, refuse: frozenset[str] = frozenset()):
    def take(lease: Lease) -> bool:
        taken.append(lease.intent.action_id)
        return lease.intent.action_id not in refuse
    return take


def test_leases_are_picked_oldest_first_while_send_slots_are_free_and_those_that_wait_keep_their_place():
    freed: list[None] = []
    leases = Leases(2, lambda: freed.append(None))
    held = [leases.hold(intent(n), NOW) for n in range(1, 6)]
    held[0].not_before = 10.0  # its checks' read failed: it waits
    held[2].final = True  # its last change is buffered
    taken: list[str] = []
    leases.pick(5.0, taking(taken, refuse=frozenset({"a2"})))  # a2's checks refuse it: no slot taken
    assert taken == ["a2", "a4", "a5"]
    assert len(leases) == 5 and leases.free() == 2 * LEASES_PER_SLOT - 5
    assert leases.next_due() == 10.0  # a1 kept its place, first in line
    taken.clear()
    leases.pick(11.0, taking(taken))
    assert taken == ["a1"]
    leases.forget(held[0])
    assert held[0].final and len(leases) == 4 and freed


def test_room_counts_sends_fetches_and_starts_under_way_until_they_are_done():
    async def run() -> None:
        leases = Leases(4, lambda: None)
        go = asyncio.Event()

        async def until_go() -> None:
            await go.wait()

        sending, fetching = asyncio.create_task(until_go()), asyncio.create_task(until_go())
        leases.sending(sending, 2)
        leases.fetching(fetching)
        assert leases.room() == 1 and leases.sends == 2 and not leases.idle()
        with leases.applying(set(), claims=3, starts=1):
            assert leases.room() == 0 and leases.free() == 4 * LEASES_PER_SLOT - 3
        assert leases.room() == 1 and leases.free() == 4 * LEASES_PER_SLOT
        go.set()
        await asyncio.gather(sending, fetching)
        await asyncio.sleep(0)  # the done callbacks
        assert leases.room() == 4 and leases.sends == 0 and leases.idle()

    asyncio.run(run())


def test_the_heartbeat_renews_what_is_in_no_apply_and_only_a_lease_still_held_is_lost():
    leases = Leases(1, lambda: None)
    one, two = leases.hold(intent(1, fence=3), NOW), leases.hold(intent(2), NOW)
    with leases.applying({two.intent.key}, claims=0, starts=0):
        assert leases.renewable() == [(one.intent.key, 3)]
        assert not leases.holds(two.intent.key, 1)  # its change is being applied
    later = datetime(2030, 1, 1, 0, 1, tzinfo=UTC)
    leases.renewed([(one.intent.key, 3), (two.intent.key, 9)], later)
    assert one.confirmed == later and two.confirmed == NOW  # another fence: not this lease
    assert leases.holds(one.intent.key, 3) and not leases.holds(one.intent.key, 4)
    assert leases.let_waiting_go() == [one, two] and leases.next_due() is None


def test_a_lease_the_store_says_is_lost_is_not_confirmed_by_the_renewal_that_found_it_lost():
    class Renewing:
        def __init__(self) -> None:
            self.beat = asyncio.Event()

        async def renew_leases(self, held: list[tuple[str, int]], until: datetime) -> list[str]:
            self.beat.set()
            return [held[1][0]]  # the second lease was taken over

    async def run() -> None:
        leases = Leases(1, lambda: None)
        kept, lost = leases.hold(intent(1), NOW), leases.hold(intent(2), NOW)
        store = Renewing()
        beat = asyncio.create_task(Heartbeat(store, ManualClock(NOW), timedelta(milliseconds=30), "w",  # type: ignore[arg-type]
                                             leases).run())
        await store.beat.wait()
        await asyncio.sleep(0)  # the renewal's answer taken in
        beat.cancel()
        with pytest.raises(asyncio.CancelledError):
            await beat
        assert kept.confirmed > NOW and lost.confirmed == NOW

    asyncio.run(run())
