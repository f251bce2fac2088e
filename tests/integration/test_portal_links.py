"""The tenant portal's links, on each store: minted over HTTP by an admin or a producer of the scope
(a real uvicorn), stored by their token's hash only, opening once within ``portal_link_seconds``
and starting a session of the length and read-only flag the link says, bounded by
``portal_session_seconds``; revoking the minting token ends the session."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from outbox import InvalidInput, ManualClock, Outbox, Role, Settings
from outbox.tokens import hash_token

from ..conftest import rows


def link_token(minted: dict[str, Any]) -> str:
    return parse_qs(urlsplit(minted["url"]).query)["link"][0]


@pytest.fixture
async def served(store_url: str, serve_api: Callable[[Settings], str]) -> dict[str, Any]:
    settings = Settings(database_url=store_url, worker=False, portal_session_seconds=7200)
    async with await Outbox.open(store_url, settings=settings) as box:
        tokens = {"admin": (await box.create_token(Role.ADMIN))[0],
                  "acme": (await box.create_token(Role.PRODUCER, ["acme"]))[0],
                  "globex": (await box.create_token(Role.PRODUCER, ["globex"]))[0],
                  "operator": (await box.create_token(Role.OPERATOR))[0],
                  "tenant": (await box.create_token(Role.TENANT, ["acme"]))[0]}
    return {"url": serve_api(settings), "tokens": tokens, "settings": settings}


async def mint(served: dict[str, Any], caller: str, body: dict[str, Any] | None = None,
               scope: str = "acme") -> httpx.Response:
    async with httpx.AsyncClient(base_url=served["url"], timeout=30) as client:
        return await client.post(f"/v1/tenants/{scope}/portal-links", json=body or {},
                                 headers={"Authorization": f"Bearer {served['tokens'][caller]}"})


async def test_an_admin_or_a_producer_of_the_scope_mints_a_link_stored_by_its_hash_only(served, store_url):
    by_admin = await mint(served, "admin", {"session_seconds": 900, "read_only": True})
    assert by_admin.status_code == 201, by_admin.text
    assert by_admin.headers["cache-control"] == "no-store"
    minted = by_admin.json()
    assert minted["url"].startswith("/portal/open?link=")
    assert (minted["scope"], minted["session_seconds"], minted["read_only"]) == ("acme", 900, True)
    by_producer = await mint(served, "acme")
    assert by_producer.status_code == 201, by_producer.text
    assert by_producer.json()["session_seconds"] == 7200  # the setting, when the link asks for no length
    stored = await rows(store_url, "SELECT * FROM portal_links")
    assert len(stored) == 2
    for minted_token in (link_token(minted), link_token(by_producer.json())):
        assert not any(minted_token in str(row) for row in stored)
        assert any(hash_token(minted_token) in row for row in stored)


@pytest.mark.parametrize(("caller", "status"), [("globex", 403), ("operator", 403), ("tenant", 403)])
async def test_no_other_caller_mints_a_link(served, store_url, caller, status):
    answer = await mint(served, caller)
    assert answer.status_code == status, answer.text
    assert await rows(store_url, "SELECT * FROM portal_links") == []


async def test_a_session_longer_than_the_setting_allows_is_refused(served):
    answer = await mint(served, "admin", {"session_seconds": 7201})
    assert answer.status_code == 422, answer.text
    assert "portal_session_seconds" in answer.text


async def test_a_link_opens_once_within_its_minutes_and_its_session_ends_with_its_token(store_url):
    clock = ManualClock()
    settings = Settings(database_url=store_url, worker=False, portal_link_seconds=600)
    async with await Outbox.open(store_url, settings=settings, clock=clock) as box:
        producer = (await box.create_token(Role.PRODUCER, ["acme"]))[1]
        late, _ = await box.mint_portal_link(producer, "acme")
        token, _ = await box.mint_portal_link(producer, "acme", session_seconds=120, read_only=True)
        clock.advance(599)
        session_id, session = await box.open_portal_link(token)
        assert (session.scope, session.read_only) == ("acme", True)
        assert (session.expires_at - clock.now()).total_seconds() == 120
        assert await box.open_portal_link(token) is None  # used
        assert await box.portal_session(session_id) == session
        clock.advance(1)
        assert await box.open_portal_link(late) is None  # expired at 600 s
        clock.advance(119)
        assert await box.portal_session(session_id) is None  # its 120 s are over
        with pytest.raises(InvalidInput, match="60 to 3600"):
            await box.mint_portal_link(producer, "acme", session_seconds=3601)
        again, _ = await box.mint_portal_link(producer, "acme")
        reopened, _ = await box.open_portal_link(again)
        await box.revoke_token(producer.id)
        assert await box.portal_session(reopened) is None


async def test_the_python_clients_mint_links_that_open_once(served):
    """Both clients, as an admin and as a producer of the scope; a producer of another scope is
    Forbidden, and a session longer than the setting is InvalidInput."""
    from outbox import client

    with client.Client(served["url"], token=served["tokens"]["admin"]) as admin:
        by_admin = admin.portal_link("acme", session_seconds=900, read_only=True)
        with pytest.raises(client.InvalidInput, match="portal_session_seconds"):
            admin.portal_link("acme", session_seconds=7201)
    async with client.AsyncClient(served["url"], token=served["tokens"]["acme"]) as producer:
        by_producer = await producer.portal_link("acme")
        with pytest.raises(client.Forbidden):
            await producer.portal_link("globex")
    assert (by_admin["scope"], by_admin["session_seconds"], by_admin["read_only"]) == ("acme", 900, True)
    assert (by_producer["session_seconds"], by_producer["read_only"]) == (7200, False)
    async with httpx.AsyncClient(base_url=served["url"]) as browser:
        for minted in (by_admin, by_producer):
            assert (await browser.get(minted["url"])).status_code == 303
            assert (await browser.get(minted["url"])).status_code == 403  # once
