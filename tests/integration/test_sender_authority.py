"""Authority re-checked right before each send: grants, an HTTP policy endpoint, Python functions."""

from __future__ import annotations

from datetime import timedelta

import pytest

from outbox import Status
from outbox.grants import GrantSpec
from sender import AuthorityRequest, CallableAuthority, Decision, Verdict

from ..receiver import Receiver, Reply
from .conftest import SenderEnv


def kinds(history) -> list[str]:
    return [event.kind for event in history.events]


def only(history, kind: str):
    [event] = [event for event in history.events if event.kind == kind]
    return event


def deny_shop(request: AuthorityRequest) -> bool:
    """A policy for ``authority = "python:…"``: every scope but shop."""
    return request.scope != "shop"


# -- grants ------------------------------------------------------------------------------------


async def test_a_grant_deleted_while_intents_wait_revokes_them_unsent(env: SenderEnv, receiver: Receiver):
    receiver.script("/hook", Reply(200))
    await env.destination(f"{receiver.url}/hook")
    for n in range(3):
        await env.enqueue(f"a{n}")
    await env.box.delete_grant("g1")

    assert await env.worker().run_once() == 3

    reason = "no live grant lets scope 'acme' reach destination 'hook'"
    for n in range(3):
        intent = await env.box.get(f"a{n}")
        assert intent.status is Status.REVOKED and intent.attempts == 0
        assert intent.last_error == reason
        history = await env.box.history(f"a{n}")
        assert history.attempts == []
        assert kinds(history) == ["enqueued", "leased", "authority_checked", "revoked"]
        checked = only(history, "authority_checked")
        assert checked.reason == reason
        assert checked.data == {"verdict": "deny", "provider": "grants", "revision": None}
        assert only(history, "revoked").reason == reason
    assert receiver.requests() == []
    env.clock.advance(3600)
    assert await env.worker().run_once() == 0
    assert receiver.requests() == []


async def test_grants_are_checked_at_send_time_not_enqueue_time(env: SenderEnv, receiver: Receiver):
    receiver.script("/hook", Reply(200))
    await env.destination(f"{receiver.url}/hook")
    await env.destination(f"{receiver.url}/hook", "other")
    # only this destination, and only for 10 more seconds (by the outbox's clock)
    await env.box.delete_grant("g1")
    await env.box.put_grant("g2", GrantSpec(scope="acme", destination="hook",
                                            expires_at=env.clock.now() + timedelta(seconds=10)))
    await env.enqueue("now")
    await env.enqueue("elsewhere", destination="other")
    await env.enqueue("later", not_before=env.clock.now() + timedelta(seconds=20))
    worker = env.worker()
    assert await worker.run_once() == 2
    assert (await env.box.get("now")).status is Status.DELIVERED
    started = only(await env.box.history("now"), "attempt_started")
    assert started.data["authority"] == "grant 'g2'" and started.data["authority_revision"] == "g2@1"
    assert (await env.box.get("elsewhere")).status is Status.REVOKED

    env.clock.advance(20)
    assert await worker.run_once() == 1
    later = await env.box.get("later")
    assert later.status is Status.REVOKED  # the grant had expired by the time it was due
    assert [r.headers["idempotency-key"] for r in receiver.requests()] == ["acme/now"]


# -- an HTTP policy endpoint -------------------------------------------------------------------


