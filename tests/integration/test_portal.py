"""The tenant portal, on each store, served by a real uvicorn with its embedded sender: two tenants
each enter by a link their application minted, add an endpoint through the portal's form (a real
receiver on loopback verifies its deliveries with the secret the portal showed once), send it a
test event, see its delivery's attempts with the request's headers and the reply, and see only
their own; a read-only session gets no forms and a refusal on POST; every page carries the
portal's policy and brand; and what a tenant or a receiver wrote (an endpoint URL, topics, reply
bodies and headers with markup) is served escaped."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from outbox import Outbox, Role, Settings
from receivers import verify_signature
from receivers.wire import InvalidSignature

from ..conftest import eventually
from ..receiver import Received, Receiver, Reply

#: Markup a receiver or a tenant writes, which must come back as text.
HOSTILE = "<script>alert(1)</script><img src=x onerror=alert(2)>"


@pytest.fixture
async def served(store_url: str, serve_api: Callable[[Settings], str]) -> dict[str, Any]:
    """The service with its sender, a producer token for each of acme and globex (both may reach
    loopback, where the receiver is), branded and embeddable by one origin."""
    settings = Settings(database_url=store_url, worker=True, tenant_private_networks=["acme", "globex"],
                        poll_seconds=0.05, portal_name="Acme Hooks", portal_colour="#0a7",
                        portal_logo_url="https://cdn.example/logo.png",
                        portal_frame_ancestors=["https://app.example"])
    async with await Outbox.open(store_url, settings=settings) as box:
        tokens = {scope: (await box.create_token(Role.PRODUCER, [scope]))[0] for scope in ("acme", "globex")}
    return {"url": serve_api(settings), "tokens": tokens}


def csrf_of(html: str) -> str:
    return re.search(r"name='csrf' value='([^']+)'", html)[1]


@asynccontextmanager
async def enter(served: dict[str, Any], scope: str, **link: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A browser of ``scope``'s user that opened a fresh link (its cookie set)."""
    async with httpx.AsyncClient(base_url=served["url"], timeout=30) as browser:
        minted = await browser.post(f"/v1/tenants/{scope}/portal-links", json=link,
                                    headers={"Authorization": f"Bearer {served['tokens'][scope]}"})
        assert minted.status_code == 201, minted.text
        opened = await browser.get(minted.json()["url"])
        assert opened.status_code == 303 and opened.headers["location"] == "/portal", opened.text
        yield browser


def verifying(secret: list[str]) -> Callable[[Received], Reply]:
    """A receiver that answers 200 to a request signed with the secret in ``secret``, with markup in
    its reply's body and headers."""

    def handle(request: Received) -> Reply:
        try:
            verify_signature(secret, request.headers, request.body)
        except InvalidSignature:
            return Reply(401)
        return Reply(200, body=HOSTILE.encode(), headers={"External-Id": HOSTILE})

    return handle


async def add_endpoint(browser: httpx.AsyncClient, url: str, topics: str) -> tuple[str, str]:
    """Add an endpoint through the portal's form: its id and the secret shown once."""
    home = await browser.get("/portal")
    made = await browser.post("/portal/endpoints", data={"csrf": csrf_of(home.text), "url": url, "topics": topics})
    assert made.status_code == 200, made.text
    endpoint = re.search(r"/portal/endpoints/(t-[0-9a-f]+)", made.text)[1]
    secret = re.search(r"<pre>(whsec_[^<]+)</pre>", made.text)[1]
    assert made.headers["cache-control"] == "no-store"
    return endpoint, secret


