"""The worker's cycles: each one ``Store.apply`` of the outcomes buffered, the attempt starts of
the leases ready and a claim; what happens when a start is refused, a read fails, the store is
down, or work is enqueued while a cycle runs."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from outbox import Event, EventKind, Status, StoreUnavailable, channels
from outbox.model import Release, Settle, Start
from tests import file_channel

from ..conftest import eventually
from ..receiver import Receiver, Reply
from .conftest import SenderEnv
from .test_sender_leases import fail_once, kinds


async def test_a_refused_start_gives_its_slot_back_and_nothing_is_sent(env: SenderEnv, receiver: Receiver):
    receiver.script("/hook", Reply(200))
    await env.destination(f"{receiver.url}/hook")
    await env.enqueue("a1")
    await env.enqueue("a2")
    apply = env.box.store.apply

    async def lost_before_its_start(changes, *, claim=None):
        for change in changes:  # a1's lease is given back by someone else just before its start commits
            if isinstance(change, Start) and change.key == "acme/a1":
                taken = Release(change.key, change.fence, env.clock.now(),
                                (Event(EventKind.RELEASED, env.clock.now(), "someone-else", "taken back"),))
                assert (await apply([taken])).results == [None]
        return await apply(changes, claim=claim)

    env.box.store.apply = lost_before_its_start  # type: ignore[method-assign]
    worker = env.worker(worker_id="w1", concurrency=1)  # one send slot: a2 goes only if a1 gives it back
    assert await worker.run_once(limit=2) == 2

    assert worker.stale_writes == 1 and not worker.leases
    assert [r.headers["idempotency-key"] for r in receiver.requests("/hook")] == ["acme/a2"]
    assert (await env.box.get("a2")).status is Status.DELIVERED
    refused = await env.box.history("a1")
    assert refused.intent.status is Status.PENDING and refused.attempts == []
    assert "attempt_started" not in kinds(refused)


def _unnamed(settings: Any) -> str:
    """A channel's ``target`` with a bug: it has no words for one destination's settings."""
    if settings["path"].endswith("broken.jsonl"):
        raise RuntimeError("no words for this one")
    return f"file {settings['path']}"


async def test_a_start_that_fails_for_one_lease_gives_that_one_back_and_the_cycle_goes_on(
        env: SenderEnv, receiver: Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A start holds where its attempt goes, in its channel's words (``ChannelKind.target``, a
    channel's own code). One that raised for one destination failed the whole cycle, and every
    lease already taken off the queue for its starts was lost: held and renewed, never started
    nor given back, so an intent to a healthy destination claimed beside it waited until the
    worker restarted (a webhook destination's stored settings without a url did it too)."""
    monkeypatch.setitem(channels._kinds, "file", dataclasses.replace(file_channel.CHANNEL, target=_unnamed))
    receiver.script("/hook", Reply(200))
    await env.destination(f"{receiver.url}/hook")
    broken = tmp_path / "broken.jsonl"
    await env.box.put_destination("broken", file_channel.FileSpec(channel="file", path=str(broken)))
    await env.enqueue("a1")  # first in the queue: its start is made before the broken one's
    env.clock.advance(0.001)
    await env.enqueue("b1", {"line": "never"}, destination="broken")
    worker = env.worker(worker_id="w1")
    assert await asyncio.wait_for(worker.run_once(limit=2), 20) == 2

    assert (await env.box.get("a1")).status is Status.DELIVERED
    assert [r.headers["idempotency-key"] for r in receiver.requests("/hook")] == ["acme/a1"]
    given_back = await env.box.history("b1")
    assert given_back.intent.status is Status.PENDING and given_back.attempts == []
    [released] = [e for e in given_back.events if e.kind is EventKind.RELEASED]
    assert released.reason == "RuntimeError: no words for this one before an attempt started"
    assert not broken.exists() and not worker.leases  # nothing sent, nothing held


async def test_a_lease_whose_destination_cannot_be_read_waits_for_a_later_cycle(open_env, receiver: Receiver):
    env: SenderEnv = await open_env(poll_seconds=0.05)
    receiver.script("/hook", Reply(200))
    await env.destination(f"{receiver.url}/hook")
    await env.enqueue("a1")
    read = fail_once(env, "get_destination", StoreUnavailable("database is locked"))
    assert await env.worker(worker_id="w1").run_once() == 1

    assert read  # read again once the store answered
    history = await env.box.history("a1")
    assert history.intent.status is Status.DELIVERED and history.intent.fence == 1  # the same lease
    assert [a.number for a in history.attempts] == [1]
    assert "released" not in kinds(history)  # kept leased while it waited, never given back
    assert len(receiver.requests("/hook")) == 1


