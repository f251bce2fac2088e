"""What the API refuses at the edge, served by a real uvicorn over a real SQLite file (and a real
PostgreSQL where the store decides): times that are not RFC 3339 strings with an offset or fall
outside the range the stores hold and the sender computes with, integers that are not JSON
integers, a name twice in one object, bodies that are not UTF-8, lone surrogates. Each is a
problem that names what is wrong, on a connection that stays open, and stores nothing; and an
unforeseen fault is a 500 problem on a connection that stays open too."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

import httpx
import pytest

from outbox import DestinationSpec, Outbox, Role, Settings
from outbox.app.api import create_app
from outbox.timestamps import LATEST

from ..conftest import SECRET, snapshot
from ..problems import assert_problem
from ..servers import Served
from .conftest import Api
from .test_api import INTENT

#: Times the API refuses, and words the refusal says.
BAD_TIMES = [
    ("0001-01-01T00:00:00+01:00", "outside the times"),  # before year 1 once the offset is applied
    ("9999-12-31T23:59:59-01:00", "outside the times"),  # after 9999 once the offset is applied
    ("9999-06-01T00:00:00Z", "outside the times"),  # a datetime, but no room for a lease or a backoff
    (0, "not a time"),  # read as the Unix epoch, once
    ("0", "not an RFC 3339 time"),
    ("1700000000", "not an RFC 3339 time"),
    (True, "not a time"),
    ("2030-02-30T00:00:00Z", "not a time"),
    ("2030-01-01T00:00:00+0100", "not an RFC 3339 time"),
]


class Connection:
    """One keep-alive HTTP/1.1 connection, spoken by hand: a pool would quietly open another
    when the server drops this one, which is what must show."""

    def __init__(self, url: str, token: str) -> None:
        where = urlsplit(url)
        self.sock = socket.create_connection((where.hostname, where.port), timeout=10)
        self.token = token
        self.pending = b""

    def request(self, method: str, path: str, body: bytes = b"") -> httpx.Response:
        """Send one request and read its answer, as an ``httpx.Response`` (nothing sent by httpx)."""
        head = (f"{method} {path} HTTP/1.1\r\nHost: outbox\r\nAuthorization: Bearer {self.token}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        self.sock.sendall(head + body)
        while b"\r\n\r\n" not in self.pending:
            self._more()
        raw, self.pending = self.pending.split(b"\r\n\r\n", 1)
        status_line, *lines = raw.decode("latin-1").split("\r\n")
        headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
        length = int(headers["content-length"])
        while len(self.pending) < length:
            self._more()
        answer, self.pending = self.pending[:length], self.pending[length:]
        return httpx.Response(int(status_line.split()[1]), headers=headers, content=answer)

    def _more(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self.pending += chunk

    def close(self) -> None:
        self.sock.close()


# -- times --------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["not_before", "expires_at"])
@pytest.mark.parametrize("value,words", BAD_TIMES)
async def test_an_intent_time_outside_the_range_or_not_rfc_3339_is_refused(api: Api, field, value, words):
    """The first two stored the row and answered 500 on SQLite; every later claim then failed."""
    before = snapshot(api.db_path)
    async with api.client(api.producer) as c:
        assert_problem(await c.post("/v1/intents", json={**INTENT, field: value}), 422, "invalid-input",
                       f"{field}: ")
        refused = await c.post("/v1/intents:batch", json={"intents": [{**INTENT, field: value}]})
        assert refused.status_code == 200
        [item] = refused.json()["results"]
        assert item["status"] == 422 and item["problem"]["errors"][0]["field"] == field
        assert words in item["problem"]["detail"], item
    assert snapshot(api.db_path) == before


@pytest.mark.parametrize("value,words", BAD_TIMES)
async def test_every_other_time_a_client_sends_is_held_to_the_same_rule(api: Api, value, words):
    """A grant's expiry, a listing's and a bulk replay's created_after/created_before."""
    before = snapshot(api.db_path)
    async with api.client(api.admin) as c:
        grant = await c.put("/v1/grants/g", json={"scope": "acme", "destination": "billing", "expires_at": value})
        assert_problem(grant, 422, "invalid-input", "expires_at: ")
        for name in ("created_after", "created_before"):
            replay = await c.post("/v1/replay", json={"reason": "r", "filter": {name: value}})
            assert_problem(replay, 422, "invalid-input", f"filter.{name}: ")
            listed = await c.get("/v1/intents", params={name: json.dumps(value) if not isinstance(value, str)
                                                         else value})
            assert_problem(listed, 422, "invalid-input", f"{name}: ")
    assert snapshot(api.db_path) == before


