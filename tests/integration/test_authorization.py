"""The authorization matrix: every route of the app (walked from its router, so a route added
without an entry here fails) against every kind of caller: tenant A, tenant B, a producer, an
operator, an admin, a revoked token and none.

A caller a route is not for is refused (401 without a usable token, 403 with another role's) and
changes nothing; one it is for is answered (no 401, 403 or 5xx). The tenant routes are called
with tenant A's ids: A is answered, and B is answered as for ids that do not exist (404), with no
answer to B naming anything of A's. The console is entered by a session only an operator's or an
admin's token opens; without one every console route sends the caller to sign in or refuses it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from outbox import Outbox, Role, Settings
from outbox.app.api import create_app
from outbox.app.web import routes
from outbox.grants import GrantSpec

from ..conftest import SECRET

A, B = "tenant_a", "tenant_b"
CALLERS = (A, B, "producer", "operator", "admin", "revoked", "none")
PRODUCER = frozenset({"producer", "admin"})
READER = frozenset({"producer", "operator", "admin"})
OPERATOR = frozenset({"operator", "admin"})
ADMIN = frozenset({"admin"})
TENANT = frozenset({A, B})
PUBLIC = "public"  # no token asked
CONSOLE = "console"  # a console session, opened by an operator's or admin's token
PORTAL = "portal"  # a portal session, opened by a link minted for one scope

#: Who each route is for, by "METHOD path" as the router names it.
ACCESS: dict[str, frozenset[str] | str] = {
    "GET /openapi.json": PUBLIC, "GET /docs": PUBLIC, "GET /docs/assets/{name}": PUBLIC,
    "GET /healthz": PUBLIC, "GET /readyz": PUBLIC, "GET /metrics": PUBLIC,
    "POST /v1/intents": PRODUCER, "POST /v1/intents:batch": PRODUCER,
    "GET /v1/intents/{action_id}": READER, "GET /v1/intents": READER,
    "POST /v1/events": PRODUCER, "POST /v1/events:batch": PRODUCER,
    "GET /v1/events/{event_id}": READER, "GET /v1/events": READER,
    "POST /v1/events/{event_id}/deliver": OPERATOR,
    **{f"POST /v1/intents/{{action_id}}/{act}": OPERATOR
       for act in ("replay", "resolve", "cancel", "approve", "reject")},
    "POST /v1/replay": OPERATOR,
    "PUT /v1/destinations/{destination_id}": ADMIN, "GET /v1/destinations/{destination_id}": OPERATOR,
    "GET /v1/destinations": OPERATOR, "DELETE /v1/destinations/{destination_id}": ADMIN,
    "POST /v1/destinations/{destination_id}/rotate-secret": ADMIN,
    "PUT /v1/grants/{grant_id}": ADMIN, "GET /v1/grants/{grant_id}": OPERATOR, "GET /v1/grants": OPERATOR,
    "DELETE /v1/grants/{grant_id}": ADMIN,
    "POST /v1/tokens": ADMIN, "GET /v1/tokens": ADMIN, "DELETE /v1/tokens/{token_id}": ADMIN,
    "GET /v1/tenant": TENANT, "GET /v1/tenant/destinations": TENANT, "POST /v1/tenant/destinations": TENANT,
    "GET /v1/tenant/destinations/{destination_id}": TENANT, "PUT /v1/tenant/destinations/{destination_id}": TENANT,
    "DELETE /v1/tenant/destinations/{destination_id}": TENANT,
    "POST /v1/tenant/destinations/{destination_id}/rotate-secret": TENANT,
    "POST /v1/tenant/destinations/{destination_id}/test": TENANT,
    "GET /v1/tenant/intents": TENANT, "GET /v1/tenant/intents/{action_id}": TENANT,
    "POST /v1/tenant/intents/{action_id}/replay": TENANT,
    "GET /v1/tenant/events": TENANT, "GET /v1/tenant/events/{event_id}": TENANT,
    "POST /v1/tenants/{scope}/portal-links": PRODUCER,
    "GET /console/login": PUBLIC, "POST /console/login": PUBLIC, "POST /console/logout": PUBLIC,
    "GET /console/style.css": PUBLIC,
    **{f"GET {path}": CONSOLE for path in (
        "/console", "/console/events", "/console/events/{event_id}", "/console/intents", "/console/destinations",
        "/console/destinations/{destination_id}", "/console/intents/{action_id}", "/console/replay",
        "/console/replay/{job}")},
    **{f"POST /console/intents/{{action_id}}/{act}": CONSOLE
       for act in ("replay", "resolve", "cancel", "approve", "reject")},
    "POST /console/replay": CONSOLE,
    "GET /portal/open": PUBLIC, "GET /portal/style.css": PUBLIC, "POST /portal/logout": PUBLIC,
    **{f"GET {path}": PORTAL for path in (
        "/portal", "/portal/endpoints/{destination_id}", "/portal/deliveries", "/portal/deliveries/{action_id}")},
    **{f"POST {path}": PORTAL for path in (
        "/portal/endpoints", "/portal/endpoints/{destination_id}", "/portal/endpoints/{destination_id}/rotate",
        "/portal/endpoints/{destination_id}/test", "/portal/deliveries/{action_id}/replay")},
}

#: A body each route that takes one is sent (valid, so that only who calls decides the answer).
BODIES: dict[str, Any] = {
    "POST /v1/intents": {"action_id": "m-1", "scope": "acme", "destination": "shared", "payload": {}},
    "POST /v1/intents:batch": {"intents": [{"action_id": "m-2", "scope": "acme", "destination": "shared",
                                            "payload": {}}]},
    "POST /v1/events": {"event_id": "m-e", "scope": "acme", "topic": "invoice.paid", "payload": {}},
    "POST /v1/events:batch": {"events": [{"event_id": "m-f", "scope": "acme", "topic": "invoice.paid",
                                          "payload": {}}]},
    "POST /v1/events/{event_id}/deliver": {"destination": "shared", "reason": "matrix"},
    "POST /v1/intents/{action_id}/replay": {"reason": "matrix"},
    "POST /v1/intents/{action_id}/resolve": {"resolution": "delivered", "reason": "matrix"},
    "POST /v1/intents/{action_id}/cancel": {"reason": "matrix"},
    "POST /v1/intents/{action_id}/approve": {"payload_digest": "sha256:" + "0" * 64, "valid_seconds": 60,
                                             "reason": "matrix"},
    "POST /v1/intents/{action_id}/reject": {"reason": "matrix"},
    "POST /v1/replay": {"reason": "matrix", "filter": {"status": ["dead"]}, "dry_run": True},
    "PUT /v1/destinations/{destination_id}": {"url": "https://hooks.example/a"},
    "POST /v1/destinations/{destination_id}/rotate-secret": {},
    "PUT /v1/grants/{grant_id}": {"scope": "acme", "destination": "shared"},
    "POST /v1/tokens": {"role": "producer", "scopes": ["acme"]},
    "POST /v1/tenant/destinations": {"url": "https://hooks.example/new"},
    "PUT /v1/tenant/destinations/{destination_id}": {"url": "https://hooks.example/a"},
    "POST /v1/tenant/destinations/{destination_id}/rotate-secret": {},
    "POST /v1/tenant/destinations/{destination_id}/test": {},
    "POST /v1/tenant/intents/{action_id}/replay": {"reason": "matrix"},
    "POST /v1/tenants/{scope}/portal-links": {},
}


def every_route() -> list[str]:
    app = create_app(Settings(database_url="sqlite:///unused.db"))
    return [f"{method} {route.path}" for route in routes(app.router)
            for method in sorted(getattr(route, "methods", None) or ()) if method != "HEAD"]


def test_every_route_has_an_entry_in_the_matrix():
    found = every_route()
    assert sorted(set(found) - set(ACCESS)) == [], "a route without an entry in ACCESS: say who it is for"
    assert sorted(set(ACCESS) - set(found)) == [], "an entry in ACCESS for a route that is gone"


@pytest.fixture
async def world(db_url: str, serve_api: Callable[[Settings], str]) -> dict[str, Any]:
    """The service with a shared destination, tenant A's own destination, intent and event, and a
    token for each caller (one of them revoked)."""
    settings = Settings(database_url=db_url, worker=False)
    async with await Outbox.open(db_url, settings=settings) as box:
        await box.put_destination("shared", _spec({"url": "https://shared.example/hook", "secret": SECRET}))
        await box.put_grant("g-shared", GrantSpec(scope="acme", destination="shared"))
        owned, _ = await box.put_destination("t-aaaaaaaaaaaaaaaa", _spec({
            "url": "https://acme.example/hook", "secret": SECRET,
            "subscriptions": [{"topic": "invoice.*"}]}), owner="acme")
        await box.enqueue(action_id="a-1", scope="acme", destination=owned.id, payload={"n": 1})
        await box.publish(event_id="e-acme", scope="acme", topic="invoice.paid", payload={"n": 2})
        tokens = {A: (await box.create_token(Role.TENANT, ["acme"]))[0],
                  B: (await box.create_token(Role.TENANT, ["globex"]))[0],
                  "producer": (await box.create_token(Role.PRODUCER, ["*"]))[0],
                  "operator": (await box.create_token(Role.OPERATOR))[0],
                  "admin": (await box.create_token(Role.ADMIN))[0]}
        revoked, info = await box.create_token(Role.TENANT, ["acme"])
        await box.revoke_token(info.id)
        tokens["revoked"] = revoked
    return {"url": serve_api(settings), "tokens": tokens,
            "ids": {"action_id": "a-1", "event_id": "e-acme", "destination_id": owned.id, "grant_id": "g-none",
                    "token_id": "00000000", "name": "swagger-ui.css", "job": "none",
                    "scope": "acme"}}


def _spec(fields: dict[str, Any]):
    from outbox import DestinationSpec

    return DestinationSpec(**fields)


#: Ids nothing has: what B is answered for A's ids must be what anyone is answered for these.
GHOSTS = {"action_id": "x-1", "event_id": "x-e", "destination_id": "t-0000000000000000"}


def _unnamed(text: str, ids: dict[str, str]) -> str:
    """An answer with the ids it was asked about (echoed back) taken out."""
    for name in GHOSTS:
        text = text.replace(ids[name], "{" + name + "}")
    return text


async def call(world: dict[str, Any], route: str, caller: str, ids: dict[str, str] | None = None) -> httpx.Response:
    method, path = route.split(" ", 1)
    for name, value in {**world["ids"], **(ids or {})}.items():
        path = path.replace(f"{{{name}}}", value)
    token = world["tokens"].get(caller)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(base_url=world["url"], timeout=30, follow_redirects=False) as c:
        return await c.request(method, path, headers=headers, json=BODIES.get(route))


@pytest.mark.parametrize("caller", CALLERS)
async def test_every_route_answers_each_caller_as_its_role_allows(world, caller):
    a_ids = (world["ids"]["destination_id"], "a-1", "e-acme")
    for route, allowed in ACCESS.items():
        if allowed == CONSOLE or route.startswith("POST /console/"):
            continue  # (the console: below)
        answer = await call(world, route, caller)
        seen = f"{route} as {caller}: {answer.status_code} {answer.text[:300]}"
        assert answer.status_code < 500, seen
        if allowed == PORTAL:  # (a portal session is no token's: below)
            assert answer.status_code == 401 and "a-1" not in answer.text, seen
            continue
        if allowed == PUBLIC:
            continue
        if caller in ("none", "revoked"):
            assert answer.status_code == 401, seen
            assert answer.headers["content-type"] == "application/problem+json", seen
        elif caller not in allowed:
            assert answer.status_code == 403, seen
            assert answer.headers["content-type"] == "application/problem+json", seen
        else:
            assert answer.status_code not in (401, 403), seen
        if caller == B and allowed is TENANT and "{" in route:  # A's ids are no ids to B
            ghost = await call(world, route, caller, ids=GHOSTS)
            assert answer.status_code == ghost.status_code == 404, seen
            assert _unnamed(answer.text, world["ids"]) == _unnamed(ghost.text, GHOSTS), seen
        elif caller == B and allowed is TENANT:
            assert "acme" not in answer.text and not any(i in answer.text for i in a_ids), seen
        if caller == A and allowed is TENANT:
            assert answer.status_code != 404, seen


@pytest.mark.parametrize("caller", CALLERS)
async def test_only_an_operators_or_admins_token_opens_the_console(world, caller):
    async with httpx.AsyncClient(base_url=world["url"], timeout=30, follow_redirects=False) as c:
        form = await c.get("/console/login")
        csrf = re.search(r"""name=["']csrf["'] value=["']([^"']+)""", form.text)[1]
        signed_in = await c.post("/console/login", data={"csrf": csrf, "token": world["tokens"].get(caller, "")})
        opened = signed_in.headers.get("location") == "/console"
        assert opened is (caller in OPERATOR), f"{caller}: {signed_in.status_code} {signed_in.headers}"
        for route, allowed in ACCESS.items():
            if allowed != CONSOLE:
                continue
            method, path = route.split(" ", 1)
            for name, value in world["ids"].items():
                path = path.replace(f"{{{name}}}", value)
            answer = await c.request(method, path, data={})
            seen = f"{route} as {caller}: {answer.status_code}"
            assert answer.status_code < 500, seen
            if not opened:
                assert answer.status_code in (303, 401, 403) and "a-1" not in answer.text, seen
                if answer.status_code == 303:
                    assert answer.headers["location"].startswith("/console/login"), seen


#: Who may be in the portal: tenant A's and B's sessions, and callers that must not be.
PORTAL_CALLERS = ("portal_a", "portal_b", "expired_link", "reused_link", "none", "console_session")
#: A form each portal route is sent (with the session's CSRF value), valid for A.
FORMS: dict[str, dict[str, str]] = {
    "POST /portal/endpoints": {"url": "https://hooks.example/new", "topics": "invoice.*"},
    "POST /portal/endpoints/{destination_id}": {"url": "https://hooks.example/a", "topics": "invoice.*"},
    "POST /portal/deliveries/{action_id}/replay": {},
}


async def portal_browser(world: dict[str, Any], caller: str, db_url: str) -> httpx.AsyncClient:
    """A browser as ``caller``: in by a link minted for its scope, or having tried to get in."""
    from datetime import UTC, datetime, timedelta

    from outbox.portal import PortalLink
    from outbox.tokens import hash_token

    browser = httpx.AsyncClient(base_url=world["url"], timeout=30, follow_redirects=False)
    admin = {"Authorization": f"Bearer {world['tokens']['admin']}"}
    if caller in ("portal_a", "portal_b", "reused_link"):
        scope = "globex" if caller == "portal_b" else "acme"
        minted = (await browser.post(f"/v1/tenants/{scope}/portal-links", json={}, headers=admin)).json()
        if caller == "reused_link":
            async with httpx.AsyncClient(base_url=world["url"]) as first:
                assert (await first.get(minted["url"])).status_code == 303
        opened = await browser.get(minted["url"])
        assert opened.status_code == (403 if caller == "reused_link" else 303), caller
    elif caller == "expired_link":
        async with await Outbox.open(db_url) as box:
            admin_id = next(t.id for t in await box.list_tokens() if t.role is Role.ADMIN)
            past = datetime.now(UTC) - timedelta(minutes=20)
            await box.store.insert_portal_link(PortalLink(hash_token("expired-link-token"), admin_id, "acme", False,
                                                          3600, past, past + timedelta(minutes=10)))
        assert (await browser.get("/portal/open?link=expired-link-token")).status_code == 403
    elif caller == "console_session":
        form = await browser.get("/console/login")
        csrf = re.search(r"""name=["']csrf["'] value=["']([^"']+)""", form.text)[1]
        signed_in = await browser.post("/console/login", data={"csrf": csrf, "token": world["tokens"]["operator"]})
        assert signed_in.headers["location"] == "/console"
        # the console's session id offered as a portal session's too: it is none
        browser.cookies.set("outbox_portal", browser.cookies.get("outbox_console"))
    return browser


async def portal_call(browser: httpx.AsyncClient, world: dict[str, Any], route: str,
                      ids: dict[str, str] | None = None) -> httpx.Response:
    method, path = route.split(" ", 1)
    for name, value in {**world["ids"], **(ids or {})}.items():
        path = path.replace(f"{{{name}}}", value)
    if method == "GET":
        return await browser.get(path)
    page = await browser.get("/portal")
    found = re.search(r"name='csrf' value='([^']+)'", page.text)
    return await browser.post(path, data={**FORMS.get(route, {}), "csrf": found[1] if found else ""})


@pytest.mark.parametrize("caller", PORTAL_CALLERS)
async def test_every_portal_route_answers_only_its_own_tenants_session(world, caller, db_url):
    """A's session is answered on A's ids; B's as for ids nobody has, naming nothing of A's; an
    expired or reused link, none, and an operator's console session are not in (401)."""
    a_ids = (world["ids"]["destination_id"], "a-1")
    browser = await portal_browser(world, caller, db_url)
    try:
        for route, allowed in ACCESS.items():
            if allowed != PORTAL:
                continue
            answer = await portal_call(browser, world, route)
            seen = f"{route} as {caller}: {answer.status_code} {answer.text[:300]}"
            assert answer.status_code < 500, seen
            if caller == "portal_a":
                assert answer.status_code not in (401, 403, 404), seen
            elif caller == "portal_b" and "{" in route and not route.endswith("/endpoints"):
                ghost = await portal_call(browser, world, route, ids=GHOSTS)
                assert answer.status_code == ghost.status_code == 404, seen
                assert _unnamed(answer.text, world["ids"]) == _unnamed(ghost.text, GHOSTS), seen
            elif caller == "portal_b":
                assert answer.status_code not in (401, 403), seen
                assert "acme" not in answer.text and not any(i in answer.text for i in a_ids), seen
            else:
                assert answer.status_code == 401 and not any(i in answer.text for i in a_ids), seen
        # signing out (open to all: it ends only the caller's own session, if any)
        out = await portal_call(browser, world, "POST /portal/logout")
        assert out.status_code == 200 and not any(i in out.text for i in a_ids), out.text
        assert (await browser.get("/portal")).status_code == 401
    finally:
        await browser.aclose()
