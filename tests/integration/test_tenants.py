"""Tenants serve themselves: two tenants of one service, on each store, each register their own
endpoint through the API (a real uvicorn with its embedded sender), receive their own events only
(signatures checked by a real receiver with the secret each was shown once), see only their own
deliveries, replay their own dead letter, and never learn of the other's ids. Beside them, the
guards a tenant's destination gets (channels, private networks, approvals, limits) and the grants
that cannot widen one."""

from __future__ import annotations

import base64
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import httpx
import pytest

from outbox import DestinationSpec, ManualClock, NotFound, Outbox, Role, Settings, Status, Submission
from outbox.grants import GrantSpec
from outbox.tenants import new_destination_id
from receivers import verify_signature
from receivers.wire import InvalidSignature
from sender import Worker, checks
from sender.webhook import WebhookChannel

from ..conftest import SECRET, eventually
from ..receiver import Received, Receiver, Reply


def verifying(secret: list[str]) -> Callable[[Received], Reply]:
    """A receiver's handler: 200 for a request signed with the secret held in ``secret`` (set once
    the tenant is shown it), 401 for any other."""

    def handle(request: Received) -> Reply:
        try:
            verify_signature(secret, request.headers, request.body)
        except InvalidSignature:
            return Reply(401)
        return Reply(200)

    return handle


@pytest.fixture
async def served(store_url: str, serve_api: Callable[[Settings], str]) -> dict[str, Any]:
    """The service on each store, with its sender, tenant tokens for acme and globex (both allowed
    private networks: the receiver is on loopback) and for initech (not), and a producer's, an
    operator's and an admin's."""
    url = store_url
    settings = Settings(database_url=url, worker=True, authority="grants", authority_seconds=0, poll_seconds=0.05,
                        tenant_private_networks=["acme", "globex"], tenant_max_destinations=2,
                        backoff_initial_seconds=0.05, default_max_attempts=1)
    async with await Outbox.open(url, settings=settings) as box:
        tokens = {name: (await box.create_token(Role.TENANT, [name]))[0] for name in ("acme", "globex", "initech")}
        tokens["producer"] = (await box.create_token(Role.PRODUCER, ["*"]))[0]
        tokens["operator"] = (await box.create_token(Role.OPERATOR))[0]
        tokens["admin"] = (await box.create_token(Role.ADMIN))[0]
    return {"url": serve_api(settings), "tokens": tokens}


def client(served: dict[str, Any], who: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=served["url"], headers={"Authorization": f"Bearer {served['tokens'][who]}"},
                             timeout=30)