async def test_two_tenants_each_add_an_endpoint_through_the_portal_and_see_only_their_own(
        served, start_receiver: Callable[[], Receiver]):
    seen: dict[str, dict[str, str]] = {}
    for scope in ("acme", "globex"):
        receiver, secret = start_receiver(), []
        receiver.script("/hook", verifying(secret))
        async with enter(served, scope) as browser:
            endpoint, shown = await add_endpoint(browser, receiver.url + "/hook", "invoice.*")
            secret.append(shown)
            page = (await browser.get(f"/portal/endpoints/{endpoint}")).text
            tested = await browser.post(f"/portal/endpoints/{endpoint}/test", data={"csrf": csrf_of(page)})
            assert tested.status_code == 303, tested.text
            delivery = tested.headers["location"]

            async def delivered(path: str = delivery) -> bool:
                return "pill delivered" in (await browser.get(path)).text

            assert await eventually(delivered, timeout=15)
            html = (await browser.get(delivery)).text
            action_id = delivery.rsplit("/", 1)[1]
            assert f"Idempotency-Key: {scope}/{action_id}" in html  # the request's headers
            assert "<script" not in html and "<img src=x" not in html  # the reply's body and headers, escaped:
            assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;") == 2
            listed = (await browser.get("/portal/deliveries?status=delivered")).text
            assert action_id in listed
            seen[scope] = {"endpoint": endpoint, "delivery": delivery, "action_id": action_id}
    for scope, other in (("acme", "globex"), ("globex", "acme")):
        async with enter(served, scope) as browser:
            theirs = seen[other]
            for path, asked, ghost in ((f"/portal/endpoints/{theirs['endpoint']}", theirs["endpoint"],
                                        "t-0000000000000000"),
                                       (theirs["delivery"], theirs["action_id"], "test~none")):
                answer, nobody = await browser.get(path), await browser.get(path.replace(asked, ghost))
                assert answer.status_code == nobody.status_code == 404, path  # as for an id nobody has
                assert answer.text.replace(asked, "{id}") == nobody.text.replace(ghost, "{id}"), path
            for path in ("/portal", "/portal/deliveries"):
                html = (await browser.get(path)).text
                assert theirs["endpoint"] not in html and theirs["action_id"] not in html and other not in html
            refused = await browser.post(f"/portal/endpoints/{theirs['endpoint']}/rotate",
                                         data={"csrf": csrf_of((await browser.get("/portal")).text)})
            assert refused.status_code == 404


async def test_a_link_opens_once_and_a_read_only_session_gets_no_forms(served):
    async with httpx.AsyncClient(base_url=served["url"]) as api:
        minted = (await api.post("/v1/tenants/acme/portal-links", json={"read_only": True},
                                 headers={"Authorization": f"Bearer {served['tokens']['acme']}"})).json()
    async with httpx.AsyncClient(base_url=served["url"]) as browser:
        opened = await browser.get(minted["url"])
        assert opened.status_code == 303
        cookie = opened.headers["set-cookie"]
        assert "HttpOnly" in cookie and "Path=/portal" in cookie and "SameSite=lax" in cookie.replace("Lax", "lax")
        home = await browser.get("/portal")
        assert home.status_code == 200 and "read-only" in home.text
        assert re.findall(r"<form[^>]*action='([^']+)'", home.text) == ["/portal/logout"]  # signing out only
        refused = await browser.post("/portal/endpoints", data={"url": "https://x.example/", "csrf": "x"})
        assert refused.status_code == 403
    async with httpx.AsyncClient(base_url=served["url"]) as other:
        again = await other.get(minted["url"])
        assert again.status_code == 403 and "set-cookie" not in again.headers
        assert (await other.get("/portal")).status_code == 401


async def test_every_portal_page_forbids_script_and_is_framed_only_by_its_setting(served):
    async with enter(served, "acme") as browser:
        for path in ("/portal", "/portal/deliveries", "/portal/open?link=nothing", "/portal/style.css"):
            answer = await browser.get(path)
            policy = answer.headers["content-security-policy"]
            assert "default-src 'none'" in policy and "script-src" not in policy, path
            assert "frame-ancestors https://app.example;" in policy, path
            assert "img-src 'self' https://cdn.example;" in policy, path
            assert answer.headers["referrer-policy"] == "no-referrer", path
        home = (await browser.get("/portal")).text
        assert "Acme Hooks" in home and "<img src='https://cdn.example/logo.png'" in home
        assert "background:#0a7" in (await browser.get("/portal/style.css")).text
        forged = await browser.post("/portal/endpoints", data={"csrf": "wrong", "url": "https://x.example/"})
        assert forged.status_code == 403
        cross = await browser.post("/portal/endpoints", data={"csrf": csrf_of(home), "url": "https://x.example/"},
                                   headers={"Sec-Fetch-Site": "cross-site"})
        assert cross.status_code == 403


