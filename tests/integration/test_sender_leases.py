"""Leases, fences and the sweeper, with a receiver that holds its answer until the test lets go.

The ManualClock decides when a lease has expired; the receiver's gate decides when a send ends.
"""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import timedelta

from outbox import Attempt, Event, EventKind, Outcome, Status, StoreUnavailable, Submission
from outbox.model import Settle, Start
from sender import CallableAuthority

from ..conftest import eventually
from ..receiver import Gate, Receiver, Reply
from .conftest import SenderEnv


async def held_send(env: SenderEnv, receiver: Receiver, **spec: object) -> Gate:
    """Intent a1 to a destination whose receiver holds its 200 until the returned gate opens."""
    gate = Gate()
    receiver.script("/hook", Reply(200, gate=gate))
    await env.destination(f"{receiver.url}/hook", timeout_seconds=10, **spec)
    await env.enqueue("a1")
    return gate


def kinds(history) -> list[str]:
    return [event.kind for event in history.events]


def only(history, kind: str):
    [event] = [event for event in history.events if event.kind == kind]
    return event


async def test_a_send_slower_than_its_lease_is_fenced_out(env: SenderEnv, receiver: Receiver):
    gate = Gate()
    receiver.script("/hook", Reply(200, headers={"External-Id": "late"}, gate=gate),
                    Reply(200, headers={"External-Id": "second"}))
    await env.destination(f"{receiver.url}/hook", timeout_seconds=10)
    await env.enqueue("a1")
    slow, sweeper = env.worker(worker_id="w1"), env.worker(worker_id="w2")

    sending = asyncio.create_task(slow.run_once())
    [request] = await receiver.wait_for_requests(1, "/hook")
    leased = await env.box.get("a1")
    assert leased.status is Status.LEASED and leased.lease_owner == "w1" and leased.fence == 1
    assert leased.lease_expires_at == env.clock.now() + timedelta(seconds=30)
    [in_flight] = (await env.box.history("a1")).attempts
    assert in_flight.submission is None and in_flight.finished_at is None and in_flight.fence == 1
    assert request.headers["outbox-attempt-id"] == in_flight.attempt_id
    assert request.headers["outbox-fence"] == "1"

    assert await sweeper.sweep() == 0  # the lease is still live
    env.clock.advance(31)
    assert await sweeper.sweep() == 1

    recovered = await env.box.get("a1")
    assert recovered.status is Status.PENDING  # idempotent, inside retention: may be retried
    assert recovered.fence == 2 and recovered.lease_owner is None and recovered.lease_expires_at is None
    history = await env.box.history("a1")
    [attempt] = history.attempts
    assert attempt.attempt_id == in_flight.attempt_id
    assert (attempt.submission, attempt.outcome) == (Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN)
    assert "lease of w1 expired while its attempt was in flight" in attempt.error
    assert attempt.status_code is None and attempt.finished_at == env.clock.now()
    expired = only(history, "lease_expired")
    assert expired.actor == "w2" and expired.data == {"fence": 1}
    assert kinds(history)[-1] == "scheduled_retry"

    gate.open()  # the slow worker's 200 finally arrives: its write must be refused
    await asyncio.wait_for(sending, 10)
    assert slow.stale_writes == 1
    assert await env.box.get("a1") == recovered
    assert await env.box.history("a1") == history  # the old fence's outcome was not applied

    await env.advance_until_due("a1")
    assert await sweeper.run_once() == 1
    final = await env.box.get("a1")
    assert final.status is Status.DELIVERED and final.fence == 3 and final.attempts == 2
    attempts = (await env.box.history("a1")).attempts
    assert [(a.fence, a.outcome, a.external_id) for a in attempts] == [
        (1, Outcome.UNKNOWN, None), (3, Outcome.DELIVERED, "second")]
    first, second = receiver.requests("/hook")
    assert first.headers["idempotency-key"] == second.headers["idempotency-key"] == "acme/a1"
    assert (first.headers["outbox-fence"], second.headers["outbox-fence"]) == ("1", "3")
    assert sweeper.stale_writes == 0


