"""The one TTL cache (tokens, destinations, authority decisions): a value is fresh for its
seconds from when it was asked for, and the bound drops the stale, then the older half."""

from __future__ import annotations

from outbox.ttlcache import TtlCache


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_value_is_served_for_its_seconds_from_when_it_was_asked_for():
    clock = Clock()
    cache: TtlCache[str, int | None] = TtlCache(2.0, 10, clock)
    cache.put("a", None)  # (a value may be None: a destination that does not exist)
    cache.put("b", 2, at=clock.now - 1.5)  # asked for before its answer came
    clock.now += 0.5
    assert cache.get("a", "missing") is None and cache.get("b", "missing") == "missing"
    clock.now += 1.5
    assert cache.get("a", "missing") == "missing"
    cache.put("c", 3)
    cache.pop("c")
    cache.pop("never")
    assert cache.get("c", 0) == 0


def test_zero_seconds_keeps_nothing():
    cache: TtlCache[str, int] = TtlCache(0, 10, Clock())
    cache.put("a", 1)
    assert len(cache) == 0 and cache.get("a", None) is None


def test_the_bound_drops_the_stale_then_the_older_half():
    clock = Clock()
    cache: TtlCache[int, int] = TtlCache(10.0, 4, clock)
    for n in range(2):
        cache.put(n, n)
    clock.now += 20  # 0 and 1 are stale
    for n in range(2, 4):
        cache.put(n, n)
    cache.put(4, 4)  # at the bound: the stale go
    assert len(cache) == 3 and [cache.get(n, None) for n in range(5)] == [None, None, 2, 3, 4]
    clock.now += 1
    cache.put(5, 5)
    cache.put(6, 6)  # four fresh at the bound: the older two go
    assert [n for n in range(7) if cache.get(n, None) is not None] == [4, 5, 6]
    cache.put(5, 50)  # a key already kept is replaced, nothing dropped
    assert len(cache) == 3
    cache.clear()
    assert len(cache) == 0