async def test_two_tenants_manage_their_own_endpoints_and_see_their_own_deliveries_only(served, receiver: Receiver):
    secrets: dict[str, list[str]] = {"acme": [], "globex": []}
    made: dict[str, str] = {}
    for tenant in ("acme", "globex"):
        receiver.script(f"/{tenant}", verifying(secrets[tenant]))
        async with client(served, tenant) as c:
            created = await c.post("/v1/tenant/destinations", json={
                "url": f"{receiver.url}/{tenant}", "allow_private_network": True, "timeout_seconds": 5,
                "subscriptions": [{"topic": "invoice.*"}]})
            assert created.status_code == 201, created.text
            shown = created.json()
            assert shown["owner"] == tenant and shown["id"].startswith("t-")
            assert shown["subscriptions"] == [{"topic": "invoice.*", "scopes": [tenant]}]
            assert shown["secret"].startswith("whsec_") and created.headers["cache-control"] == "no-store"
            secrets[tenant].append(shown["secret"])
            made[tenant] = shown["id"]
            again = await c.get(f"/v1/tenant/destinations/{shown['id']}")
            assert again.status_code == 200 and "secret" not in again.json()

    async with client(served, "producer") as p:
        for tenant in ("acme", "globex"):
            published = await p.post("/v1/events", json={"event_id": f"paid-{tenant}", "scope": tenant,
                                                          "topic": "invoice.paid", "payload": {"for": tenant}})
            assert published.status_code == 201, published.text
            assert [d["destination"] for d in published.json()["fanout"]] == [made[tenant]]
        # an intent of another scope naming a tenant's destination: refused as one that does not exist
        theirs = await p.post("/v1/intents", json={"scope": "globex", "destination": made["acme"], "payload": {}})
        nothing = await p.post("/v1/intents", json={"scope": "globex", "destination": "t-0000000000000000",
                                                    "payload": {}})
        assert theirs.status_code == nothing.status_code == 422
        assert theirs.json()["type"] == nothing.json()["type"]
        assert theirs.json()["detail"].replace(made["acme"], "X") == nothing.json()["detail"].replace(
            "t-0000000000000000", "X")

    assert await eventually(lambda: len(receiver.requests("/acme")) == 1 and len(receiver.requests("/globex")) == 1,
                            timeout=20)
    for tenant in ("acme", "globex"):
        [request] = receiver.requests(f"/{tenant}")
        assert request.json() == {"for": tenant}
        verify_signature(secrets[tenant], request.headers, request.body)

    async with client(served, "acme") as a:
        listed = (await a.get("/v1/tenant/intents")).json()["items"]
        assert [(i["scope"], i["destination"]) for i in listed] == [("acme", made["acme"])]
        assert "lease_owner" not in listed[0]
        assert await eventually(lambda: _status(a, listed[0]["action_id"], "delivered"), timeout=20)
        shown = (await a.get(f"/v1/tenant/intents/{listed[0]['action_id']}")).json()
        assert all("worker" not in attempt for attempt in shown["attempts"])
        assert all("actor" not in event for event in shown["events"])
        assert [e["event_id"] for e in (await a.get("/v1/tenant/events")).json()["items"]] == ["paid-acme"]
        # another tenant's ids are answered as ids that do not exist
        for path in (f"/v1/tenant/destinations/{made['globex']}", "/v1/tenant/events/paid-globex"):
            assert (await a.get(path)).status_code == 404
        mine_404 = await a.delete(f"/v1/tenant/destinations/{made['globex']}")
        none_404 = await a.delete("/v1/tenant/destinations/t-0000000000000000")
        assert mine_404.status_code == none_404.status_code == 404
        assert mine_404.json()["detail"].replace(made["globex"], "X") == none_404.json()["detail"].replace(
            "t-0000000000000000", "X")
        assert [d["id"] for d in (await a.get("/v1/tenant/destinations")).json()["items"]] == [made["acme"]]

    async with httpx.AsyncClient(base_url=served["url"]) as anyone:  # one label for every tenant's own
        metrics = (await anyone.get("/metrics")).text
        assert 'outbox_attempts_total{destination="tenant",outcome="delivered"} 2.0' in metrics
        assert made["acme"] not in metrics and made["globex"] not in metrics

    async with client(served, "admin") as admin:  # a grant cannot widen a tenant's destination
        widened = await admin.put("/v1/grants/g-wide", json={"scope": "globex", "destination": made["acme"]})
        assert widened.status_code == 409 and widened.json()["type"].endswith(":owned-destination")
        assert (await admin.get("/v1/grants/g-wide")).status_code == 404


async def _status(c: httpx.AsyncClient, action_id: str, status: str) -> bool:
    return (await c.get(f"/v1/tenant/intents/{action_id}")).json()["status"] == status


async def test_a_tenant_replays_its_dead_letter_and_sends_itself_a_test(served, receiver: Receiver):
    receiver.script("/acme", Reply(400), Reply(200))
    async with client(served, "acme") as a:
        created = (await a.post("/v1/tenant/destinations", json={
            "url": f"{receiver.url}/acme", "allow_private_network": True, "idempotent": True})).json()
        tested = await a.post(f"/v1/tenant/destinations/{created['id']}/test", json={})
        assert tested.status_code == 201, tested.text
        action_id = tested.json()["action_id"]
        assert action_id.startswith("test~") and tested.json()["scope"] == "acme"
        assert await eventually(lambda: _status(a, action_id, "dead"), timeout=20)
        replayed = await a.post(f"/v1/tenant/intents/{action_id}/replay", json={"reason": "fixed my endpoint"})
        assert replayed.status_code == 200, replayed.text
        assert await eventually(lambda: _status(a, action_id, "delivered"), timeout=20)
        again = await a.post(f"/v1/tenant/intents/{action_id}/replay", json={"reason": "once more"})
        assert again.status_code == 409 and again.json()["type"].endswith(":illegal-transition")
    first, second = receiver.requests("/acme")
    assert first.json() == second.json() == {"type": "outbox.test", "destination": created["id"],
                                             "test_id": action_id}
    assert first.headers["idempotency-key"] == second.headers["idempotency-key"] == f"acme/{action_id}"
    async with client(served, "globex") as g:  # another tenant cannot replay it, nor learn it exists
        refused = await g.post(f"/v1/tenant/intents/{action_id}/replay", json={"reason": "x"})
        assert refused.status_code == 404 and "acme" not in refused.text


