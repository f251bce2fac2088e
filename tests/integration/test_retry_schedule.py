"""A destination's retry schedule and maximum age, on both stores, against a real webhook
receiver that fails: time is a ManualClock moved exactly to each intent's next attempt, so the
attempts' spacing is the schedule's, without waiting for it."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from outbox import IllegalTransition, ManualClock, Outbox, Settings, Status, operations
from outbox.grants import GrantSpec
from outbox.operations import Actor
from outbox.shapes import destination_json

from ..receiver import Receiver, Reply
from .conftest import SenderEnv

SCHEDULE = [5, 30, 300]


@pytest.fixture
async def env(store_url: str) -> AsyncIterator[SenderEnv]:
    """A SenderEnv on SQLite, then on PostgreSQL."""
    settings = Settings(authority="grants", authority_seconds=0, lease_seconds=30)
    box = await Outbox.open(store_url, settings=settings, clock=ManualClock())
    await box.put_grant("g1", GrantSpec(scope="acme", destination="*"))
    env = SenderEnv(box, box.clock)
    yield env
    await env.aclose()


async def attempt_until_settled(env: SenderEnv, action_id: str) -> list[float]:
    """Run attempts, moving the clock to each next one, until the intent is no longer pending;
    the waits the intent was given, in seconds."""
    worker, waits = env.worker(), []
    assert await worker.run_once() == 1
    while (await env.box.get(action_id)).status is Status.PENDING:
        waits.append(await env.due_in(action_id))
        assert await worker.run_once() == 0  # not due a moment early
        await env.advance_until_due(action_id)
        assert await worker.run_once() == 1
    return waits


async def test_the_attempts_are_spaced_as_the_schedule_says(env: SenderEnv, receiver: Receiver):
    receiver.script("/hook", Reply(503), Reply(503), Reply(503), Reply(200))
    destination = await env.destination(f"{receiver.url}/hook", retry_schedule=SCHEDULE)
    assert destination_json(destination)["retry_schedule"] == SCHEDULE
    await env.enqueue("a1")

    assert await attempt_until_settled(env, "a1") == SCHEDULE
    assert (await env.box.get("a1")).status is Status.DELIVERED
    started = [a.started_at for a in (await env.box.history("a1")).attempts]
    assert [(b - a).total_seconds() for a, b in itertools.pairwise(started)] == SCHEDULE
    assert len(receiver.requests("/hook")) == 4


async def test_an_exhausted_schedule_is_a_dead_letter_that_says_so_and_a_replay_starts_it_over(
        env: SenderEnv, receiver: Receiver):
    receiver.script("/hook", Reply(503))
    await env.destination(f"{receiver.url}/hook", retry_schedule=[5, 30])
    await env.enqueue("a1")

    assert await attempt_until_settled(env, "a1") == [5, 30]
    intent = await env.box.get("a1")
    assert intent.status is Status.DEAD and intent.attempts == 3
    assert intent.last_error is not None
    assert intent.last_error.startswith("retry schedule exhausted (3 attempts, one more than its delays)")
    assert len(receiver.requests("/hook")) == 3

    await operations.replay(env.box, "a1", Actor("op", "the receiver is back"))  # the schedule starts over
    assert await attempt_until_settled(env, "a1") == [5, 30]
    intent = await env.box.get("a1")
    assert intent.status is Status.DEAD and intent.attempts == 6 and intent.replayed_after == 3
    assert len(receiver.requests("/hook")) == 6


async def test_a_retry_past_the_max_age_is_a_dead_letter_and_is_not_replayed(env: SenderEnv, receiver: Receiver):
    receiver.script("/hook", Reply(503))
    await env.destination(f"{receiver.url}/hook", retry_schedule=[30, 30, 30], max_age_seconds=60)
    await env.enqueue("a1")

    assert await attempt_until_settled(env, "a1") == [30]  # the next retry (at 60 s) is not before 60 s
    intent = await env.box.get("a1")
    assert intent.status is Status.DEAD and intent.attempts == 2
    assert intent.last_error is not None and intent.last_error.startswith("expired: the destination's max age of 60s")
    env.clock.advance(30)  # a replay is refused once the intent is past its max age
    with pytest.raises(IllegalTransition, match="cannot be sent: past the destination's max age of 60s"):
        await operations.replay(env.box, "a1", Actor("op", "again"))
    assert len(receiver.requests("/hook")) == 2


async def test_a_max_age_set_after_the_enqueue_holds_for_the_intent_already_queued(env: SenderEnv,
                                                                                   receiver: Receiver):
    receiver.script("/hook", Reply(200))
    await env.destination(f"{receiver.url}/hook")
    await env.enqueue("old")
    env.clock.advance(120)
    await env.enqueue("new")
    await env.destination(f"{receiver.url}/hook", max_age_seconds=60)

    assert await env.worker().run_once() == 2
    old, new = await env.box.get("old"), await env.box.get("new")
    assert (old.status, old.attempts) == (Status.DEAD, 0)  # nothing was sent
    assert old.last_error is not None
    assert old.last_error.startswith("expired before it could be sent: past the destination's max age of 60s ("
                                     + (old.created_at + timedelta(seconds=60)).isoformat())
    assert new.status is Status.DELIVERED
    assert [r.headers["idempotency-key"] for r in receiver.requests("/hook")] == ["acme/new"]