async def test_a_non_idempotent_send_slower_than_its_lease_becomes_unknown(env: SenderEnv, receiver: Receiver):
    gate = await held_send(env, receiver, idempotent=False)
    slow, sweeper = env.worker(worker_id="w1"), env.worker(worker_id="w2")
    sending = asyncio.create_task(slow.run_once())
    await receiver.wait_for_requests(1, "/hook")
    env.clock.advance(31)
    assert await sweeper.sweep() == 1
    gate.open()
    await asyncio.wait_for(sending, 10)

    intent = await env.box.get("a1")
    assert intent.status is Status.UNKNOWN and intent.fence == 2
    assert "does not declare idempotency" in intent.last_error
    assert slow.stale_writes == 1
    assert (await env.box.wait("a1", timeout=5)).status is Status.UNKNOWN
    env.clock.advance(3600)
    assert await sweeper.run_once() == 0
    assert len(receiver.requests()) == 1


async def test_a_worker_whose_lease_expired_before_it_sent_never_sends(env: SenderEnv, receiver: Receiver):
    receiver.script("/hook", Reply(200))
    await env.destination(f"{receiver.url}/hook")
    await env.enqueue("a1")
    asked, answer = asyncio.Event(), asyncio.Event()

    async def slow_policy(request) -> bool:
        asked.set()
        await answer.wait()
        return True

    slow = env.worker(worker_id="w1", authority=CallableAuthority(slow_policy))
    sweeper = env.worker(worker_id="w2")
    checking = asyncio.create_task(slow.run_once())
    await asyncio.wait_for(asked.wait(), 10)
    env.clock.advance(31)
    assert await sweeper.sweep() == 1

    released = await env.box.get("a1")
    assert released.status is Status.PENDING and released.fence == 2 and released.attempts == 0
    assert released.next_attempt_at == env.clock.now()  # nothing was sent: due again at once
    history = await env.box.history("a1")
    assert history.attempts == []
    assert only(history, "lease_expired").reason == "lease of w1 expired before any attempt started"

    answer.set()  # the slow worker is allowed now, but its lease is gone
    await asyncio.wait_for(checking, 10)
    assert slow.stale_writes == 1
    assert receiver.requests() == []
    assert await env.box.get("a1") == released
    assert "attempt_started" not in kinds(await env.box.history("a1"))

    assert await sweeper.run_once() == 1
    assert (await env.box.get("a1")).status is Status.DELIVERED
    [request] = receiver.requests()
    assert request.headers["outbox-fence"] == "3"


async def test_heartbeats_keep_a_long_send_leased(open_env, receiver: Receiver):
    env: SenderEnv = await open_env(lease_seconds=0.3)  # heartbeat every 0.1 s (real time)
    gate = await held_send(env, receiver)
    sweeper = env.worker(worker_id="w2")
    async with env.running(worker_id="w1") as (worker, _):
        try:
            await receiver.wait_for_requests(1, "/hook")
            for _ in range(3):  # each time: move on 0.2 s, wait for the renewal, no sweep recovers it
                env.clock.advance(0.2)
                renewed = env.clock.now() + timedelta(seconds=0.3)

                async def renewed_to(at=renewed):
                    return (await env.box.get("a1")).lease_expires_at == at

                assert await eventually(renewed_to)
                assert await sweeper.sweep() == 0
            gate.open()
            await eventually(lambda: env.status_is("a1", Status.DELIVERED))
        finally:
            gate.open()
    intent = await env.box.get("a1")
    assert intent.status is Status.DELIVERED and intent.fence == 1
    assert worker.stale_writes == 0
    assert "lease_expired" not in kinds(await env.box.history("a1"))


async def test_stopping_mid_send_records_what_may_have_happened(open_env, receiver: Receiver):
    env: SenderEnv = await open_env(drain_seconds=0)
    gate = await held_send(env, receiver, idempotent=False)
    async with env.running(worker_id="w1"):
        await receiver.wait_for_requests(1, "/hook")
    gate.open()  # the worker stopped with no drain time: the send was cut short

    intent = await env.box.get("a1")
    assert intent.status is Status.UNKNOWN and intent.lease_owner is None and intent.attempts == 1
    [attempt] = (await env.box.history("a1")).attempts
    assert (attempt.submission, attempt.outcome) == (Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN)
    assert attempt.error == "the worker stopped while the request was in flight"


async def test_stopping_lets_an_in_flight_send_finish_within_the_drain(open_env, receiver: Receiver):
    env: SenderEnv = await open_env(drain_seconds=10)
    gate = await held_send(env, receiver)
    async with env.running(worker_id="w1") as (worker, _):
        await receiver.wait_for_requests(1, "/hook")
        worker.stop()
        await asyncio.sleep(0)  # let the loop see the stop before the answer comes
        gate.open()
    assert (await env.box.get("a1")).status is Status.DELIVERED
    assert len(receiver.requests()) == 1