@pytest.mark.parametrize(("spec", "kind"), [
    ({"channel": "email", "host": "mail.example", "from": "a@example.com"}, "not-for-tenants"),
    ({"url": "https://hooks.example/x", "requires_approval": True}, "not-for-tenants"),
    ({"url": "https://hooks.example/x", "subscriptions": [{"topic": "*", "scopes": ["acme"]}]}, "not-for-tenants"),
    ({"url": "http://127.0.0.1:9/x", "allow_private_network": True}, "not-for-tenants"),
    ({"url": "http://127.0.0.1:9/x"}, "invalid-input"),  # the SSRF guard, as an admin's destination gets it
    ({"url": "https://hooks.example/x", "channel": "nope"}, "invalid-input"),
])
async def test_a_tenants_destination_is_held_to_the_guards_and_a_refusal_writes_nothing(served, spec, kind):
    async with client(served, "initech") as c:  # initech may not reach private networks
        refused = await c.post("/v1/tenant/destinations", json=spec)
        assert refused.status_code in (403, 422), refused.text
        assert refused.json()["type"].endswith(f":{kind}") and refused.json()["detail"]
        assert (await c.get("/v1/tenant/destinations")).json()["items"] == []


async def test_a_tenant_owns_at_most_its_limit_of_destinations(served):
    async with client(served, "initech") as c:
        for _ in range(2):
            assert (await c.post("/v1/tenant/destinations", json={"url": "https://hooks.example/x"})).status_code == 201
        over = await c.post("/v1/tenant/destinations", json={"url": "https://hooks.example/x"})
        assert over.status_code == 409 and over.json()["type"].endswith(":tenant-limit") and over.json()["limit"] == 2
        assert len((await c.get("/v1/tenant/destinations")).json()["items"]) == 2
        assert (await c.get("/v1/tenant")).json() == {
            "scope": "initech", "channels": ["webhook"], "max_destinations": 2, "max_subscriptions": 100,
            "private_network": False, "destinations": 2}


async def test_the_owner_needs_no_grant_and_another_scope_is_denied_at_the_send(tmp_path):
    """Below the API: the sender's authority check implies the owner's grant and denies any other
    scope, whatever grant it holds (an intent that reached the destination some other way)."""
    from sender.authority import AuthorityRequest, authority_from_setting

    async with await Outbox.open(f"sqlite:///{tmp_path / 'o.db'}") as box:
        await box.put_grant("g-all", GrantSpec(scope="globex", destination="*"))
        for name in ("grants", "allow-all"):
            provider = authority_from_setting(name, box)
            owner = await provider.check(AuthorityRequest("acme", "webhook", "t-1", "a1", owner="acme"))
            other = await provider.check(AuthorityRequest("globex", "webhook", "t-1", "a1", owner="acme"))
            assert owner.allowed and not other.allowed and "owned by another scope" in other.reason


async def test_a_rotated_secret_signs_beside_the_previous_one_for_its_window_then_alone(store_url, receiver,
                                                                                       monkeypatch):
    """A real receiver checks every delivery with each secret apart: before the rotation the old
    one verifies, during the window (24 h by default) both do, from its end only the new one; the
    time is the outbox's manual clock, which the channel signs by too. (The worker reads the
    destination at each delivery here; it reuses a record for 2 s otherwise.)"""
    monkeypatch.setattr(checks, "DESTINATION_CACHE_SECONDS", 0)
    clock = ManualClock()
    settings = Settings(database_url=store_url, tenant_private_networks=["acme"], authority_seconds=0)
    held = {"old": SECRET}
    seen: list[dict[str, bool]] = []

    def handle(request: Received) -> Reply:
        verified = {}
        for name, secret in held.items():
            try:
                verify_signature(secret, request.headers, request.body, now=clock.now().timestamp())
                verified[name] = True
            except InvalidSignature:
                verified[name] = False
        seen.append(verified)
        return Reply(200 if any(verified.values()) else 401)

    receiver.script("/acme", handle)
    async with await Outbox.open(store_url, settings=settings, clock=clock) as box:
        made, _ = await box.put_destination(new_destination_id(), DestinationSpec(
            url=f"{receiver.url}/acme", secret=SECRET, allow_private_network=True), owner="acme")
        worker = Worker(box, channels={"webhook": WebhookChannel(clock=clock)})
        try:
            async def delivered(n: int) -> dict[str, bool]:
                await box.enqueue(action_id=f"a-{n}", scope="acme", destination=made.id, payload={"n": n})
                assert await worker.run_once() == 1
                assert (await box.get(f"a-{n}", scope="acme")).status is Status.DELIVERED
                return seen[-1]

            assert await delivered(1) == {"old": True}
            rotated, held["new"] = await box.rotate_secret(made.id, owner="acme")
            assert rotated.previous_secrets_until == clock.now() + timedelta(hours=24)
            assert held["new"].startswith("whsec_") and held["new"] != SECRET
            assert await delivered(2) == {"old": True, "new": True}
            clock.advance(24 * 3600 - 1)
            assert await delivered(3) == {"old": True, "new": True}
            clock.advance(1)  # the window's end: no operator step
            assert await delivered(4) == {"old": False, "new": True}
            # a secret the tenant puts itself starts a window too, of the length it asks for
            newest = "whsec_" + base64.b64encode(bytes(range(32))).decode()
            replaced, _ = await box.put_destination(made.id, DestinationSpec(
                url=f"{receiver.url}/acme", secret=newest, allow_private_network=True, rotation_window_seconds=60),
                owner="acme")
            assert replaced.secrets == (newest, held["new"])  # the old one, past its window, is gone
            held = {"new": held["new"], "newest": newest}
            assert await delivered(5) == {"new": True, "newest": True}
            clock.advance(60)
            assert await delivered(6) == {"new": False, "newest": True}
        finally:
            await worker.aclose()