async def test_an_http_policy_endpoint_allows_and_denies(open_env, start_receiver):
    hooks, policy = start_receiver(), start_receiver()
    hooks.script("/hook", Reply(200))

    def answer(request) -> Reply:
        asked = request.json()
        if asked["scope"] == "acme":
            return Reply(200, body={"allow": True, "reason": "acme is a customer", "revision": 7})
        return Reply(200, body={"allow": False, "reason": f"{asked['scope']} is suspended"})

    policy.script("/policy", answer)
    env: SenderEnv = await open_env(authority=f"{policy.url}/policy", grant=False)
    await env.destination(f"{hooks.url}/hook")
    await env.enqueue("a-ok", scope="acme")
    await env.enqueue("a-no", scope="shop")

    assert await env.worker().run_once() == 2

    assert (await env.box.get("a-ok")).status is Status.DELIVERED
    started = only(await env.box.history("a-ok"), "attempt_started")
    assert started.data["authority"] == "acme is a customer" and started.data["authority_revision"] == "7"
    denied = await env.box.get("a-no")
    assert denied.status is Status.REVOKED and denied.last_error == "shop is suspended"
    history = await env.box.history("a-no")
    assert history.attempts == []
    assert only(history, "authority_checked").data == {"verdict": "deny", "provider": "http", "revision": None}

    assert [r.headers["idempotency-key"] for r in hooks.requests()] == ["acme/a-ok"]
    asked = sorted((r.json() for r in policy.requests("/policy")), key=lambda b: b["action_id"])
    assert asked == [
        {"scope": "shop", "channel": "webhook", "destination": "hook", "action_id": "a-no"},
        {"scope": "acme", "channel": "webhook", "destination": "hook", "action_id": "a-ok"},
    ]
    assert all(r.method == "POST" for r in policy.requests())


async def test_a_policy_endpoint_that_is_down_holds_the_send_back(open_env, receiver: Receiver, closed_port: int):
    receiver.script("/hook", Reply(200))
    env: SenderEnv = await open_env(authority=f"http://127.0.0.1:{closed_port}/policy", grant=False)
    await env.destination(f"{receiver.url}/hook")
    await env.enqueue("a1")
    worker = env.worker()

    for claims in (1, 2, 3):
        assert await worker.run_once() == 1
        intent = await env.box.get("a1")
        assert intent.status is Status.PENDING and intent.attempts == 0  # not revoked, not sent
        # the wait backs off over a lasting outage: the fence counts the claims
        assert intent.fence == claims
        assert 2 ** (claims - 1) / 2 <= await env.due_in("a1") <= 2 ** (claims - 1)
        history = await env.box.history("a1")
        assert history.attempts == [] and kinds(history)[-2:] == ["authority_checked", "released"]
        checked = [e for e in history.events if e.kind == "authority_checked"][-1]
        assert checked.data["verdict"] == "unavailable" and checked.data["provider"] == "http"
        assert checked.reason.startswith("policy endpoint unreachable")
        await env.advance_until_due("a1")
    assert receiver.requests() == []


@pytest.mark.parametrize("undecided", [
    Reply(503),
    Reply(429, headers={"Retry-After": "1"}),
    Reply(200, body={"verdict": "yes"}),          # no 'allow'
    Reply(200, body={"allow": "yes"}),            # not a boolean
    Reply(403, body={"allow": True}),             # an error status, whatever it says
    Reply(200, body="not json"),
], ids=["503", "429", "no-allow", "allow-not-bool", "403-with-allow", "not-json"])
async def test_a_policy_that_cannot_decide_releases_then_a_later_answer_counts(
        open_env, start_receiver, undecided: Reply):
    hooks, policy = start_receiver(), start_receiver()
    hooks.script("/hook", Reply(200))
    policy.script("/policy", undecided, Reply(200, body={"allow": True}))
    env: SenderEnv = await open_env(authority=f"{policy.url}/policy", grant=False)
    await env.destination(f"{hooks.url}/hook")
    await env.enqueue("a1")
    worker = env.worker()

    await worker.run_once()
    intent = await env.box.get("a1")
    assert intent.status is Status.PENDING and intent.attempts == 0
    assert kinds(await env.box.history("a1"))[-1] == "released"
    assert hooks.requests() == []

    await env.advance_until_due("a1")
    await worker.run_once()
    assert (await env.box.get("a1")).status is Status.DELIVERED
    assert len(hooks.requests()) == 1 and len(policy.requests()) == 2


# -- Python callables ----------------------------------------------------------------------------