async def test_the_ends_of_the_range_are_taken_with_any_offset(api: Api):
    async with api.client(api.producer) as c:
        last = await c.post("/v1/intents", json={**INTENT, "action_id": "last",
                                                 "not_before": "9999-01-01T00:59:59.999999+01:00"})
        assert last.status_code == 201, last.text
        assert last.json()["not_before"] == last.json()["next_attempt_at"] == "9998-12-31T23:59:59.999999Z"
        first = await c.post("/v1/intents", json={**INTENT, "action_id": "first",
                                                  "expires_at": "0001-01-01T00:00:00z"})
        assert first.status_code == 201 and first.json()["expires_at"] == "0001-01-01T00:00:00Z"
        listed = await c.get("/v1/intents", params={"created_after": "0001-01-01T00:00:00Z",
                                                    "created_before": LATEST.isoformat()})
        assert [i["action_id"] for i in listed.json()["items"]] == ["first", "last"]


async def test_times_are_refused_on_postgresql_too(pg_url, serve_api):
    """There, both answered 500 (and stored nothing)."""
    async with await Outbox.open(pg_url) as box:
        await box.put_destination("billing", DestinationSpec(url="https://billing.example/", secret=SECRET))
        producer, _ = await box.create_token(Role.PRODUCER, ["acme"])
    url = serve_api(Settings(database_url=pg_url, worker=False))
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {producer}"}) as c:
        for field, value in (("expires_at", "0001-01-01T00:00:00+01:00"), ("not_before", "9999-12-31T23:59:59-01:00")):
            assert_problem(await c.post("/v1/intents", json={**INTENT, field: value}), 422, "invalid-input", field)
            batch = await c.post("/v1/intents:batch", json={"intents": [{**INTENT, field: value}]})
            assert batch.json()["results"][0]["status"] == 422
        assert (await c.get("/v1/intents")).json()["items"] == []


# -- integers -------------------------------------------------------------------------------------


WEBHOOK = {"url": "https://crm.example/", "secret": SECRET}
EMAIL = {"channel": "email", "host": "mx.example.com", "from": "a@example.com", "tls": "implicit"}
#: Where the API takes a number, and values that are not one of its kind: who sends, where, the
#: field, and the body around it.
NUMBERS = [
    *(("producer", "POST", "/v1/intents", "max_attempts", INTENT, v) for v in (True, "5", 5.0)),
    *(("admin", "PUT", "/v1/destinations/crm", "retention_seconds", WEBHOOK, v) for v in (True, "3600", 3600.0)),
    *(("admin", "PUT", "/v1/destinations/crm", "timeout_seconds", WEBHOOK, v) for v in (True, "5")),
    *(("admin", "PUT", "/v1/destinations/mail", "port", EMAIL, v) for v in (True, "465", 465.0)),
    *(("operator", "POST", "/v1/intents/x/approve", "valid_seconds", {"reason": "r", "payload_digest": "sha256:0"}, v)
      for v in (True, "60")),
]


@pytest.mark.parametrize("who,method,path,field,around,value", NUMBERS)
async def test_integers_are_json_integers_and_numbers_json_numbers(api: Api, who, method, path, field, around,
                                                                    value):
    """true, "5" and 5.0 were taken as 1 and 5."""
    before = snapshot(api.db_path)
    async with api.client(getattr(api, who)) as c:
        refused = await c.request(method, path, json={**around, field: value})
        assert_problem(refused, 422, "invalid-input", field)
    assert snapshot(api.db_path) == before


# -- the JSON itself ------------------------------------------------------------------------------