async def test_a_destination_is_read_once_for_all_the_leases_that_wait_for_it(env: SenderEnv, receiver: Receiver):
    """A worker's cache of destination records runs out for every lease of a cycle at once."""
    receiver.script("/hook", Reply(200))
    await env.destination(f"{receiver.url}/hook")
    for n in range(20):
        await env.enqueue(f"a{n}")
    reads = fail_once(env, "get_destination", StoreUnavailable("database is locked"))
    assert await env.worker(worker_id="w1").run_once(limit=20) == 20

    assert len(reads) == 1  # the read that failed made every lease wait; the next one served them all
    assert len(receiver.requests("/hook")) == 20
    assert {(await env.box.get(f"a{n}")).status for n in range(20)} == {Status.DELIVERED}


async def test_outcomes_buffered_while_the_store_is_down_are_all_recorded_once_it_is_back(
        open_env, receiver: Receiver):
    env: SenderEnv = await open_env(poll_seconds=0.05)
    receiver.script("/hook", *[Reply(200, headers={"External-Id": f"r-{n}"}) for n in range(5)])
    await env.destination(f"{receiver.url}/hook")
    for n in range(5):
        await env.enqueue(f"a{n}")
    apply = env.box.store.apply
    down = True
    refused: list[int] = []

    async def outcomes_fail(changes, *, claim=None):
        if down and any(isinstance(change, Settle) for change in changes):
            refused.append(len(changes))
            raise StoreUnavailable("could not connect to the database")
        return await apply(changes, claim=claim)

    env.box.store.apply = outcomes_fail  # type: ignore[method-assign]
    async with env.running(worker_id="w1", concurrency=8) as (worker, _):
        assert await eventually(lambda: len(receiver.requests("/hook")) == 5)
        assert await eventually(lambda: len(refused) >= 3)  # retried, backing off, the outcomes kept
        assert worker.trouble is not None
        down = False
        for n in range(5):
            assert await eventually(lambda n=n: env.status_is(f"a{n}", Status.DELIVERED))
        assert worker.stale_writes == 0 and worker.trouble is None
    assert len(receiver.requests("/hook")) == 5  # no attempt made twice
    external = set()
    for n in range(5):
        history = await env.box.history(f"a{n}")
        [attempt] = history.attempts
        assert history.intent.attempts == 1 and attempt.finished_at is not None
        external.add(attempt.external_id)
    assert external == {f"r-{n}" for n in range(5)}  # every receiver's answer recorded


async def test_an_enqueue_during_a_cycle_is_not_missed(open_env, receiver: Receiver):
    env: SenderEnv = await open_env(poll_seconds=30)  # only the wake-up can bring it in time
    receiver.script("/hook", Reply(200))
    await env.destination(f"{receiver.url}/hook")
    next_due_at = env.box.store.next_due_at
    enqueued = asyncio.Event()

    async def enqueue_meanwhile(*args):
        due = await next_due_at(*args)  # the cycle found nothing due, and is about to sleep ...
        if not enqueued.is_set():
            await env.enqueue("late")  # ... when this comes
            enqueued.set()
        return due

    env.box.store.next_due_at = enqueue_meanwhile  # type: ignore[method-assign]
    async with env.running(worker_id="w1"):
        await asyncio.wait_for(enqueued.wait(), 5)
        assert await eventually(lambda: env.status_is("late", Status.DELIVERED))


async def test_the_next_cycle_gathers_while_one_waits_on_the_store(open_env, receiver: Receiver):
    env: SenderEnv = await open_env(poll_seconds=0.05)
    receiver.script("/hook", Reply(200))
    await env.destination(f"{receiver.url}/hook")
    for n in range(40):
        await env.enqueue(f"a{n}")
    apply = env.box.store.apply
    under_way, most = 0, 0

    async def slow(changes, *, claim=None):  # a database that takes its time over each transaction
        nonlocal under_way, most
        under_way += 1
        most = max(most, under_way)
        try:
            await asyncio.sleep(0.05)
            return await apply(changes, claim=claim)
        finally:
            under_way -= 1

    async def all_delivered() -> bool:
        return all([await env.status_is(f"a{n}", Status.DELIVERED) for n in range(40)])

    env.box.store.apply = slow  # type: ignore[method-assign]
    async with env.running(worker_id="w1", concurrency=4):
        assert await eventually(all_delivered)
    assert most == 2  # two applies under way at once, never more
    assert sorted(r.headers["idempotency-key"] for r in receiver.requests("/hook")) == sorted(
        f"acme/a{n}" for n in range(40))  # each once
