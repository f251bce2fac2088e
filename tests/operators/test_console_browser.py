"""The operator console in a real headless Chromium (Debian's, driven by Playwright): sign in,
find a dead letter, replay it once the receiver is fixed, and watch it become delivered.

Needs ``pip install playwright`` and ``apt-get install chromium`` (never ``playwright install``).
Without them the browser tests skip on a developer's machine and fail under CI=true.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from outbox import DestinationSpec, Outbox, Role, Settings
from outbox.app.console import LOGIN_COOKIE
from outbox.app.service import create_service

from ..conftest import SECRET
from ..receiver import Receiver, Reply
from ..servers import Served
from .conftest import Switch
from .signing import sign_in

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


def _unavailable(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"the console's browser test cannot run in CI: {why}")
    pytest.skip(why)


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium browser (Debian's binary), or fail under CI / skip elsewhere."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the playwright package is not installed (pip install playwright)")
    if not os.access(CHROMIUM, os.X_OK):
        _unavailable(f"{CHROMIUM} is missing (apt-get install chromium)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class Console:
    url: str
    operator: str
    operator_actor: str
    producer: str
    switch: Switch
    receiver: Receiver


@pytest.fixture
def console(tmp_path: Path) -> Iterator[Console]:
    """The service (API, console and embedded worker; authority allow-all) on a real SQLite
    file, and a receiver that answers 503 until it is fixed."""
    receiver = Receiver().start()
    switch = Switch()
    receiver.script("/hook", switch)
    receiver.script("/ledger", Reply(200))
    receiver.script("/slow/a/rather/long/path/that/names/the/tenant/and/the/invoice/service", Reply(200, delay=2))
    db_url = f"sqlite:///{tmp_path / 'console.db'}"

    async def prepare() -> tuple[str, str, str]:
        async with await Outbox.open(db_url) as box:
            await box.put_destination("billing", DestinationSpec(
                url=receiver.url + "/hook", secret=SECRET, allow_private_network=True, timeout_seconds=2))
            await box.put_destination("slow", DestinationSpec(
                url=receiver.url + "/slow/a/rather/long/path/that/names/the/tenant/and/the/invoice/service",
                secret=SECRET, allow_private_network=True, timeout_seconds=0.3))
            await box.put_destination("ledger", DestinationSpec(  # an event's subscriber, with flow control
                url=receiver.url + "/ledger", secret=SECRET, allow_private_network=True,
                subscriptions=[{"topic": "invoice.*"}], rate_limit={"per_second": 50, "burst": 10},
                max_in_flight=4))
            operator, info = await box.create_token(Role.OPERATOR, label="on call")
            producer, _ = await box.create_token(Role.PRODUCER, ["acme"])
        return operator, info.actor, producer

    operator, actor, producer = asyncio.run(prepare())
    served = Served(create_service(Settings(database_url=db_url, worker=True, authority="allow-all")))
    try:
        yield Console(served.url, operator, actor, producer, switch, receiver)
    finally:
        served.stop()
        receiver.stop()


def _dead_letter(c: Console, action_id: str) -> dict[str, Any]:
    with httpx.Client(base_url=c.url, headers={"Authorization": f"Bearer {c.producer}"}, timeout=30) as http:
        created = http.post("/v1/intents", json={
            "action_id": action_id, "scope": "acme", "destination": "billing", "max_attempts": 1,
            "payload": {"invoice": 42, "note": "<b>not bold</b>"}})
        assert created.status_code == 201, created.text
        dead = http.get(f"/v1/intents/{action_id}", params={"wait": 20}).json()
    assert dead["status"] == "dead", dead
    return dead


def test_an_operator_replays_a_dead_letter_from_the_console(console: Console, tmp_path: Path):
    _dead_letter(console, "inv-42-send")
    with chromium() as browser:
        page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        page.set_default_timeout(15_000)

        page.goto(console.url + "/console")  # not signed in: sent to the sign-in page
        page.wait_for_url(console.url + "/console/login")
        page.fill("input[name=token]", console.operator)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(console.url + "/console")
        assert page.locator("h1").inner_text() == "Overview"

        dead_letters = page.locator("h2#dead + .scroll table")
        link = dead_letters.get_by_role("link", name="inv-42-send")
        assert link.count() == 1
        assert "attempts exhausted" in dead_letters.inner_text()
        link.click()
        page.wait_for_url(console.url + "/console/intents/inv-42-send?scope=acme")
        assert page.locator("main > p .pill").first.inner_text() == "dead"
        assert "<b>not bold</b>" in page.locator("pre").first.inner_text()  # shown as text, never as markup
        assert page.locator("pre b").count() == 0

        console.switch.fix()
        replay = page.locator("form[action*='/replay?']")
        replay.locator("input[name=reason]").fill("billing back after INC-4711")
        replay.get_by_role("button", name="Replay").click()
        page.wait_for_url("**/console/intents/inv-42-send?scope=acme&done=replay")
        assert page.locator(".flash").first.inner_text() == "replay done"

        deadline = time.monotonic() + 20
        while page.locator("main > p .pill").first.inner_text() != "delivered":
            assert time.monotonic() < deadline, "the replayed intent was not delivered in 20 s"
            page.wait_for_timeout(200)
            page.reload()
        timeline = page.locator("h2:text('Timeline') + .scroll table").inner_text()
        assert "replayed" in timeline and "billing back after INC-4711" in timeline
        assert console.operator_actor in timeline
        assert "rcpt-inv-42-send" in page.locator("h2:text('Attempts') ~ .scroll table").first.inner_text()
        assert page.locator("form[action$='/replay']").count() == 0  # nothing left to replay

        shot = tmp_path / "intent-delivered.png"
        page.screenshot(path=str(shot), full_page=True)
    assert shot.exists() and shot.stat().st_size > 10_000
    assert console.switch.answers == [("inv-42-send", 503), ("inv-42-send", 200)]


def test_a_producer_token_cannot_sign_in(console: Console):
    with chromium() as browser:
        context = browser.new_context()
        page = context.new_page()
        page.set_default_timeout(15_000)
        page.goto(console.url + "/console/login")
        page.fill("input[name=token]", console.producer)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url("**/console/login?error=refused")
        assert page.locator(".flash.error").inner_text() == "that is not an operator or admin token"
        assert [c["name"] for c in context.cookies()] == [LOGIN_COOKIE]  # the form's, no session
        page.goto(console.url + "/console")
        page.wait_for_url(console.url + "/console/login")

        page.fill("input[name=token]", "obx_00000000_forged")
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url("**/console/login?error=refused")
        assert page.locator(".flash.error").is_visible()


def test_a_console_action_without_the_form_csrf_value_is_refused(console: Console):
    dead = _dead_letter(console, "inv-43-send")
    with httpx.Client(base_url=console.url, timeout=10, follow_redirects=False) as http:
        signed_in = sign_in(http, console.operator)
        assert signed_in.status_code == 303 and signed_in.headers["location"] == "/console"
        forged = http.post("/console/intents/inv-43-send/replay", data={"reason": "forged", "csrf": "x" * 32})
        assert forged.status_code == 403 and "stale" in forged.text
        page = http.get("/console/intents/inv-43-send")
        assert page.status_code == 200 and "inv-43-send" in page.text
    with httpx.Client(base_url=console.url, headers={"Authorization": f"Bearer {console.operator}"}) as api:
        assert api.get("/v1/intents/inv-43-send").json()["events"] == dead["events"]


#: Where the browser tests' screenshots are kept for people to look at (CI keeps the directory
#: as an artefact; git ignores it): the console's under ``console``, the portal's under ``portal``.
ARTIFACTS = Path(os.environ.get("OUTBOX_TEST_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts"))
SCREENSHOTS = ARTIFACTS / "console"
VIEWPORTS = {"narrow": {"width": 390, "height": 844}, "wide": {"width": 1440, "height": 900}}


def _timed_out(c: Console, action_id: str) -> None:
    """An intent to "slow" whose one attempt timed out: outcome unknown (a duplicate risk)."""
    with httpx.Client(base_url=c.url, headers={"Authorization": f"Bearer {c.producer}"}, timeout=30) as http:
        created = http.post("/v1/intents", json={
            "action_id": action_id, "scope": "acme", "destination": "slow", "payload": {"invoice": 43}})
        assert created.status_code == 201, created.text
        unknown = http.get(f"/v1/intents/{action_id}", params={"wait": 20}).json()
    assert unknown["status"] == "unknown", unknown


def _published(c: Console, event_id: str) -> None:
    """An event of topic invoice.paid, fanned out to "ledger" and delivered there."""
    with httpx.Client(base_url=c.url, headers={"Authorization": f"Bearer {c.producer}"}, timeout=30) as http:
        published = http.post("/v1/events", json={
            "event_id": event_id, "scope": "acme", "topic": "invoice.paid", "payload": {"invoice": 60}})
        assert published.status_code == 201, published.text
        delivered = http.get(f"/v1/intents/evt~{event_id}~ledger", params={"wait": 20}).json()
    assert delivered["status"] == "delivered", delivered


def test_every_console_page_reads_at_a_narrow_and_a_wide_viewport(console: Console):
    _published(console, "inv-60-paid")
    _dead_letter(console, "inv-50-send")
    _dead_letter(console, "inv-51-send")
    _timed_out(console, "0193a5f2-7c1e-7d44-9e0b-5f7a1c2d3e4f-invoice-44-send")
    pages = {"overview": ("/console", "dead"),
             "search": ("/console/intents?status=dead", "inv-51-send"),
             "destination": ("/console/destinations/billing", "Last errors"),
             "intent": ("/console/intents/inv-50-send?scope=acme", "receiver answered 503"),
             "unknown": ("/console/intents/0193a5f2-7c1e-7d44-9e0b-5f7a1c2d3e4f-invoice-44-send?scope=acme",
                         "Timeout on reading data from socket"),
             "replay": ("/console/replay", "Duplicate risk: 1 of these 3 intents"),
             "events": ("/console/events?topic=invoice.*", "inv-60-paid"),
             "event": ("/console/events/inv-60-paid?scope=acme", "evt~inv-60-paid~ledger"),
             "limits": ("/console/destinations/ledger", "at most 4 in flight")}
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with chromium() as browser:
        for name, viewport in VIEWPORTS.items():
            context = browser.new_context(viewport=viewport)
            page = context.new_page()
            page.set_default_timeout(15_000)
            page.goto(console.url + "/console/login")
            page.fill("input[name=token]", console.operator)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(console.url + "/console")
            for title, (path, key) in pages.items():
                page.goto(console.url + path)
                # nothing wider than the screen: tables fit, or stack into cards on a phone
                width = page.evaluate("[document.scrollingElement.scrollWidth, window.innerWidth]")
                assert width[0] <= width[1], (name, title, width)
                assert page.get_by_text(key).first.is_visible(), (name, title, key)
                shot = SCREENSHOTS / f"{title}-{name}.png"
                page.screenshot(path=str(shot), full_page=True)
                assert shot.stat().st_size > 10_000
            page.goto(console.url + "/console")
            for chart in page.locator("figure svg").all():
                box = chart.bounding_box()
                assert box is not None and 100 < box["width"] <= viewport["width"] and box["height"] > 20
            assert "3 failed" in page.locator("figcaption").first.inner_text()
            headline = page.locator("ul.headline")
            assert headline.is_visible() and "2dead" in headline.inner_text().replace(" ", "").replace("\n", "")
            health = page.locator("h2:text('Destinations (last hour)') + .scroll table").inner_text()
            assert "billing" in health and "closed" in health  # the embedded sender's circuit
            page.goto(console.url + "/console/intents/inv-50-send?scope=acme")
            reply = page.locator("tr.more pre").first  # the reply, across the table's width
            box = reply.bounding_box()
            assert reply.is_visible() and box is not None and box["x"] + box["width"] <= viewport["width"]
            page.goto(console.url + "/console/replay")
            assert page.locator("h2").first.inner_text() == "Dry run: 3 intents match"
            assert page.locator("#duplicate-risk").is_visible()
            context.close()