async def test_what_a_tenant_writes_is_served_as_text(served):
    hostile_url = "https://hooks.example/a?x=" + "'\"><script>alert(3)</script>"
    async with enter(served, "acme") as browser:
        home = (await browser.get("/portal")).text
        made = await browser.post("/portal/endpoints", data={"csrf": csrf_of(home), "url": hostile_url,
                                                             "topics": "invoice.*"})
        refused = await browser.post("/portal/endpoints", data={"csrf": csrf_of(home), "url": "https://h.example/",
                                                                "topics": HOSTILE})
        searched = await browser.get("/portal/deliveries", params={"topic": HOSTILE, "after": HOSTILE})
        for answer in (made, refused, searched, await browser.get("/portal")):
            assert "<script" not in answer.text and "<img src=x" not in answer.text, answer.text
        assert made.status_code == 200 and "&lt;script&gt;alert(3)" in (await browser.get("/portal")).text
        assert refused.status_code == 422 and searched.status_code == 400


async def test_an_edit_changes_what_its_form_shows_and_leaves_every_other_field_as_it_was(served, store_url):
    """The edit form shows the URL, topics and two flags; an endpoint registered through the API
    with its own timeout, retries, limits and ordering keeps them all when the form is saved."""
    tuned = {"timeout_seconds": 3.5, "on_unknown": "never", "retention_seconds": 7200, "max_in_flight": 2,
             "rate_limit": {"per_second": 5.0, "burst": 3}, "retry_schedule": [1.0, 30.0], "max_age_seconds": 600,
             "ordering": "key", "ordering_on_dead": "skip", "reconcile": True, "allow_private_network": True}
    async with await Outbox.open(store_url) as box:
        tenant = (await box.create_token(Role.TENANT, ["acme"]))[0]
    async with httpx.AsyncClient(base_url=served["url"], headers={"Authorization": f"Bearer {tenant}"}) as api:
        made = (await api.post("/v1/tenant/destinations", json={
            "url": "http://127.0.0.1:9/hooks", "subscriptions": [{"topic": "invoice.*"}], **tuned})).json()
        async with enter(served, "acme") as browser:
            page = (await browser.get(f"/portal/endpoints/{made['id']}")).text
            saved = await browser.post(f"/portal/endpoints/{made['id']}", data={
                "csrf": csrf_of(page), "url": "http://127.0.0.1:9/v2/hooks", "topics": "invoice.* order.paid",
                "idempotent": "on"})
            assert saved.status_code == 303, saved.text
        now = (await api.get(f"/v1/tenant/destinations/{made['id']}")).json()
    assert {name: now[name] for name in tuned} == tuned
    assert now["url"] == "http://127.0.0.1:9/v2/hooks" and now["idempotent"] is True and now["disabled"] is False
    assert [s["topic"] for s in now["subscriptions"]] == ["invoice.*", "order.paid"]
    assert now["signing_secrets"] == 1  # the secret was not shown, and stays


async def test_signing_out_ends_the_session_in_the_store_and_drops_its_cookie(served):
    """A read-only session signs out too; the cookie kept afterwards opens nothing; a sign-out form
    without the session's CSRF value, or sent from another site, ends nothing."""
    async with enter(served, "acme", read_only=True) as browser:
        kept = browser.cookies["outbox_portal"]
        home = (await browser.get("/portal")).text
        forged = await browser.post("/portal/logout", data={"csrf": "wrong"})
        cross = await browser.post("/portal/logout", data={"csrf": csrf_of(home)},
                                   headers={"Sec-Fetch-Site": "cross-site"})
        assert forged.status_code == cross.status_code == 403
        assert (await browser.get("/portal")).status_code == 200  # still in
        out = await browser.post("/portal/logout", data={"csrf": csrf_of(home)})
        assert out.status_code == 200 and "signed out" in out.text
        dropped = out.headers["set-cookie"]
        assert dropped.startswith('outbox_portal="";') and "Max-Age=0" in dropped and "Path=/portal" in dropped
        assert "outbox_portal" not in browser.cookies
        browser.cookies.set("outbox_portal", kept)  # a copy of the cookie kept from before
        assert (await browser.get("/portal")).status_code == 401
        again = await browser.post("/portal/logout", data={"csrf": csrf_of(home)})
        assert again.status_code == 200  # nothing left to end