@pytest.mark.parametrize("body,name", [
    (b'{"scope": "beta", "scope": "acme", "destination": "billing", "payload": {}}', "scope"),
    (b'{"scope": "acme", "destination": "billing", "payload": {"amount": 1, "amount": 1000}}', "amount"),
    (b'{"intents": [{"scope": "acme", "destination": "billing", "payload": {}, "payload": []}]}', "payload"),
])
async def test_a_name_twice_in_one_object_is_refused(api: Api, body, name):
    """The first created an acme intent: the last name won, where another parser takes the first."""
    before = snapshot(api.db_path)
    async with api.client(api.producer) as c:
        path = "/v1/intents:batch" if body.startswith(b'{"intents"') else "/v1/intents"
        refused = await c.post(path, content=body, headers={"content-type": "application/json"})
        assert_problem(refused, 422, "invalid-input", f"names {name!r} twice")
    async with api.client(api.admin) as c:
        twice = b'{"url": "https://a.example/", "url": "https://b.example/", "secret": "' + SECRET.encode() + b'"}'
        assert_problem(await c.put("/v1/destinations/twice", content=twice,
                                   headers={"content-type": "application/json"}), 422, "invalid-input", "'url' twice")
    assert snapshot(api.db_path) == before


@pytest.mark.parametrize("body,words", [
    (json.dumps(INTENT).encode("utf-16"), "UTF-8"),  # with its byte order mark
    (json.dumps(INTENT).encode("utf-16-le"), "not JSON"),
    (json.dumps(INTENT).encode("utf-32"), "UTF-8"),
    (b"\xef\xbb\xbf" + json.dumps(INTENT).encode(), "BOM"),
    (json.dumps(INTENT).replace("acme", "acm\u00e9").encode("latin-1"), "UTF-8"),
])
async def test_a_body_that_is_not_utf_8_is_refused(api: Api, body, words):
    """UTF-16 and UTF-32 (which Python's json reads from bytes) and a byte order mark were taken."""
    before = snapshot(api.db_path)
    async with api.client(api.producer) as c:
        refused = await c.post("/v1/intents", content=body, headers={"content-type": "application/json"})
        assert_problem(refused, 400, "invalid-json", words)
    assert snapshot(api.db_path) == before


@pytest.mark.parametrize("body", [
    b'{"scope": "acme", "destination": "billing", "payload": {"\\udfff": 1}}',
    b'{"scope": "acme", "destination": "billing", "payload": ["\\ud800"]}',
    b'{"scope": "acme", "destination": "billing", "payload": {"note": "\\ude00\\ud83d"}}',
    b'{"scope": "acme", "destination": "billing", "payload": {}, "ordering_key": "k\\udc00"}',
])
async def test_a_lone_surrogate_is_refused_on_a_connection_that_stays_open(api: Api, body):
    """It was a 500 (the digest cannot encode it), and the 500 escaped the app: uvicorn dropped
    the connection, so the client's next request on it was reset."""
    before = snapshot(api.db_path)
    connection = Connection(api.url, api.producer)
    try:
        assert_problem(connection.request("POST", "/v1/intents", body), 422, "invalid-input", "lone surrogate")
        listed = connection.request("GET", "/v1/intents")
        assert listed.status_code == 200 and listed.json()["items"] == []
    finally:
        connection.close()
    assert snapshot(api.db_path) == before


async def test_a_surrogate_pair_is_one_character_and_taken(api: Api):
    body = b'{"scope": "acme", "destination": "billing", "payload": {"\\ud83d\\ude00": "\\\\ud800"}}'
    async with api.client(api.producer) as c:
        created = await c.post("/v1/intents", content=body, headers={"content-type": "application/json"})
        assert created.status_code == 201, created.text
        assert created.json()["payload"] == {"\U0001F600": "\\ud800"}  # (the second: an escaped backslash)


# -- an unforeseen fault --------------------------------------------------------------------------


async def test_an_unforeseen_fault_is_a_500_problem_on_a_connection_that_stays_open(db_url, caplog):
    async with await Outbox.open(db_url) as box:
        operator, _ = await box.create_token(Role.OPERATOR)

        async def broken(*args: object, **kwargs: object) -> None:
            raise RuntimeError("injected fault")

        box.store.list_intents = broken  # type: ignore[method-assign]
        served = Served(create_app(outbox=box))
        connection = Connection(served.url, operator)
        try:
            failed = connection.request("GET", "/v1/intents")
            assert_problem(failed, 500, "internal", "in its log")
            assert "injected" not in failed.text
            assert failed.headers.get("connection", "keep-alive") != "close"
            health = connection.request("GET", "/healthz")
            assert health.status_code == 200 and health.json() == {"status": "ok"}
        finally:
            connection.close()
            served.stop()
    assert any(r.exc_info and "injected fault" in str(r.exc_info[1]) for r in caplog.records
               if r.name == "outbox.api")
