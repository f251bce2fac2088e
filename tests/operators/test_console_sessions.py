"""The console's sign-in, over a real uvicorn on loopback configured as ``outbox serve`` configures
it (``outbox.app.service.listening``): the cookie holds a server-side session id, never the token,
and the store only its hash; signing out, revoking the token and the session's end each close
it; the cookie is ``Secure`` over TLS (uvicorn's own, or a trusted proxy's) and only then; and
no other site's page can sign an operator in or out."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
from starlette.responses import HTMLResponse

from outbox import ManualClock, Outbox, Role, Settings
from outbox.app.api import create_app
from outbox.app.console import COOKIE, LOGIN_COOKIE, csrf_for
from outbox.app.service import listening

from ..servers import Served
from .conftest import OpenOps
from .signing import csrf, form_value, sign_in, signed_in
from .test_console_browser import chromium


@dataclass
class Site:
    url: str
    db: Path
    db_url: str
    operator: str
    operator_id: str
    admin: str
    ca: trustme.CA | None = None

    def client(self, **options: Any) -> httpx.Client:
        verify: Any = True
        if self.ca is not None:
            verify = ssl.create_default_context()
            self.ca.configure_trust(verify)
        return httpx.Client(base_url=self.url, timeout=10, verify=verify, **options)

    def sessions(self) -> list[tuple[str, str]]:
        """The stored sessions, as (id_hash, token_id)."""
        with sqlite3.connect(self.db) as conn:
            return conn.execute("SELECT id_hash, token_id FROM console_sessions ORDER BY created_at").fetchall()


OpenSite = Callable[..., Site]


@pytest.fixture
def open_site(tmp_path: Path) -> Iterator[OpenSite]:
    """Serve the API and console (no sender) with these settings, as ``outbox serve`` would."""
    servers: list[Served] = []

    def open_(*, tls: bool = False, **settings: Any) -> Site:
        db = tmp_path / f"console-{len(servers)}.db"
        db_url = f"sqlite:///{db}"
        ca = None
        if tls:
            ca = trustme.CA()
            issued = ca.issue_cert("127.0.0.1")
            cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
            issued.cert_chain_pems[0].write_to_path(cert)
            issued.private_key_pem.write_to_path(key)
            settings |= {"tls_certfile": cert, "tls_keyfile": key}

        async def prepare() -> tuple[str, str, str]:
            async with await Outbox.open(db_url) as box:
                operator, info = await box.create_token(Role.OPERATOR)
                admin, _ = await box.create_token(Role.ADMIN)
            return operator, info.id, admin

        operator, operator_id, admin = asyncio.run(prepare())
        chosen = Settings(database_url=db_url, worker=False, **settings)
        served = Served(create_app(chosen), **listening(chosen))
        servers.append(served)
        return Site(served.url, db, db_url, operator, operator_id, admin, ca)

    yield open_
    for served in servers:
        served.stop()


def cookie(answer: httpx.Response, name: str) -> tuple[str, set[str], dict[str, str]]:
    """The value a Set-Cookie of ``answer`` gives ``name``, its flags (lower case) and its
    attributes with values."""
    for header in answer.headers.get_list("set-cookie"):
        if header.startswith(f"{name}="):
            value, *parts = [part.strip() for part in header.split(";")]
            flags = {part.lower() for part in parts if "=" not in part}
            attributes = {k.lower(): v for k, _, v in (part.partition("=") for part in parts if "=" in part)}
            return value.partition("=")[2], flags, attributes
    raise AssertionError(f"no Set-Cookie for {name}: {answer.headers.get_list('set-cookie')}")


def test_the_cookie_holds_a_session_id_and_the_database_only_its_hash(open_site: OpenSite):
    site = open_site()
    with site.client() as http:
        signed = sign_in(http, site.operator)
        assert signed.status_code == 303 and signed.headers["location"] == "/console"
        session, flags, attributes = cookie(signed, COOKIE)
        assert http.get("/console").status_code == 200
    assert site.operator not in " ".join(signed.headers.get_list("set-cookie"))
    assert session != site.operator and not session.startswith("obx_") and len(session) >= 43
    assert {"httponly"} <= flags and attributes["samesite"].lower() == "strict"
    assert attributes["path"] == "/console" and attributes["max-age"] == str(8 * 3600)
    stored = site.sessions()
    assert stored == [(hashlib.sha256(session.encode()).hexdigest(), site.operator_id)]
    files = b"".join(path.read_bytes() for path in site.db.parent.glob(f"{site.db.name}*"))
    assert session.encode() not in files and site.operator.encode() not in files

    stolen = stored[0][0]  # what a copy of the database gives away opens nothing
    for value in (stolen, site.operator):  # nor does the token itself, which was the cookie
        with site.client(cookies={COOKIE: value}) as http:
            assert http.get("/console").headers["location"] == "/console/login", value
    with site.client(headers={"Authorization": f"Bearer {stolen}"}) as api:
        assert api.get("/v1/intents").status_code == 401


def test_signing_out_ends_the_session_on_the_server(open_site: OpenSite):
    site = open_site()
    with site.client() as http:
        sign_in(http, site.operator)
        session = http.cookies[COOKIE]
        no_value = http.post("/console/logout")
        wrong = http.post("/console/logout", data={"csrf": "0" * 32})
        assert (no_value.status_code, wrong.status_code) == (403, 403)
        assert http.get("/console").status_code == 200 and len(site.sessions()) == 1  # still signed in
        out = http.post("/console/logout", data={"csrf": csrf(http)})
    assert out.status_code == 303 and out.headers["location"] == "/console/login"
    assert cookie(out, COOKIE)[2]["max-age"] == "0"
    assert site.sessions() == []
    with site.client(cookies={COOKIE: session}) as replayed:  # the old cookie, kept by someone
        assert replayed.get("/console").headers["location"] == "/console/login"


def test_revoking_the_token_ends_its_sessions_at_once_from_any_process(open_site: OpenSite):
    site = open_site(token_cache_seconds=60)  # the API's token cache does not keep a session open
    with site.client() as http, site.client() as other:
        sign_in(http, site.operator)
        sign_in(other, site.operator)
        assert http.get("/console").status_code == 200 and other.get("/console").status_code == 200

        async def revoke() -> None:  # another process on the same database
            async with await Outbox.open(site.db_url) as box:
                await box.revoke_token(site.operator_id)

        asyncio.run(revoke())
        for client in (http, other):
            assert client.get("/console").headers["location"] == "/console/login"
        refused = sign_in(http, site.operator)
    assert refused.headers["location"] == "/console/login?error=refused"
    with site.client() as http:  # the next sign-in drops the revoked token's sessions
        assert sign_in(http, site.admin).status_code == 303
    assert [token for _, token in site.sessions()] != [] and site.operator_id not in dict(site.sessions()).values()


async def test_a_session_ends_when_its_time_is_up(open_ops: OpenOps):
    clock = ManualClock(datetime.now(UTC))
    ops = await open_ops(clock=clock, console_session_seconds=600)
    async with httpx.AsyncClient(base_url=ops.url, timeout=10) as http:
        answer = await signed_in(http, ops.operator)
        assert cookie(answer, COOKIE)[2]["max-age"] == "600"
        clock.advance(599)
        assert (await http.get("/console")).status_code == 200
        clock.advance(1)
        assert (await http.get("/console")).headers["location"] == "/console/login"
        assert (await signed_in(http, ops.operator)).headers["location"] == "/console"  # a new one starts afresh
        assert (await http.get("/console")).status_code == 200


def test_the_cookies_are_secure_over_direct_tls(open_site: OpenSite):
    site = open_site(tls=True)
    assert site.url.startswith("https://")
    with site.client() as http:
        form = http.get("/console/login")
        signed = http.post("/console/login", data={"token": site.operator, "csrf": form_value(form.text)})
        assert signed.status_code == 303 and http.get("/console").status_code == 200
    assert "secure" in cookie(form, LOGIN_COOKIE)[1]
    assert {"secure", "httponly"} <= cookie(signed, COOKIE)[1]


@pytest.mark.parametrize(("settings", "secure"), [
    ({}, False),  # the default: no proxy is believed
    ({"proxy_headers": True, "forwarded_allow_ips": "10.9.8.7,192.168.0.0/16"}, False),  # not this peer
    ({"proxy_headers": True, "forwarded_allow_ips": "127.0.0.1"}, True),
    ({"proxy_headers": True}, True),  # loopback, by default, once proxy headers are on
])
def test_the_cookies_are_secure_behind_a_trusted_proxy_only(open_site: OpenSite, settings: dict[str, Any],
                                                            secure: bool):
    """The test is the proxy: it sends from 127.0.0.1 with ``X-Forwarded-Proto: https``."""
    site = open_site(**settings)
    https = {"X-Forwarded-Proto": "https"}
    with site.client() as http:  # a Secure cookie is sent back by hand: httpx keeps it for https only
        form = http.get("/console/login", headers=https)
        value = form_value(form.text)
        signed = http.post("/console/login", data={"token": site.operator, "csrf": value},
                           headers=https | {"Cookie": f"{LOGIN_COOKIE}={cookie(form, LOGIN_COOKIE)[0]}"})
        session = cookie(signed, COOKIE)[0]
        out = http.post("/console/logout", data={"csrf": csrf_for(session)},
                        headers=https | {"Cookie": f"{COOKIE}={session}"})
        plain = sign_in(http, site.operator)
    assert signed.status_code == 303 and out.status_code == 303 and plain.status_code == 303
    for answer, name in ((form, LOGIN_COOKIE), (signed, COOKIE), (out, COOKIE)):
        assert ("secure" in cookie(answer, name)[1]) is secure, (answer.request.url.path, name)
    assert "secure" not in cookie(plain, COOKIE)[1]  # no X-Forwarded-Proto: plain HTTP


def test_a_sign_in_without_its_forms_value_is_refused(open_site: OpenSite):
    site = open_site()
    with site.client() as http:
        bare = http.post("/console/login", data={"token": site.operator})
        value = form_value(http.get("/console/login").text)
        wrong = http.post("/console/login", data={"token": site.operator, "csrf": value[::-1]})
    with site.client() as http:
        empty = http.post("/console/login", data={"token": site.operator, "csrf": ""},
                          headers={"Cookie": f"{LOGIN_COOKIE}="})
    with site.client() as elsewhere:  # the form's value without the cookie it was given with
        foreign = elsewhere.post("/console/login", data={"token": site.operator, "csrf": value})
    for answer in (bare, wrong, empty, foreign):
        assert answer.status_code == 403, answer.text
        assert COOKIE not in SimpleCookie(", ".join(answer.headers.get_list("set-cookie")))
        assert "the sign-in form was stale or not sent from this console" in answer.text
    assert site.sessions() == []


@pytest.mark.parametrize("headers", [
    {"Origin": "https://attacker.example"},
    {"Origin": "null"},
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site"},  # a sibling subdomain is another origin
    {"Sec-Fetch-Site": "cross-site", "Origin": "http://127.0.0.1"},  # what the browser says wins
])
def test_another_sites_page_can_neither_sign_in_nor_sign_out(open_site: OpenSite, headers: dict[str, str]):
    site = open_site()
    with site.client() as http:
        value = form_value(http.get("/console/login").text)
        sign_in_there = http.post("/console/login", data={"token": site.operator, "csrf": value}, headers=headers)
        assert sign_in_there.status_code == 403 and site.sessions() == []
        assert "not sent from the console's own pages" in sign_in_there.text
        signed = sign_in(http, site.operator, **{"Sec-Fetch-Site": "same-origin", "Origin": site.url})
        assert signed.status_code == 303
        sign_out_there = http.post("/console/logout", data={"csrf": csrf(http)}, headers=headers)
        action_there = http.post("/console/replay", data={"csrf": csrf(http), "reason": "x"}, headers=headers)
        assert (sign_out_there.status_code, action_there.status_code) == (403, 403)
        assert http.get("/console").status_code == 200 and len(site.sessions()) == 1
    for answer in (sign_in_there, sign_out_there):
        assert answer.headers["content-security-policy"].startswith("default-src 'none'")
        assert "set-cookie" not in answer.headers


def test_error_answers_under_the_console_are_pages_with_its_headers_and_escape_what_they_say(open_site: OpenSite):
    site = open_site()
    with site.client() as http:
        missing = http.get("/console/<script>alert(1)</script>")
        wrong_method = http.get("/console/logout")
        too_large = http.post("/console/login", content=b"token=" + b"x" * 100_000,
                              headers={"Content-Type": "application/x-www-form-urlencoded"})
        api = http.get("/v1/<script>")
    assert (missing.status_code, wrong_method.status_code, too_large.status_code) == (404, 405, 413)
    assert wrong_method.headers["allow"] == "POST"
    for answer in (missing, wrong_method, too_large):
        assert answer.headers["content-type"] == "text/html; charset=utf-8"
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["x-frame-options"] == "DENY"
        assert answer.headers["content-security-policy"].startswith("default-src 'none'")
        assert "<script" not in answer.text.lower()
    assert "there is no route /console/&lt;script&gt;alert(1)&lt;/script&gt;" in missing.text
    assert "<title>Not Found · outbox</title>" in missing.text
    assert "a console form is at most 65536 bytes" in too_large.text
    assert api.headers["content-type"] == "application/problem+json"  # the API's own stay problems


def test_a_page_elsewhere_cannot_sign_a_browser_in_with_its_own_token(open_site: OpenSite):
    """The login CSRF, in Chromium: a page on another site posts the sign-in form, with a token of
    the attacker's, as soon as it loads. Nothing signs in; the browser holds no session."""
    site = open_site()
    attack = (f"<!doctype html><form method='post' action='{site.url}/console/login'>"
              f"<input name='token' value='{site.admin}'><input name='csrf' value='guessed'></form>"
              "<script>document.forms[0].submit()</script>")

    async def attacker(scope: Any, receive: Any, send: Any) -> None:
        await HTMLResponse(attack)(scope, receive, send)

    elsewhere = Served(attacker)
    try:
        with chromium() as browser:
            context = browser.new_context()
            page = context.new_page()
            page.set_default_timeout(15_000)
            with page.expect_response(f"{site.url}/console/login") as posted:
                page.goto(f"http://localhost:{elsewhere.port}/")  # another site than 127.0.0.1
            assert posted.value.status == 403
            assert COOKIE not in [c["name"] for c in context.cookies()]
            page.goto(site.url + "/console")
            assert page.url == site.url + "/console/login"
    finally:
        elsewhere.stop()
    assert site.sessions() == []