async def test_a_tenant_taken_out_of_the_private_network_allowance_is_refused_at_the_send(store_url, receiver,
                                                                                         monkeypatch):
    """An admin allowed acme private networks, acme registered a loopback endpoint, then the admin
    took acme out of ``tenant_private_networks``: the sender refuses to connect there, as the SSRF
    guard refuses any private address (``not_submitted``, nothing reaches the receiver), while a
    tenant still allowed is delivered to the same receiver."""
    monkeypatch.setattr(checks, "DESTINATION_CACHE_SECONDS", 0)
    receiver.script("/hook", Reply(200))
    allowed = Settings(database_url=store_url, tenant_private_networks=["acme", "globex"], authority_seconds=0)
    made: dict[str, str] = {}
    async with await Outbox.open(store_url, settings=allowed) as box:
        for scope in ("acme", "globex"):
            made[scope] = (await box.put_destination(new_destination_id(), DestinationSpec(
                url=f"{receiver.url}/hook", secret=SECRET, allow_private_network=True), owner=scope))[0].id
    withdrawn = allowed.model_copy(update={"tenant_private_networks": ["globex"]})
    async with await Outbox.open(store_url, settings=withdrawn) as box:
        worker = Worker(box)
        try:
            for scope in ("acme", "globex"):
                await box.enqueue(action_id=f"{scope}-1", scope=scope, destination=made[scope], payload={},
                                  max_attempts=1)
            while await worker.run_once():
                pass
            acme, history = await box.show("acme-1", scope="acme")
            globex = await box.get("globex-1", scope="globex")
        finally:
            await worker.aclose()
    [attempt] = history.attempts
    assert acme.status is Status.DEAD and attempt.submission is Submission.NOT_SUBMITTED
    assert "not a public address" in (attempt.error or ""), attempt.error
    assert globex.status is Status.DELIVERED
    assert [r.headers.get("idempotency-key") for r in receiver.requests("/hook")] == [
        "globex/globex-1"]


async def test_another_scope_cannot_rotate_a_tenants_secret_and_shared_ones_rotate_too(tmp_path):
    async with await Outbox.open(f"sqlite:///{tmp_path / 'o.db'}") as box:
        await box.put_destination("t-1", DestinationSpec(url="https://a.example/", secret=SECRET), owner="acme")
        with pytest.raises(NotFound):
            await box.rotate_secret("t-1", owner="globex")
        assert (await box.get_destination("t-1")).secrets == (SECRET,)
        await box.put_destination("shared", DestinationSpec(url="https://s.example/", secret=SECRET))
        rotated, secret = await box.rotate_secret("shared", window_seconds=0)  # an admin's: the old one ends now
        assert rotated.secrets == (secret, SECRET) and rotated.live_secrets(box.clock.now()) == (secret,)


async def test_the_python_client_does_what_a_tenant_does(served, receiver: Receiver):
    from outbox.client import AsyncClient, Forbidden

    receiver.script("/acme", Reply(200))
    async with AsyncClient(served["url"], token=served["tokens"]["acme"]) as c:
        made = await c.create_destination(f"{receiver.url}/acme", allow_private_network=True)
        assert made["secret"].startswith("whsec_") and [d["id"] for d in await c.own_destinations()] == [made["id"]]
        rotated = await c.rotate_secret(made["id"], window_seconds=60)
        assert rotated["secret"] != made["secret"] and rotated["signing_secrets"] == 2
        tested = await c.send_test(made["id"], {"hello": "acme"})
        assert await eventually(lambda: _own_status(c, tested.action_id, "delivered"), timeout=20)
        assert receiver.requests("/acme")[0].json() == {"hello": "acme"}
        with pytest.raises(Forbidden):
            await c.get(tested.action_id, scope="acme")  # the operators' and producers' route


async def _own_status(c: Any, action_id: str, status: str) -> bool:
    return (await c.own_intent(action_id)).status == status