def fault_attempt_write(env: SenderEnv, fault: BaseException | None, *, outcome: bool = False) -> asyncio.Event:
    """Make the store's next apply that starts an attempt (or, with ``outcome``, that records an
    attempt's outcome) fail with ``fault``, or (None) wait forever without writing; returns an
    event set once that apply was reached. Every other apply passes."""
    reached = asyncio.Event()
    apply = env.box.store.apply

    def writes_attempt(change: object) -> bool:
        if outcome:
            return isinstance(change, Settle) and change.attempt is not None
        return isinstance(change, Start)

    async def faulty(changes, *, claim=None):
        if any(writes_attempt(change) for change in changes) and not reached.is_set():
            reached.set()
            if fault is not None:
                raise fault
            await asyncio.Event().wait()
        return await apply(changes, claim=claim)

    env.box.store.apply = faulty  # type: ignore[method-assign]
    return reached


async def test_a_failed_attempt_start_is_recorded_as_not_submitted(env: SenderEnv, receiver: Receiver):
    receiver.script("/hook", Reply(200))
    await env.destination(f"{receiver.url}/hook", idempotent=False)
    await env.enqueue("a1")
    fault_attempt_write(env, StoreUnavailable("disk I/O error"))
    assert await env.worker(worker_id="w1").run_once() == 1

    assert receiver.requests() == []
    intent = await env.box.get("a1")
    assert intent.status is Status.PENDING and intent.attempts == 1  # retried: nothing went out
    [attempt] = (await env.box.history("a1")).attempts
    assert (attempt.submission, attempt.outcome) == (Submission.NOT_SUBMITTED, Outcome.RETRYABLE)
    assert "before" in attempt.error and "sent" in attempt.error


async def test_stopping_while_the_attempt_start_is_written_records_not_submitted(open_env, receiver: Receiver):
    env: SenderEnv = await open_env(drain_seconds=0)
    receiver.script("/hook", Reply(200))
    await env.destination(f"{receiver.url}/hook", idempotent=False)
    await env.enqueue("a1")
    reached = fault_attempt_write(env, None)
    async with env.running(worker_id="w1"):
        await asyncio.wait_for(reached.wait(), 10)
    # the worker stopped with no drain time: the stalled start was cut short

    assert receiver.requests() == []
    intent = await env.box.get("a1")
    assert intent.status is Status.PENDING and intent.lease_owner is None
    [attempt] = (await env.box.history("a1")).attempts
    assert (attempt.submission, attempt.outcome) == (Submission.NOT_SUBMITTED, Outcome.RETRYABLE)


async def test_an_outcome_write_that_failed_once_is_recorded_with_the_real_result(env: SenderEnv, receiver: Receiver):
    receiver.script("/hook", Reply(200, headers={"External-Id": "r-1"}))
    await env.destination(f"{receiver.url}/hook", idempotent=False)
    await env.enqueue("a1")
    fault_attempt_write(env, StoreUnavailable("database is locked"), outcome=True)
    assert await env.worker(worker_id="w1").run_once() == 1

    assert len(receiver.requests("/hook")) == 1
    intent = await env.box.get("a1")
    assert intent.status is Status.DELIVERED and intent.attempts == 1  # the 200 was not thrown away
    [attempt] = (await env.box.history("a1")).attempts
    assert (attempt.submission, attempt.outcome, attempt.external_id) == (
        Submission.SUBMITTED, Outcome.DELIVERED, "r-1")


def fail_once(env: SenderEnv, method: str, fault: BaseException) -> list[int]:
    """Make the store's ``method`` raise ``fault`` on its first call only; returns a list that
    counts the calls that went through."""
    real = getattr(env.box.store, method)
    passed: list[int] = []

    async def flaky(*args, **kwargs):
        if not passed and not getattr(flaky, "failed", False):
            flaky.failed = True  # type: ignore[attr-defined]
            raise fault
        passed.append(1)
        return await real(*args, **kwargs)

    setattr(env.box.store, method, flaky)
    return passed


async def test_a_failed_cycle_is_retried_and_the_worker_keeps_running(open_env, receiver: Receiver):
    env: SenderEnv = await open_env(poll_seconds=0.05)
    receiver.script("/hook", Reply(200))
    await env.destination(f"{receiver.url}/hook")
    await env.enqueue("a1")
    passed = fail_once(env, "apply", StoreUnavailable("database is locked"))
    async with env.running(worker_id="w1") as (_, task):
        assert await eventually(lambda: env.status_is("a1", Status.DELIVERED))
        assert not task.done()  # the failed cycle (its claim) did not end the worker
    assert passed  # the claim was made again after the fault


