"""The tenant portal in a real headless Chromium (Debian's, driven as the console's browser test
drives it): at a phone's width and a desktop's, a tenant's user goes from a link its application
just minted to a working endpoint (added in the portal's form, its secret shown once, a test event
verified by a real receiver with that secret, the delivery and its attempt seen), then signs out.
And what a tenant, a producer or a receiver wrote, markup meant to run, is shown as text in the
portal and in the console: the served HTML escapes it, and Chromium, told to ignore the pages'
Content-Security-Policy so that escaping alone is tested, runs no script and opens no dialog."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from outbox import Outbox, Role, Settings
from outbox.app.service import create_service

from ..integration.test_tenants import verifying
from ..receiver import Receiver, Reply
from ..servers import Served
from .test_console_browser import ARTIFACTS, VIEWPORTS, chromium

SCREENSHOTS = ARTIFACTS / "portal"
#: Markup a tenant, a producer or a receiver writes: a script element, and an attribute's end
#: followed by an element whose handler runs.
SCRIPT = "<script>alert(1)</script>"
ATTRIBUTE = '"><img src=x onerror=alert(1)>'
HOSTILE = SCRIPT + ATTRIBUTE
#: What a page serves for them when it escapes them (the quote is escaped too, which shows in the DOM only as text).
ESCAPED = ("&lt;script&gt;alert(1)&lt;/script&gt;", "&lt;img src=x onerror=alert(1)&gt;")
#: Runs before each page's own content: records every dialog a script would open.
WATCH = """
window.__ran = [];
for (const name of ["alert", "confirm", "prompt", "print"]) {
  const original = window[name].bind(window);
  window[name] = (...args) => { window.__ran.push(name + "(" + args.join(",") + ")"); return original(...args); };
}
"""


@dataclass
class Portal:
    url: str
    producer: str  # acme's application's: it mints the links
    operator: str
    receiver: Receiver


@pytest.fixture
def portal(tmp_path: Path) -> Iterator[Portal]:
    """The service (API, console, portal, embedded worker) on a real SQLite file, acme allowed
    private networks (the receiver is on loopback), and a receiver."""
    receiver = Receiver().start()
    db_url = f"sqlite:///{tmp_path / 'portal.db'}"

    async def prepare() -> tuple[str, str]:
        async with await Outbox.open(db_url) as box:
            producer, _ = await box.create_token(Role.PRODUCER, ["acme"], label="acme's app")
            operator, _ = await box.create_token(Role.OPERATOR, label="on call")
        return producer, operator

    producer, operator = asyncio.run(prepare())
    served = Served(create_service(Settings(database_url=db_url, worker=True, authority="allow-all",
                                            tenant_private_networks=["acme"], poll_seconds=0.05)))
    try:
        yield Portal(served.url, producer, operator, receiver)
    finally:
        served.stop()
        receiver.stop()


def minted(p: Portal) -> str:
    """A fresh link into acme's portal, as acme's application mints it for one of its users."""
    with httpx.Client(base_url=p.url, headers={"Authorization": f"Bearer {p.producer}"}) as api:
        answer = api.post("/v1/tenants/acme/portal-links", json={})
    assert answer.status_code == 201, answer.text
    return p.url + answer.json()["url"]


def fits(page: Any, where: str) -> None:
    """Nothing wider than the screen: tables fit, or stack into cards on a phone."""
    width = page.evaluate("[document.scrollingElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], (where, width)


def shot(page: Any, name: str) -> None:
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 5_000, path


def until_delivered(page: Any) -> None:
    deadline = time.monotonic() + 20
    while page.locator("dl.fields .pill").first.inner_text() != "delivered":
        assert time.monotonic() < deadline, "the test event was not delivered in 20 s"
        page.wait_for_timeout(200)
        page.reload()


def test_a_tenant_goes_from_a_fresh_link_to_a_working_endpoint_at_each_width(portal: Portal):
    secrets: dict[str, list[str]] = {}
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with chromium() as browser:
        for name, viewport in VIEWPORTS.items():
            secrets[name] = []
            portal.receiver.script(f"/{name}", verifying(secrets[name]))
            context = browser.new_context(viewport=viewport)
            page = context.new_page()
            page.set_default_timeout(15_000)

            page.goto(minted(portal))  # the link opens the session, and goes on to the endpoints
            page.wait_for_url(portal.url + "/portal")
            assert page.locator("h1").inner_text() == "Endpoints"
            fits(page, f"endpoints-{name}")
            shot(page, f"endpoints-{name}")

            added = page.locator("form[action='/portal/endpoints']")
            added.locator("input[name=url]").fill(f"{portal.receiver.url}/{name}")
            added.locator("input[name=topics]").fill("invoice.* order.paid")
            added.get_by_role("button", name="Add").click()
            assert page.locator("h1").inner_text() == "Endpoint added"
            secret = page.locator("pre").inner_text()
            assert secret.startswith("whsec_")
            secrets[name].append(secret)  # where the receiver verifies signatures
            fits(page, f"secret-{name}")
            shot(page, f"secret-{name}")

            page.get_by_role("link", name="On to the endpoint").click()
            page.wait_for_url(f"{portal.url}/portal/endpoints/t-*")
            fields = page.locator("dl.fields").inner_text()
            assert f"{portal.receiver.url}/{name}" in fields and "invoice.* order.paid" in fields
            fits(page, f"endpoint-{name}")
            shot(page, f"endpoint-{name}")

            page.get_by_role("button", name="Send a test event").click()
            page.wait_for_url(f"{portal.url}/portal/deliveries/test~*")
            action_id = page.url.rsplit("/", 1)[1]
            until_delivered(page)
            assert page.locator("h3").first.inner_text() == "Attempt 1: delivered (200)"
            sent = page.locator("details", has_text="request headers")
            sent.locator("summary").click()
            assert f"Idempotency-Key: acme/{action_id}" in sent.locator("pre").inner_text()
            assert page.locator("details", has_text="reply").is_visible()
            fits(page, f"delivery-{name}")
            shot(page, f"delivery-{name}")

            page.locator("header").get_by_role("link", name="Deliveries").click()
            page.wait_for_url(portal.url + "/portal/deliveries")
            row = page.locator("tbody tr", has_text=action_id)
            assert row.count() == 1 and "delivered" in row.inner_text()
            fits(page, f"deliveries-{name}")
            shot(page, f"deliveries-{name}")

            page.get_by_role("button", name="Sign out").click()
            assert page.locator("h1").inner_text() == "Signed out"
            assert context.cookies() == []
            page.goto(portal.url + "/portal")
            assert page.locator("h1").inner_text() == "Not signed in"
            context.close()
            [request] = portal.receiver.requests(f"/{name}")  # one delivery, verified with the secret shown
            assert request.headers["idempotency-key"] == f"acme/{action_id}"


def visit(page: Any, url: str, ran: list[str]) -> str:
    """Open ``url`` and check it ran nothing: its served HTML, with no element a tenant's markup
    would make and no dialog opened. Returns the served HTML."""
    answer = page.goto(url)
    assert answer is not None and answer.status < 500, url
    html = answer.text()
    found = {"served markup": [m for m in ("<script", "<img src=x", "onerror=alert(1)>") if m in html],
             "elements": page.evaluate("document.querySelectorAll('script, img[src=x], [onerror]').length"),
             "ran": [*page.evaluate("window.__ran"), *ran]}
    assert found == {"served markup": [], "elements": 0, "ran": []}, url
    return html


def test_what_tenants_producers_and_receivers_write_is_shown_as_text_in_the_portal_and_the_console(portal: Portal):
    portal.receiver.script("/hook", Reply(200, body=HOSTILE, headers={"External-Id": HOSTILE, "X-Note": HOSTILE}))
    portal.receiver.script("/refuses", Reply(400, body=HOSTILE, headers={"X-Note": HOSTILE}))
    ran: list[str] = []
    with chromium() as browser:
        context = browser.new_context(viewport=VIEWPORTS["wide"], bypass_csp=True)  # escaping alone is tested
        context.add_init_script(WATCH)
        page = context.new_page()
        page.set_default_timeout(15_000)
        page.on("dialog", lambda dialog: (ran.append(f"{dialog.type}: {dialog.message}"), dialog.dismiss()))

        page.goto(minted(portal))
        page.wait_for_url(portal.url + "/portal")
        endpoints: dict[str, str] = {}
        for path in ("/hook", "/refuses"):  # the tenant's endpoint URLs carry markup in their query
            page.goto(portal.url + "/portal")
            added = page.locator("form[action='/portal/endpoints']")
            added.locator("input[name=url]").fill(f"{portal.receiver.url}{path}?q={HOSTILE}")
            added.locator("input[name=topics]").fill("invoice.*")
            added.get_by_role("button", name="Add").click()
            page.get_by_role("link", name="On to the endpoint").click()
            page.wait_for_url(f"{portal.url}/portal/endpoints/t-*")
            endpoints[path] = page.url.rsplit("/", 1)[1]
        tests: dict[str, str] = {}
        for path, endpoint in endpoints.items():
            page.goto(f"{portal.url}/portal/endpoints/{endpoint}")
            page.get_by_role("button", name="Send a test event").click()
            page.wait_for_url(f"{portal.url}/portal/deliveries/test~*")
            tests[path] = page.url.rsplit("/", 1)[1]
        with httpx.Client(base_url=portal.url, headers={"Authorization": f"Bearer {portal.producer}"}) as api:
            published = api.post("/v1/events", json={"event_id": "inv-1-paid", "scope": "acme",
                                                      "topic": "invoice.paid", "payload": {"note": HOSTILE}})
            assert published.status_code == 201, published.text
        fanned = f"evt~inv-1-paid~{endpoints['/hook']}"
        with httpx.Client(base_url=portal.url, headers={"Authorization": f"Bearer {portal.operator}"}) as api:
            for action_id in (*tests.values(), fanned):
                settled = api.get(f"/v1/intents/{action_id}", params={"scope": "acme", "wait": 20}).json()
                assert settled["status"] in ("delivered", "dead"), settled
        page.goto(portal.url + "/portal")  # a topic with markup, refused, and its refusal shown
        added = page.locator("form[action='/portal/endpoints']")
        added.locator("input[name=url]").fill("https://hooks.example/a")
        added.locator("input[name=topics]").fill(HOSTILE)
        added.get_by_role("button", name="Add").click()
        assert page.locator("h1").inner_text() == "Add an endpoint"
        assert page.evaluate("window.__ran") == [] and ran == []

        searched = quote(HOSTILE)
        shown = {  # each page, and whether it shows the markup (as text) or has none of it to show
            "/portal": True,
            f"/portal/endpoints/{endpoints['/hook']}": True,
            f"/portal/deliveries/{tests['/hook']}": True,
            f"/portal/deliveries/{tests['/refuses']}": True,
            f"/portal/deliveries/{fanned}": True,
            "/portal/deliveries": False,
            f"/portal/deliveries?topic={searched}&after={searched}": True,
        }
        served = {path: visit(page, portal.url + path, ran) for path in shown}
        assert {path: all(e in html for e in ESCAPED) for path, html in served.items()} == shown
        page.goto(f"{portal.url}/portal/deliveries/{tests['/hook']}")
        assert HOSTILE in page.locator("details", has_text="reply").locator("pre").inner_text()  # as text

        page.goto(portal.url + "/console/login")
        page.fill("input[name=token]", portal.operator)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(portal.url + "/console")
        shown = {
            "/console": False,
            "/console/destinations": False,
            f"/console/destinations/{endpoints['/hook']}": True,
            f"/console/destinations/{endpoints['/refuses']}": True,
            "/console/intents": False,
            f"/console/intents/{tests['/hook']}?scope=acme": True,
            f"/console/intents/{tests['/refuses']}?scope=acme": True,
            f"/console/intents/{fanned}?scope=acme": True,
            "/console/events": False,
            "/console/events/inv-1-paid?scope=acme": True,
            f"/console/events?topic={searched}": True,
            f"/console/intents?scope={searched}&destination={searched}": True,
        }
        served = {path: visit(page, portal.url + path, ran) for path in shown}
        assert {path: all(e in html for e in ESCAPED) for path, html in served.items()} == shown
        context.close()
