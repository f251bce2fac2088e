"""The console's pages cannot be framed, leak no URL in a Referer, run no script and load nothing
but their own stylesheet, and a link cannot put words on them. Served by a real uvicorn as
``outbox serve`` serves it (the session cookie, TLS and proxies: ``test_console_sessions``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from outbox import DestinationSpec, Outbox, Role, Settings
from outbox.app.api import create_app
from outbox.app.service import listening

from ..conftest import SECRET
from ..servers import Served
from .signing import csrf, sign_in
from .test_console_browser import chromium


@dataclass
class Site:
    url: str
    operator: str


def _served(db_url: str, prepare: Callable[[Outbox], Awaitable[None]]) -> Iterator[Site]:
    """The service without a sender on ``db_url``, after ``prepare`` (and an operator token)."""
    async def prepared() -> str:
        async with await Outbox.open(db_url) as box:
            await prepare(box)
            operator, _ = await box.create_token(Role.OPERATOR)
        return operator

    operator = asyncio.run(prepared())
    settings = Settings(database_url=db_url, worker=False)
    served = Served(create_app(settings), **listening(settings))
    try:
        yield Site(served.url, operator)
    finally:
        served.stop()


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    """The service with one pending intent and an operator token."""
    async def prepare(box: Outbox) -> None:
        await box.put_destination("billing", DestinationSpec(url="https://billing.example/", secret=SECRET))
        await box.enqueue(action_id="inv-1", scope="acme", destination="billing", payload={"n": 1})

    yield from _served(f"sqlite:///{tmp_path / 'console.db'}", prepare)


def _directives(policy: str) -> dict[str, str]:
    return {part.strip().split(" ", 1)[0]: part.strip().partition(" ")[2] for part in policy.split(";")}


def test_every_console_answer_forbids_framing_referrers_and_inline_code(site: Site):
    with httpx.Client(base_url=site.url, timeout=10) as http:
        answers = [http.get("/console"), http.get("/console/login"), http.get("/console/style.css")]
        answers.append(http.post("/console/login", data={"token": site.operator}))  # without the form's value
        answers.append(sign_in(http, site.operator))
        answers += [http.get("/console"), http.get("/console/intents/inv-1"), http.get("/console/intents/nope")]
        answers.append(http.post("/console/intents/inv-1/cancel", data={"reason": "x", "csrf": "forged"}))
        answers += [http.get("/console/nowhere"), http.get("/console/logout"),
                    http.post("/console/logout", headers={"Sec-Fetch-Site": "cross-site"})]
    assert [a.status_code for a in answers] == [303, 200, 200, 403, 303, 200, 200, 404, 403, 404, 405, 403]
    for answer in answers:
        where = answer.request.url.path
        assert answer.headers["x-frame-options"] == "DENY", where
        assert answer.headers["referrer-policy"] == "no-referrer", where
        policy = _directives(answer.headers["content-security-policy"])
        assert policy["frame-ancestors"] == "'none'" and policy["default-src"] == "'none'", where
        assert policy["style-src"] == "'self'" and "script-src" not in policy, where
        assert "unsafe" not in answer.headers["content-security-policy"]
        if answer.headers.get("content-type", "").startswith("text/html"):
            page = answer.text.lower()
            assert "<style" not in page and " style=" not in page and "<script" not in page, where
            assert "<link rel='stylesheet' href='/console/style.css'>" in page, where
    assert answers[2].headers["content-type"] == "text/css; charset=utf-8"
    assert "header{" in answers[2].text


def test_the_console_renders_under_its_policy_in_a_browser(site: Site):
    """Chromium reports a violation of the page's Content-Security-Policy on its console; there
    is none, and the stylesheet the policy allows is applied."""
    with chromium() as browser:
        page = browser.new_context().new_page()
        page.set_default_timeout(15_000)
        messages: list[str] = []
        page.on("console", lambda message: messages.append(message.text))
        page.on("pageerror", lambda error: messages.append(str(error)))
        page.goto(site.url + "/console/login")
        page.fill("input[name=token]", site.operator)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(site.url + "/console")
        page.goto(site.url + "/console/intents/inv-1")
        assert page.locator("h1").inner_text() == "Intent inv-1"
        background = page.evaluate("getComputedStyle(document.querySelector('header')).backgroundColor")
        assert background == "rgb(36, 41, 47)"  # from /console/style.css
        margin = page.evaluate("getComputedStyle(document.querySelector('header form')).marginTop")
        assert margin == "0px"
        page.get_by_role("button", name="Sign out").click()
        page.wait_for_url(site.url + "/console/login")
    assert not [m for m in messages if "Content Security Policy" in m or "Refused" in m], messages


def test_a_link_cannot_put_words_of_its_own_on_a_console_page(site: Site):
    """What a page says after a redirect comes from a code in its URL and a table of the console's
    own sentences: an unknown code, or text, shows nothing. A failed action's message is the
    server's, drawn in the answer to its form, never carried in a URL."""
    planted = "Session expired: call +1 555 0100 and read your token out"
    with httpx.Client(base_url=site.url, timeout=10) as http:
        refused = http.get("/console/login", params={"error": planted})
        named = http.get("/console/login", params={"error": "refused"})
        sign_in(http, site.operator)
        pages = [http.get("/console", params={"done": planted}),
                 http.get("/console/intents/inv-1", params={"done": planted, "error": planted}),
                 http.get("/console/intents/inv-1", params={"done": "cancel done"})]
        done = http.get("/console/intents/inv-1", params={"done": "cancel"})
        value = csrf(http)
        not_now = http.post("/console/intents/inv-1/replay", data={"csrf": value, "reason": "try"})
        no_reason = http.post("/console/intents/inv-1/cancel", data={"csrf": value, "reason": " "})
        cancelled = http.post("/console/intents/inv-1/cancel", data={"csrf": value, "reason": "not wanted"})
    for answer in (refused, *pages):
        assert answer.status_code == 200 and "Session expired" not in answer.text and "flash" not in answer.text
    assert "<p class='flash error'>that is not an operator or admin token</p>" in named.text
    assert "<p class='flash'>cancel done</p>" in done.text
    assert not_now.status_code == 409 and "location" not in not_now.headers
    assert "<p class='flash error'>only dead, revoked or unknown intents can be replayed; &#39;inv-1&#39; is " \
           "pending</p>" in not_now.text
    assert no_reason.status_code == 422 and "say why: operator actions are recorded with a reason" in no_reason.text
    assert "<h1>Intent inv-1</h1>" in no_reason.text
    assert cancelled.status_code == 303 and cancelled.headers["location"] == "/console/intents/inv-1?done=cancel"