async def test_a_failed_heartbeat_is_retried_so_the_lease_is_kept(open_env, receiver: Receiver):
    env: SenderEnv = await open_env(lease_seconds=0.3)
    gate = await held_send(env, receiver)
    renewed = fail_once(env, "renew_leases", StoreUnavailable("database is locked"))
    async with env.running(worker_id="w1"):
        try:
            await receiver.wait_for_requests(1, "/hook")
            # heartbeats come every 0.1 s: the first fails, later ones must not stop
            assert await eventually(lambda: bool(renewed)), "no heartbeat renewed the lease after the failed one"
        finally:
            gate.open()
    assert (await env.box.get("a1")).status is Status.DELIVERED


async def test_an_error_before_the_attempt_gives_the_intent_back_with_a_backoff(env: SenderEnv, receiver: Receiver):
    receiver.script("/hook", Reply(200))
    await env.destination(f"{receiver.url}/hook")
    await env.enqueue("a1")
    fail_once(env, "get_destination", RuntimeError("a bug of ours"))
    assert await env.worker(worker_id="w1").run_once() == 1

    assert receiver.requests() == []
    intent = await env.box.get("a1")
    assert intent.status is Status.PENDING and intent.attempts == 0
    assert await env.due_in("a1") > 0  # not claimed again at once, in a loop, while the bug lasts
    released = only(await env.box.history("a1"), "released")
    assert released.reason == "RuntimeError: a bug of ours before an attempt started"


async def test_one_sweep_recovers_every_expired_lease_batch_after_batch(env: SenderEnv, monkeypatch):
    import sender.worker

    monkeypatch.setattr(sender.worker, "SWEEP_BATCH", 2)
    await env.destination("http://127.0.0.1:9/hook")
    for n in range(5):
        await env.enqueue(f"a{n}")
    now = env.clock.now()
    claimed = await env.box.store.claim("vanished", now=now, lease_until=now + timedelta(seconds=30), limit=5)
    assert len(claimed) == 5  # a worker claimed them, then vanished before any attempt
    env.clock.advance(31)
    assert await env.worker(worker_id="w2").sweep() == 5
    for n in range(5):
        intent = await env.box.get(f"a{n}")
        assert intent.status is Status.PENDING and intent.lease_owner is None and intent.fence == 2


async def test_an_expired_lease_the_sweeper_cannot_settle_leaves_the_others_recovered(env: SenderEnv, caplog):
    """Two workers' leases expired with their attempts in flight. The first one's destination
    holds secrets sealed under a key this process's key file lacks (a row copied from another
    database, say), so reading it raised SecretsKeyError: the whole sweep failed on it, at every
    round, and no expired lease behind it was ever recovered, for any destination."""
    await env.destination("http://127.0.0.1:9/locked", "locked")
    await env.destination("http://127.0.0.1:9/hook", "hook")
    await env.enqueue("l1", destination="locked")
    await env.enqueue("h1", destination="hook")
    now = env.clock.now()
    for action_id, lease in (("l1", 30), ("h1", 31)):  # l1's runs out first: the sweep reads it first
        [claimed] = await env.box.store.claim("vanished", now=now, lease_until=now + timedelta(seconds=lease), limit=1)
        assert claimed.action_id == action_id
        attempt = Attempt(f"att-{action_id}", 1, claimed.fence, "vanished", now, *[None] * 8)
        started = Event(EventKind.ATTEMPT_STARTED, now, "vanished", None, {"attempt_id": attempt.attempt_id})
        assert (await env.box.store.apply([Start(claimed.key, claimed.fence, attempt, started)])).results == [None]
    assert env.path is not None
    with sqlite3.connect(env.path, timeout=10) as conn:
        conn.execute("""UPDATE destinations SET secrets = '{"alg": "A256GCM", "key": "0000", "sealed": "AAAA"}'
                        WHERE id = 'locked'""")
    conn.close()
    env.clock.advance(32)

    assert await env.worker(worker_id="w2").sweep() == 1
    recovered = await env.box.history("h1")
    assert recovered.intent.status is Status.PENDING and recovered.intent.fence == 2  # may have been sent: retried
    assert [a.submission for a in recovered.attempts] == [Submission.MAYBE_SUBMITTED]
    left = await env.box.get("l1")
    assert left.status is Status.LEASED and left.fence == 1  # read again at the next round
    assert "expired lease left for a later sweep: the secrets of destination 'locked' are sealed under key 0000" \
        in caplog.text


