"""The clocks the outbox reads: an OffsetClock puts this host's times on the database's timeline."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from outbox.clock import OffsetClock
from outbox.errors import StoreUnavailable


def test_an_offset_clock_is_the_wall_clock_moved_by_its_offset():
    ahead, behind = OffsetClock(90.0), OffsetClock(-2.5)
    before = datetime.now(UTC)
    read_ahead, read_behind = ahead.now(), behind.now()
    after = datetime.now(UTC)
    assert before + timedelta(seconds=90) <= read_ahead <= after + timedelta(seconds=90)
    assert before - timedelta(seconds=2.5) <= read_behind <= after - timedelta(seconds=2.5)
    assert read_ahead.tzinfo is not None
    assert OffsetClock().now() - datetime.now(UTC) < timedelta(seconds=1)


async def test_following_takes_each_measurement_and_keeps_the_last_when_one_fails():
    clock = OffsetClock(1.0)
    answers = iter([2.0, StoreUnavailable("the database is away"), 3.0])
    held: list[float] = []  # the offset when each measurement began

    async def measure() -> float:
        held.append(clock.offset)
        answer = next(answers, None)
        if answer is None:
            await asyncio.Event().wait()  # the test has what it needs: never answer again
        if isinstance(answer, Exception):
            raise answer
        assert answer is not None
        return answer

    follower = asyncio.create_task(clock.follow(measure, every=0.001))
    try:
        async with asyncio.timeout(5):
            while len(held) < 4:
                await asyncio.sleep(0.001)
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
    assert held == [1.0, 2.0, 2.0, 3.0]
