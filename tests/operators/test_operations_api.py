"""Operators over HTTP: replay, resolve, cancel, approve, reject and bulk replay, with tokens of
each role, against a real outbox, the real API (uvicorn on loopback) and a real receiver."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from outbox import ManualClock, Status

from ..conftest import snapshot
from ..problems import assert_problem
from ..receiver import Reply
from .conftest import OpenOps, Ops, Switch

# -- replay ------------------------------------------------------------------------------------


async def test_replay_of_a_dead_letter_records_who_and_why_and_it_is_delivered(ops: Ops):
    switch = await ops.dead_letters("dead-1")
    async with ops.client(ops.operator) as c:
        replayed = await c.post("/v1/intents/dead-1/replay", json={"reason": "receiver fixed (INC-7)"})
    assert replayed.status_code == 200, replayed.text
    body = replayed.json()
    assert body["action_id"] == "dead-1" and body["status"] == "pending"
    assert body["last_error"] is None
    assert body["max_attempts"] > body["attempt_count"] == 1  # a fresh budget
    event = body["events"][-1]
    assert event["kind"] == "replayed"
    assert event["actor"] == ops.operator_actor and event["reason"] == "receiver fixed (INC-7)"
    assert event["data"] == {"from": "dead", "accept_duplicate_risk": False}

    switch.fix()
    await ops.deliver(["dead-1"])
    intent = await ops.box.get("dead-1")
    assert intent.status is Status.DELIVERED and intent.attempts == 2
    # the same action_id is the Idempotency-Key of both sends
    assert switch.answers == [("dead-1", 503), ("dead-1", 200)]
    [first, second] = (await ops.box.history("dead-1")).attempts
    assert first.attempt_id != second.attempt_id and second.external_id == "rcpt-dead-1"


async def test_replay_with_the_embedded_worker_delivers_the_dead_letter(open_ops: OpenOps):
    ops = await open_ops(worker=True)
    switch = Switch()
    ops.receiver.script("/flaky", switch)
    await ops.destination("hook", "/flaky")
    async with ops.client(ops.producer) as producer:
        created = await producer.post("/v1/intents", json={
            "action_id": "emb-1", "scope": "acme", "destination": "hook", "payload": {"n": 1}, "max_attempts": 1})
        assert created.status_code == 201
        dead = (await producer.get("/v1/intents/emb-1", params={"wait": 20})).json()
    assert dead["status"] == "dead" and "attempts exhausted" in dead["last_error"]
    switch.fix()
    async with ops.client(ops.operator) as c:
        assert (await c.post("/v1/intents/emb-1/replay", json={"reason": "fixed"})).status_code == 200
        delivered = (await c.get("/v1/intents/emb-1", params={"wait": 20})).json()
    assert delivered["status"] == "delivered" and delivered["settled"] is True
    assert [e["kind"] for e in delivered["events"]].count("replayed") == 1
    assert switch.successes() == {"emb-1": 1}


async def test_replay_is_refused_for_pending_delivered_and_missing_intents(ops: Ops, tmp_path):
    ops.receiver.script("/ok", Reply(200))
    await ops.destination("hook", "/ok")
    await ops.enqueue("done-1")
    await ops.deliver(["done-1"])
    assert await ops.status("done-1") is Status.DELIVERED
    await ops.enqueue("wait-1")  # no worker runs again: it stays pending
    before = snapshot(tmp_path / "ops.db")
    async with ops.client(ops.operator) as c:
        assert_problem(await c.post("/v1/intents/wait-1/replay", json={"reason": "x"}), 409,
                       "illegal-transition", "pending")
        assert_problem(await c.post("/v1/intents/done-1/replay", json={"reason": "x"}), 409,
                       "illegal-transition", "delivered")
        assert_problem(await c.post("/v1/intents/nope-1/replay", json={"reason": "x"}), 404, "not-found")
    assert snapshot(tmp_path / "ops.db") == before
    assert await ops.status("wait-1") is Status.PENDING
    assert "replayed" not in [e.kind for e in await ops.events("done-1")]


async def test_replay_of_a_revoked_intent_waits_for_authority(ops: Ops):
    ops.receiver.script("/ok", Reply(200))
    await ops.destination("hook", "/ok")
    await ops.enqueue("rev-1", scope="globex")  # no grant lets globex reach anything
    await ops.deliver(["rev-1"])
    revoked = await ops.box.get("rev-1")
    assert revoked.status is Status.REVOKED and "no live grant" in revoked.last_error
    events_before = await ops.events("rev-1")

    async with ops.client(ops.operator) as c:
        refused = await c.post("/v1/intents/rev-1/replay", json={"reason": "try again"})
        assert_problem(refused, 409, "authority-denied", "no live grant lets scope 'globex'")
        assert await ops.status("rev-1") is Status.REVOKED
        assert await ops.events("rev-1") == events_before  # a refused replay records nothing

        async with ops.client(ops.admin) as admin:
            granted = await admin.put("/v1/grants/globex-hook", json={"scope": "globex", "destination": "hook"})
            assert granted.status_code == 201, granted.text
        accepted = await c.post("/v1/intents/rev-1/replay", json={"reason": "granted in CHG-12"})
    assert accepted.status_code == 200, accepted.text
    body = accepted.json()
    assert body["status"] == "pending" and body["action_id"] == "rev-1"
    assert body["events"][-1]["data"]["from"] == "revoked"
    await ops.deliver(["rev-1"])
    assert await ops.status("rev-1") is Status.DELIVERED
    assert [r.headers["idempotency-key"] for r in ops.receiver.requests("/ok")] == ["globex/rev-1"]


async def test_replay_of_an_unknown_outcome_needs_accepting_the_duplicate_risk(ops: Ops):
    await ops.unknowns("unk-1")  # destination 'slow' does not declare idempotency
    [attempt] = (await ops.box.history("unk-1")).attempts
    assert attempt.submission.value == "maybe_submitted"
    async with ops.client(ops.operator) as c:
        refused = await c.post("/v1/intents/unk-1/replay", json={"reason": "receiver says no record"})
        assert_problem(refused, 409, "duplicate-risk", "does not declare idempotency")
        assert await ops.status("unk-1") is Status.UNKNOWN
        accepted = await c.post("/v1/intents/unk-1/replay",
                                json={"reason": "checked with the receiver", "accept_duplicate_risk": True})
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["events"][-1]["data"] == {"from": "unknown", "accept_duplicate_risk": True}
    await ops.deliver(["unk-1"])
    assert await ops.status("unk-1") is Status.DELIVERED
    assert len(ops.receiver.requests("/slow")) == 2


async def test_a_dead_letter_with_a_maybe_submitted_attempt_also_needs_accepting_the_risk(ops: Ops):
    # first attempt: read timeout (maybe submitted); on_unknown=always retries; second: 400, dead
    ops.receiver.script("/late-then-no", Reply(200, delay=2), Reply(400, body="no"))
    await ops.destination("risky", "/late-then-no", timeout_seconds=0.3, on_unknown="always")
    await ops.enqueue("risk-1", destination="risky", max_attempts=5)
    await ops.deliver(["risk-1"])
    assert await ops.status("risk-1") is Status.DEAD
    assert [a.submission.value for a in (await ops.box.history("risk-1")).attempts] == [
        "maybe_submitted", "submitted"]
    async with ops.client(ops.operator) as c:
        assert_problem(await c.post("/v1/intents/risk-1/replay", json={"reason": "again"}), 409,
                       "duplicate-risk", "may have taken effect")
        ok = await c.post("/v1/intents/risk-1/replay", json={"reason": "again", "accept_duplicate_risk": True})
    assert ok.status_code == 200 and ok.json()["status"] == "pending"


async def test_an_idempotent_destination_needs_no_duplicate_risk_acceptance(ops: Ops):
    # idempotent, but on_unknown=never: a timeout still ends unknown; the receiver dedupes
    await ops.unknowns("unk-2", destination="dedupe", idempotent=True, on_unknown="never")
    async with ops.client(ops.operator) as c:
        ok = await c.post("/v1/intents/unk-2/replay", json={"reason": "receiver dedupes on the key"})
    assert ok.status_code == 200, ok.text
    assert ok.json()["status"] == "pending"


# -- resolve -----------------------------------------------------------------------------------


async def test_resolve_settles_unknown_intents_with_evidence(ops: Ops):
    await ops.unknowns("res-delivered", "res-retry", "res-dead")
    async with ops.client(ops.operator) as c:
        delivered = await c.post("/v1/intents/res-delivered/resolve", json={
            "resolution": "delivered", "external_id": "inv-991", "reason": "the receiver shows inv-991"})
        retry = await c.post("/v1/intents/res-retry/resolve", json={
            "resolution": "retry", "reason": "the receiver has no record of it"})
        dead = await c.post("/v1/intents/res-dead/resolve", json={
            "resolution": "dead", "reason": "the customer withdrew the order"})
        assert_problem(await c.post("/v1/intents/res-delivered/resolve", json={
            "resolution": "dead", "reason": "twice"}), 409, "illegal-transition", "delivered")
        assert_problem(await c.post("/v1/intents/res-dead/resolve", json={
            "resolution": "maybe", "reason": "x"}), 422, "invalid-input", "resolution")

    for response in (delivered, retry, dead):
        assert response.status_code == 200, response.text
    assert delivered.json()["status"] == "delivered"
    event = delivered.json()["events"][-1]
    assert event["kind"] == "resolved" and event["actor"] == ops.operator_actor
    assert event["reason"] == "the receiver shows inv-991"
    assert event["data"] == {"resolution": "delivered", "external_id": "inv-991"}
    assert retry.json()["status"] == "pending"
    assert dead.json()["status"] == "dead" and dead.json()["events"][-1]["data"]["resolution"] == "dead"

    sent_before = len(ops.receiver.requests("/slow"))
    await ops.deliver(["res-retry"])
    assert await ops.status("res-retry") is Status.DELIVERED
    assert await ops.status("res-delivered") is Status.DELIVERED
    assert await ops.status("res-dead") is Status.DEAD
    assert [r.headers["idempotency-key"] for r in ops.receiver.requests("/slow")[sent_before:]] == ["acme/res-retry"]


# -- cancel ------------------------------------------------------------------------------------


async def test_cancel_withdraws_pending_and_held_intents_and_nothing_is_sent(ops: Ops):
    ops.receiver.script("/ok", Reply(200))
    await ops.destination("hook", "/ok")
    await ops.destination("approvals", "/ok", requires_approval=True)
    await ops.enqueue("can-pending")
    held = await ops.enqueue("can-held", destination="approvals")
    assert held.status is Status.HELD
    async with ops.client(ops.operator) as c:
        pending = await c.post("/v1/intents/can-pending/cancel", json={"reason": "duplicate order"})
        on_hold = await c.post("/v1/intents/can-held/cancel", json={"reason": "not needed"})
    assert pending.status_code == 200 and pending.json()["status"] == "cancelled"
    event = pending.json()["events"][-1]
    assert (event["kind"], event["actor"], event["reason"], event["data"]) == (
        "cancelled", ops.operator_actor, "duplicate order", {"from": "pending"})
    assert on_hold.status_code == 200 and on_hold.json()["status"] == "cancelled"
    assert on_hold.json()["events"][-1]["data"] == {"from": "held"}
    assert await ops.worker().run_once() == 0
    assert ops.receiver.requests("/ok") == []


async def test_cancel_is_refused_for_finished_intents_and_records_nothing(ops: Ops, tmp_path):
    ops.receiver.script("/ok", Reply(200))
    await ops.destination("hook", "/ok")
    await ops.enqueue("fin-delivered")
    await ops.deliver(["fin-delivered"])
    await ops.enqueue("fin-cancelled")
    async with ops.client(ops.operator) as c:
        assert (await c.post("/v1/intents/fin-cancelled/cancel", json={"reason": "first"})).status_code == 200
        before = snapshot(tmp_path / "ops.db")
        assert_problem(await c.post("/v1/intents/fin-delivered/cancel", json={"reason": "too late"}), 409,
                       "illegal-transition", "delivered")
        # cancelled is terminal: cancelling it again must be refused like any other illegal move,
        # and must neither append a second 'cancelled' event nor move updated_at (which would
        # postpone its pruning)
        again = await c.post("/v1/intents/fin-cancelled/cancel", json={"reason": "twice"})
        assert_problem(again, 409, "illegal-transition", "cancelled")
    assert snapshot(tmp_path / "ops.db") == before


# -- approve and reject ------------------------------------------------------------------------


async def test_approval_binds_the_payload_digest_and_the_worker_delivers_it(open_ops: OpenOps):
    ops = await open_ops(worker=True)
    ops.receiver.script("/ok", Reply(200, headers={"External-Id": "ok-1"}))
    await ops.destination("approvals", "/ok", requires_approval=True)
    async with ops.client(ops.producer) as producer:
        created = (await producer.post("/v1/intents", json={
            "action_id": "app-1", "scope": "acme", "destination": "approvals", "payload": {"wire": 5000}})).json()
    assert created["status"] == "held"
    digest = created["payload_digest"]
    async with ops.client(ops.operator) as c:
        wrong = await c.post("/v1/intents/app-1/approve", json={
            "payload_digest": "sha256:" + "0" * 64, "reason": "looks fine"})
        assert_problem(wrong, 422, "invalid-input", digest)
        for valid_seconds in (0, 30 * 86_400 + 1):
            assert_problem(await c.post("/v1/intents/app-1/approve", json={
                "payload_digest": digest, "reason": "x", "valid_seconds": valid_seconds}), 422, "invalid-input",
                "valid_seconds")
        assert await ops.status("app-1") is Status.HELD
        assert [e["kind"] for e in (await c.get("/v1/intents/app-1")).json()["events"]] == ["enqueued"]
        approved = await c.post("/v1/intents/app-1/approve", json={"payload_digest": digest, "reason": "CFO ok"})
        assert approved.status_code == 200, approved.text
        event = approved.json()["events"][-1]
        assert event["kind"] == "approved" and event["actor"] == ops.operator_actor and event["reason"] == "CFO ok"
        assert event["data"]["payload_digest"] == digest
        done = (await c.get("/v1/intents/app-1", params={"wait": 20})).json()
    assert done["status"] == "delivered"
    [request] = ops.receiver.requests("/ok")
    assert request.json() == {"wire": 5000} and request.headers["idempotency-key"] == "acme/app-1"


async def test_an_expired_approval_is_refused_at_send_time(open_ops: OpenOps):
    clock = ManualClock(datetime.now(UTC))
    ops = await open_ops(clock=clock)
    ops.receiver.script("/ok", Reply(200))
    await ops.destination("approvals", "/ok", requires_approval=True)
    held = await ops.enqueue("exp-1", destination="approvals")
    async with ops.client(ops.operator) as c:
        approved = await c.post("/v1/intents/exp-1/approve", json={
            "payload_digest": held.payload_digest, "reason": "ok for a minute", "valid_seconds": 60})
        assert approved.status_code == 200 and approved.json()["status"] == "pending"
    clock.advance(120)
    worker = ops.worker()
    assert await worker.run_once() == 1
    intent = await ops.box.get("exp-1")
    assert intent.status is Status.HELD
    assert intent.attempts == 0 and ops.receiver.requests("/ok") == []
    event = (await ops.events("exp-1"))[-1]
    assert event.kind == "held" and event.reason == "the approval expired before the send; approve it again"
    assert intent.last_error == event.reason

    # approved again, in time, it goes out
    async with ops.client(ops.operator) as c:
        again = await c.post("/v1/intents/exp-1/approve", json={
            "payload_digest": held.payload_digest, "reason": "re-approved", "valid_seconds": 60})
        assert again.status_code == 200, again.text
    clock.advance(30)
    await ops.deliver(["exp-1"], worker=worker)
    assert await ops.status("exp-1") is Status.DELIVERED
    assert len(ops.receiver.requests("/ok")) == 1


async def test_reject_cancels_a_held_intent_for_good(ops: Ops):
    ops.receiver.script("/ok", Reply(200))
    await ops.destination("approvals", "/ok", requires_approval=True)
    await ops.enqueue("rej-1", destination="approvals")
    await ops.destination("hook", "/ok")
    await ops.enqueue("rej-pending")
    async with ops.client(ops.operator) as c:
        rejected = await c.post("/v1/intents/rej-1/reject", json={"reason": "not what we agreed"})
        assert_problem(await c.post("/v1/intents/rej-pending/reject", json={"reason": "x"}), 409,
                       "illegal-transition", "held")
        assert_problem(await c.post("/v1/intents/rej-pending/approve", json={
            "payload_digest": "sha256:00", "reason": "x"}), 409, "illegal-transition", "held")
    assert rejected.status_code == 200 and rejected.json()["status"] == "cancelled"
    event = rejected.json()["events"][-1]
    assert (event["kind"], event["actor"], event["reason"]) == ("rejected", ops.operator_actor, "not what we agreed")
    await ops.deliver(["rej-pending"])
    assert await ops.status("rej-1") is Status.CANCELLED
    assert [r.headers["idempotency-key"] for r in ops.receiver.requests("/ok")] == ["acme/rej-pending"]


# -- roles and input ---------------------------------------------------------------------------


async def test_roles_and_reasons_are_checked(ops: Ops):
    await ops.dead_letters("role-1")
    spec = {"url": ops.receiver.url + "/x", "secret": "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODk="}
    async with ops.client(ops.producer) as producer:
        for verb in ("replay", "cancel", "reject"):
            assert_problem(await producer.post(f"/v1/intents/role-1/{verb}", json={"reason": "mine"}), 403,
                           "forbidden", "producer")
        assert_problem(await producer.post("/v1/replay", json={"reason": "all", "dry_run": True}), 403, "forbidden")
    async with ops.client(None) as anonymous:
        assert_problem(await anonymous.post("/v1/intents/role-1/replay", json={"reason": "x"}), 401,
                       "unauthenticated")
    async with ops.client(ops.operator) as operator:
        assert_problem(await operator.put("/v1/destinations/other", json=spec), 403, "forbidden", "admin")
        assert_problem(await operator.delete("/v1/destinations/hook"), 403, "forbidden", "admin")
        assert_problem(await operator.put("/v1/grants/g9", json={"scope": "x", "destination": "*"}), 403,
                       "forbidden", "admin")
        assert_problem(await operator.post("/v1/intents/role-1/replay", json={}), 422, "invalid-input", "reason")
        assert_problem(await operator.post("/v1/intents/role-1/replay", json={"reason": ""}), 422,
                       "invalid-input", "reason")
        assert_problem(await operator.post("/v1/intents/role-1/replay", json={"reason": "   "}), 422,
                       "invalid-input", "reason")
        assert_problem(await operator.post("/v1/replay", json={"dry_run": True}), 422, "invalid-input", "reason")
    assert await ops.status("role-1") is Status.DEAD
    async with ops.client(ops.admin) as admin:  # an admin may do what an operator may
        ok = await admin.post("/v1/intents/role-1/replay", json={"reason": "admin did it"})
    assert ok.status_code == 200 and ok.json()["events"][-1]["actor"].startswith("token:")


# -- bulk replay -------------------------------------------------------------------------------


async def test_bulk_replay_dry_run_changes_nothing_and_the_real_run_replays(ops: Ops, tmp_path):
    await ops.dead_letters("bulk-1", "bulk-2", "bulk-3")
    await ops.enqueue("bulk-rev", scope="globex")
    await ops.deliver(["bulk-rev"])
    assert await ops.status("bulk-rev") is Status.REVOKED
    await ops.enqueue("bulk-pending")  # not replayable; stays as it is
    before = snapshot(tmp_path / "ops.db")
    async with ops.client(ops.operator) as c:
        dry = await c.post("/v1/replay", json={"reason": "receiver fixed", "filter": {"status": ["dead"]}})
        assert dry.status_code == 200, dry.text
        assert dry.json()["dry_run"] is True and dry.json()["matched"] == 3 and dry.json()["replayed"] == 0
        assert sorted(dry.json()["action_ids"]) == ["bulk-1", "bulk-2", "bulk-3"]
        assert snapshot(tmp_path / "ops.db") == before

        everything = (await c.post("/v1/replay", json={"reason": "r", "dry_run": True})).json()
        assert sorted(everything["action_ids"]) == ["bulk-1", "bulk-2", "bulk-3", "bulk-rev"]
        assert_problem(await c.post("/v1/replay", json={"reason": "r", "filter": {"status": ["pending"]}}), 422,
                       "invalid-input", "dead, revoked or unknown")
        assert snapshot(tmp_path / "ops.db") == before

        real = await c.post("/v1/replay", json={"reason": "receiver fixed", "dry_run": False,
                                                "filter": {"status": ["dead"], "destination": "hook"}})
    assert real.status_code == 200, real.text
    assert real.json()["replayed"] == 3 and real.json()["refused"] == {}
    for action_id in ("bulk-1", "bulk-2", "bulk-3"):
        intent = await ops.box.get(action_id)
        assert intent.status is Status.PENDING
        event = (await ops.events(action_id))[-1]
        assert (event.kind, event.actor, event.reason) == ("replayed", ops.operator_actor, "receiver fixed")
    assert await ops.status("bulk-rev") is Status.REVOKED
    assert await ops.status("bulk-pending") is Status.PENDING


async def test_bulk_replay_reports_what_authority_still_refuses(ops: Ops):
    ops.receiver.script("/ok", Reply(200))
    await ops.destination("hook", "/ok")
    await ops.enqueue("ref-1", scope="globex")
    await ops.enqueue("ref-2", scope="globex")
    await ops.deliver(["ref-1", "ref-2"])
    async with ops.client(ops.operator) as c:
        result = (await c.post("/v1/replay", json={"reason": "r", "dry_run": False})).json()
    assert result["matched"] == 2 and result["replayed"] == 0
    assert set(result["refused"]) == {"ref-1", "ref-2"}
    assert all("no live grant" in why for why in result["refused"].values())
    assert await ops.status("ref-1") is Status.REVOKED


async def test_bulk_replay_of_a_thousand_dead_letters_delivers_each_exactly_once(ops: Ops):
    started = time.monotonic()
    switch = Switch()
    ops.receiver.script("/flaky", switch)
    await ops.destination("hook", "/flaky", timeout_seconds=5)
    ids = [f"storm-{n:04d}" for n in range(1000)]
    await ops.box.enqueue_many({"destination": "hook", "scope": "acme", "action_id": i, "payload": {"n": i},
                                "max_attempts": 1} for i in ids)
    worker = ops.worker(concurrency=100)
    await ops.deliver(ids, worker=worker, timeout=60)
    counts = {s: n for s, _, n in await ops.box.store.count_by_status()}
    assert counts == {"dead": 1000}, counts
    failures = len(switch.answers)
    assert failures == 1000 and switch.successes() == {}

    switch.fix()
    async with ops.client(ops.operator) as c:
        result = await c.post("/v1/replay", json={"reason": "receiver recovered", "dry_run": False,
                                                  "filter": {"status": ["dead"], "destination": "hook"}})
    assert result.status_code == 200, result.text
    assert result.json()["matched"] == 1000 and result.json()["replayed"] == 1000 and result.json()["refused"] == {}

    await ops.deliver(ids, worker=worker, timeout=60)
    counts = {s: n for s, _, n in await ops.box.store.count_by_status()}
    assert counts == {"delivered": 1000}, counts
    after_recovery = switch.answers[failures:]
    assert len(after_recovery) == 1000  # no extra sends at all
    assert switch.successes() == dict.fromkeys(ids, 1)
    assert time.monotonic() - started < 60
