"""In-process wake-ups (``outbox.signals``): a ticket hears every notify after it was taken, and
only those."""

from __future__ import annotations

import asyncio

from outbox.signals import Signal


async def test_a_ticket_hears_the_notify_after_it_and_a_later_ticket_waits_for_the_next():
    signal = Signal()
    before = signal.ticket()
    signal.notify()
    signal.notify()  # a second one, no ticket between: nothing more to wake
    after = signal.ticket()
    assert before.is_set() and not after.is_set()
    assert signal.ticket() is after  # no notify since: the same one
    assert await signal.wait(0.5, since=before)  # it came before the wait started: not missed
    assert not await signal.wait(0.01)  # none since
    waiting = asyncio.ensure_future(signal.wait(5.0))
    await asyncio.sleep(0)
    signal.notify()
    assert await waiting and after.is_set()