async def test_a_receiver_that_stops_answering_is_paused_and_the_others_go_on(
        open_env, receiver: Receiver, closed_port: int):
    env: SenderEnv = await open_env(circuit_failures=3, circuit_pause_seconds=30)
    receiver.script("/hook", Reply(200))
    await env.destination(f"http://127.0.0.1:{closed_port}/hook", "down")
    await env.destination(f"{receiver.url}/hook", "up")
    for n in range(6):
        await env.enqueue(f"down-{n}", destination="down")
    await env.enqueue("up-0", destination="up")
    assert await env.worker(worker_id="w1", concurrency=1).run_once(limit=7) == 7  # one send at a time
    assert env.box.metrics.registry.get_sample_value("outbox_paused_destinations") == 1

    assert (await env.box.get("up-0")).status is Status.DELIVERED
    tried, paused = [], []
    for n in range(6):
        history = await env.box.history(f"down-{n}")
        assert history.intent.status is Status.PENDING
        (tried if history.attempts else paused).append(history)
    assert len(tried) == 3 and len(paused) == 3  # three refused in a row, then no more sends
    for history in tried:
        [attempt] = history.attempts
        assert attempt.submission is Submission.NOT_SUBMITTED
    resume = env.clock.now() + timedelta(seconds=30)
    for history in paused:
        released = only(history, "released")
        assert "'down' is not answering (3 sends in a row got no answer)" in released.reason
        assert resume <= history.intent.next_attempt_at <= resume + timedelta(seconds=30)


async def test_no_send_starts_on_a_lease_the_store_stopped_confirming(open_env, receiver: Receiver, monkeypatch):
    """Renewals fail (the database stops answering them): an intent still waiting for a send
    slot is not sent once less than a third of its lease is confirmed; nothing is written for
    it, and the sweeper later gives it back untouched."""
    env: SenderEnv = await open_env(lease_seconds=0.6)
    gate = Gate()
    receiver.script("/hook", Reply(200, gate=gate), Reply(200))
    await env.destination(f"{receiver.url}/hook", timeout_seconds=10)
    await env.enqueue("a1")
    await env.enqueue("a2")
    renew = env.box.store.renew_leases
    failing = False

    async def renew_leases(held, until):
        if failing:
            raise StoreUnavailable("the database is not answering")
        return await renew(held, until)

    monkeypatch.setattr(env.box.store, "renew_leases", renew_leases)
    async with env.running(concurrency=1):
        assert await eventually(lambda: len(receiver.requests("/hook")) == 1)  # a1 holds the only slot
        failing = True
        await asyncio.sleep(0.5)  # a few failed heartbeats
        env.clock.advance(0.5)  # a2's lease, confirmed at its claim, now has 0.1 s of 0.6 left
        gate.open()
        assert await eventually(lambda: env.status_is("a1", Status.DELIVERED))
        await asyncio.sleep(0.3)
        assert len(receiver.requests("/hook")) == 1  # a2 was not sent
        assert (await env.box.history("a2")).attempts == []
        failing = False
        env.clock.advance(1)  # a2's lease runs out; the sweeper gives it back and it is sent
        assert await eventually(lambda: env.status_is("a2", Status.DELIVERED))
    assert [a.number for a in (await env.box.history("a2")).attempts] == [1]
    assert "lease_expired" in kinds(await env.box.history("a2"))


async def test_a_lease_the_sweeper_recovered_is_renewed_when_the_same_worker_claims_it(open_env, receiver: Receiver):
    """The sweeper settles other workers' leases with the worker's own code path; marking them
    'settling' (not to be renewed) must not outlive that, or this worker would never renew the
    lease when it later claims the intent itself."""
    env: SenderEnv = await open_env(lease_seconds=30)
    await env.destination(f"{receiver.url}/hook")
    await env.enqueue("a1")
    now = env.clock.now()
    assert len(await env.box.store.claim("dead-worker", now=now, lease_until=now + timedelta(seconds=30),
                                         limit=1)) == 1
    env.clock.advance(31)
    worker = env.worker()
    assert await worker.sweep() == 1
    assert await env.status_is("a1", Status.PENDING)
    assert not worker.leases  # nothing of another worker's is left for this one's heartbeat
