"""The authority decision cache: a decision is reused for at most ``authority_seconds``."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from sender import AuthorityRequest, CallableAuthority, Decision, Verdict
from sender.authority import MAX_CACHED, CachedAuthority


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def counting(verdict: Verdict = Verdict.ALLOW):
    """A Python-function provider that counts the questions it is asked."""
    asked: list[AuthorityRequest] = []

    async def policy(request: AuthorityRequest) -> Decision:
        asked.append(request)
        await asyncio.sleep(0)  # a provider yields: concurrent checks overlap
        return Decision(verdict, f"{verdict.value} #{len(asked)}", "python")

    return CallableAuthority(policy), asked


def request(scope: str = "acme", action_id: str = "a1") -> AuthorityRequest:
    return AuthorityRequest(scope, "webhook", "hook", action_id)


async def test_a_decision_is_reused_for_at_most_the_configured_seconds():
    provider, asked = counting()
    clock = Clock()
    cache = CachedAuthority(provider, 2.0, clock=clock)
    first = await cache.check(request(action_id="a1"))
    clock.now += 1.9
    assert await cache.check(request(action_id="a2")) == first  # same scope, channel, destination
    assert len(asked) == 1
    clock.now += 0.1  # two seconds after the decision: asked again
    assert (await cache.check(request(action_id="a3"))).reason == "allow #2"
    assert await cache.check(request(scope="shop")) != first  # another scope is another question
    assert len(asked) == 3


async def test_zero_seconds_asks_every_time_and_unavailable_is_never_kept():
    provider, asked = counting()
    uncached = CachedAuthority(provider, 0, clock=Clock())
    await uncached.check(request())
    await uncached.check(request())
    assert len(asked) == 2
    down, asked_down = counting(Verdict.UNAVAILABLE)
    cache = CachedAuthority(down, 60, clock=Clock())
    await cache.check(request())
    await cache.check(request())
    assert len(asked_down) == 2  # an outage is not remembered as an answer


async def test_concurrent_checks_share_one_question():
    provider, asked = counting()
    cache = CachedAuthority(provider, 2.0, clock=Clock())
    decisions = await asyncio.gather(*(cache.check(request(action_id=f"a{n}")) for n in range(20)))
    assert len(asked) == 1 and len(set(decisions)) == 1


async def test_the_cache_stays_bounded_however_many_scopes_it_sees():
    provider, asked = counting()
    clock = Clock()
    cache = CachedAuthority(provider, 2.0, clock=clock)
    for n in range(3 * MAX_CACHED):
        await cache.check(request(scope=f"tenant-{n}"))
        clock.now += 0.001
    assert len(cache._cache) <= MAX_CACHED
    asked.clear()
    await cache.check(request(scope=f"tenant-{3 * MAX_CACHED - 1}"))  # the newest is still served
    assert asked == []


async def test_a_decision_carries_when_the_provider_was_asked_and_a_cached_one_keeps_it():
    provider, _ = counting()
    clock = Clock()
    times = iter([datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC)])
    cache = CachedAuthority(provider, 2.0, clock=clock, wall=lambda: next(times))
    first = await cache.check(request())
    assert first.checked_at == datetime(2026, 1, 1, tzinfo=UTC)
    clock.now += 1
    assert (await cache.check(request(action_id="a2"))).checked_at == first.checked_at  # reused: its ask's time
    clock.now += 5
    assert (await cache.check(request(action_id="a3"))).checked_at == datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC)
    uncached = CachedAuthority(provider, 0, clock=clock, wall=lambda: datetime(2027, 1, 1, tzinfo=UTC))
    assert (await uncached.check(request())).checked_at == datetime(2027, 1, 1, tzinfo=UTC)
