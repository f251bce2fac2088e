"""HEAD is answered wherever GET is (RFC 9110, section 9.3.2): the GET answer's status and
headers without its body, by a real uvicorn over a real SQLite file; where no GET route
matches, HEAD is a 405 problem as any other method is."""

from __future__ import annotations

import httpx

from outbox import Role, Settings
from outbox.app.api import create_app

from ..servers import Served


async def test_head_answers_as_get_without_a_body(box, db_url):
    producer, _ = await box.create_token(Role.PRODUCER, ["acme"])
    await box.enqueue(destination="billing", scope="acme", action_id="inv-1", payload={"n": 1})
    served = Served(create_app(Settings(database_url=db_url, worker=False)))
    try:
        async with httpx.AsyncClient(base_url=served.url, headers={"Authorization": f"Bearer {producer}"}) as c:
            for path in ("/healthz", "/openapi.json", "/docs", "/console/login", "/v1/intents/inv-1?scope=acme",
                         "/v1/intents"):
                get, head = await c.get(path), await c.head(path)
                assert get.status_code == head.status_code == 200, (path, head.status_code, head.text)
                assert head.content == b"", path
                assert head.headers["content-type"] == get.headers["content-type"], path
                if "content-length" in get.headers:
                    assert head.headers["content-length"] == get.headers["content-length"], path
            missing = await c.head("/v1/intents/nothing-here?scope=acme")
            unauthenticated = await httpx.AsyncClient(base_url=served.url).head("/v1/intents")
            batch = await c.head("/v1/intents:batch")
    finally:
        served.stop()
    assert missing.status_code == 404 and missing.content == b""
    assert unauthenticated.status_code == 401 and unauthenticated.headers["www-authenticate"]
    assert batch.status_code == 405 and batch.headers["allow"] == "POST"
