"""The console's intent page says what a pending intent of an ordered destination waits behind."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from outbox import DestinationSpec, Outbox, Role, Settings
from outbox.app.api import create_app

from ..conftest import SECRET
from ..servers import Served
from .signing import sign_in


def test_the_intent_page_says_behind_which_intent_it_waits_and_links_to_it(tmp_path: Path):
    db_url = f"sqlite:///{tmp_path / 'console.db'}"

    async def prepare() -> str:
        async with await Outbox.open(db_url) as box:
            await box.put_destination("billing", DestinationSpec(url="https://billing.example/", secret=SECRET,
                                                                 ordering="key"))
            for action_id in ("inv-1", "inv-2"):
                await box.enqueue(action_id=action_id, scope="acme", destination="billing", payload={},
                                  ordering_key="customer-7")
            operator, _ = await box.create_token(Role.OPERATOR)
        return operator

    operator = asyncio.run(prepare())
    served = Served(create_app(Settings(database_url=db_url, worker=False)))
    try:
        with httpx.Client(base_url=served.url, timeout=10) as http:
            sign_in(http, operator)
            waiting = http.get("/console/intents/inv-2").text
            first = http.get("/console/intents/inv-1").text
    finally:
        served.stop()
    assert "waiting <a href='/console/intents/inv-1?scope=acme'>behind inv-1 (pending)</a>" in waiting
    assert "waiting" not in first