async def test_a_python_policy_function(open_env, receiver: Receiver):
    receiver.script("/hook", Reply(200))
    env: SenderEnv = await open_env(grant=False)  # the function decides, not the grants table
    await env.destination(f"{receiver.url}/hook")
    await env.enqueue("a-ok")
    await env.enqueue("a-no")
    asked: list[AuthorityRequest] = []

    def policy(request: AuthorityRequest) -> bool:
        asked.append(request)
        return request.action_id != "a-no"

    assert await env.worker(authority=CallableAuthority(policy)).run_once() == 2
    assert (await env.box.get("a-ok")).status is Status.DELIVERED
    denied = await env.box.get("a-no")
    assert denied.status is Status.REVOKED and denied.last_error == "denied by policy function"
    assert only(await env.box.history("a-no"), "authority_checked").data["provider"] == "python"
    assert sorted(asked, key=lambda r: r.action_id) == [
        AuthorityRequest("acme", "webhook", "hook", "a-no"), AuthorityRequest("acme", "webhook", "hook", "a-ok")]
    assert [r.headers["idempotency-key"] for r in receiver.requests()] == ["acme/a-ok"]


async def test_an_async_policy_returning_decisions_and_one_that_raises(open_env, receiver: Receiver):
    receiver.script("/hook", Reply(200))
    env: SenderEnv = await open_env(grant=False)
    await env.destination(f"{receiver.url}/hook")
    await env.enqueue("a1")

    async def rich(request: AuthorityRequest) -> Decision:
        return Decision(Verdict.DENY, f"{request.scope} over quota", "quota", "q-42")

    def broken(request: AuthorityRequest) -> bool:
        raise RuntimeError("policy store offline")

    await env.worker(authority=CallableAuthority(broken)).run_once()
    intent = await env.box.get("a1")
    assert intent.status is Status.PENDING  # a broken policy could not decide: not revoked
    checked = only(await env.box.history("a1"), "authority_checked")
    assert checked.data["verdict"] == "unavailable" and "policy store offline" in checked.reason

    await env.advance_until_due("a1")
    await env.worker(authority=CallableAuthority(rich)).run_once()
    intent = await env.box.get("a1")
    assert intent.status is Status.REVOKED and intent.last_error == "acme over quota"
    checked = [e for e in (await env.box.history("a1")).events if e.kind == "authority_checked"][-1]
    assert checked.data == {"verdict": "deny", "provider": "quota", "revision": "q-42"}
    assert receiver.requests() == []


async def test_a_python_policy_named_in_the_settings(open_env, receiver: Receiver):
    receiver.script("/hook", Reply(200))
    env: SenderEnv = await open_env(grant=False,
                                    authority=f"python:{__name__}:deny_shop")
    await env.destination(f"{receiver.url}/hook")
    await env.enqueue("a-acme", scope="acme")
    await env.enqueue("a-shop", scope="shop")
    await env.worker().run_once()
    assert (await env.box.get("a-acme")).status is Status.DELIVERED
    assert (await env.box.get("a-shop")).status is Status.REVOKED
    assert [r.headers["idempotency-key"] for r in receiver.requests()] == ["acme/a-acme"]


async def test_a_revocation_takes_effect_within_authority_seconds(open_env, receiver: Receiver):
    import asyncio

    env: SenderEnv = await open_env(authority_seconds=1.0)
    receiver.script("/hook", Reply(200))
    await env.destination(f"{receiver.url}/hook")
    for n in range(3):
        await env.enqueue(f"a{n}")
    worker = env.worker()
    assert await worker.run_once(limit=1) == 1  # allowed, and the decision is kept 1 s
    await env.box.delete_grant("g1")
    assert await worker.run_once(limit=1) == 1  # within 1 s: the kept allow is still used
    await asyncio.sleep(1.05)
    assert await worker.run_once(limit=1) == 1  # past it: the provider is asked, and says no
    statuses = sorted([(await env.box.get(f"a{n}")).status.value for n in range(3)])
    assert statuses == ["delivered", "delivered", "revoked"]
    assert len(receiver.requests("/hook")) == 2