HOSTILE = "<script>alert(1)</script>"


@pytest.fixture
def hostile(tmp_path: Path) -> Iterator[Site]:
    """The service with user text that is markup wherever the API lets it be: a destination's URL,
    an intent's payload, an event's payload and its publisher's name."""
    async def prepare(box: Outbox) -> None:
        await box.put_destination("billing", DestinationSpec(url=f"https://billing.example/?q={HOSTILE}",
                                                             secret=SECRET))
        await box.enqueue(action_id="inv-1", scope="acme", destination="billing", payload={"note": HOSTILE})
        await box.publish(scope="acme", topic="invoice.paid", event_id="ev-1", payload={"note": HOSTILE},
                          actor=HOSTILE)

    yield from _served(f"sqlite:///{tmp_path / 'hostile.db'}", prepare)


def test_hostile_user_text_is_escaped_on_every_page_that_shows_it(hostile: Site):
    """Each page that shows text a producer, an operator or a link gave (an operator's reason, a
    payload, a destination's URL, a search's words) shows it as text, never as markup."""
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;"
    with httpx.Client(base_url=hostile.url, timeout=10) as http:
        sign_in(http, hostile.operator)
        cancelled = http.post("/console/intents/inv-1/cancel", data={"csrf": csrf(http), "reason": HOSTILE})
        assert cancelled.status_code == 303
        showing = {path: http.get(path, params=params) for path, params in (
            ("/console/intents/inv-1", {}), ("/console/destinations/billing", {}),
            ("/console/events/ev-1", {"scope": "acme"}), ("/console/events", {"topic": HOSTILE}),
            ("/console/intents", {"q": HOSTILE}), ("/console/replay", {"destination": HOSTILE}))}
        listing = [http.get(path) for path in ("/console", "/console/intents", "/console/destinations",
                                                "/console/events", "/console/intents?status=cancelled")]
    for path, answer in showing.items():
        assert escaped in answer.text, path
    for answer in (*showing.values(), *listing):
        assert answer.status_code in (200, 400), answer.request.url
        assert "<script" not in answer.text.lower(), answer.request.url
