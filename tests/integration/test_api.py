"""The HTTP API served by a real uvicorn on loopback, over a real SQLite file."""

from __future__ import annotations

import base64
import json
import logging
import time

import httpx
import pytest

from outbox import Outbox, Role, Settings
from outbox.app.api import create_app

from ..conftest import SECRET, snapshot
from ..problems import assert_problem
from .conftest import Api

INTENT = {"scope": "acme", "destination": "billing", "payload": {"invoice": 42, "lines": [1, 2]}}


async def test_enqueue_is_idempotent_on_action_id(api: Api):
    async with api.client(api.producer) as c:
        created = await c.post("/v1/intents", json={**INTENT, "action_id": "inv-42"})
        assert created.status_code == 201
        assert created.headers["location"] == "/v1/intents/inv-42?scope=acme"
        body = created.json()
        assert body["status"] == "pending" and body["payload"] == INTENT["payload"]
        same = await c.post("/v1/intents", json={**INTENT, "action_id": "inv-42",
                                                 "payload": {"lines": [1, 2], "invoice": 42}})
        assert same.status_code == 200 and same.json()["payload_digest"] == body["payload_digest"]
        other = await c.post("/v1/intents", json={**INTENT, "action_id": "inv-42", "payload": {"invoice": 43}})
        assert_problem(other, 409, "intent-conflict", "payload_digest")
        other_scope = await c.post("/v1/intents", json={**INTENT, "action_id": "inv-42", "scope": "shop"})
        assert other_scope.status_code == 201 and other_scope.json()["idempotency_key"] == "shop/inv-42"


async def test_one_tenant_can_neither_block_nor_learn_of_another_tenants_action_ids(api: Api):
    """Action ids are unique per scope: a tenant posting an id another tenant uses gets its own
    intent, and no answer names or confirms the other scope."""
    async with await Outbox.open(f"sqlite:///{api.db_path}") as box:
        rival, _ = await box.create_token(Role.PRODUCER, ["rival"])
    async with api.client(api.producer) as ours, api.client(rival) as theirs:
        assert (await ours.post("/v1/intents", json={**INTENT, "action_id": "inv-7"})).status_code == 201
        squat = await theirs.post("/v1/intents", json={**INTENT, "scope": "rival", "action_id": "inv-7",
                                                       "payload": {"squat": True}})
        assert squat.status_code == 201 and "acme" not in squat.text
        again = await theirs.post("/v1/intents", json={**INTENT, "scope": "rival", "action_id": "inv-7",
                                                       "payload": {"other": 1}})
        assert_problem(again, 409, "intent-conflict", "in scope 'rival'")
        assert "acme" not in again.text
        mine = (await theirs.get("/v1/intents/inv-7")).json()
        assert (mine["scope"], mine["payload"]) == ("rival", {"squat": True})
        assert (await ours.get("/v1/intents/inv-7")).json()["payload"] == INTENT["payload"]
        assert_problem(await theirs.get("/v1/intents/inv-7?scope=acme"), 404, "not-found")
    async with api.client(api.operator) as operator:
        both = await operator.get("/v1/intents/inv-7")
        assert_problem(both, 409, "ambiguous-action-id", "name the scope")
        assert (await operator.get("/v1/intents/inv-7?scope=rival")).json()["payload"] == {"squat": True}


async def test_show_has_attempts_and_events(api: Api):
    async with api.client(api.producer) as c:
        await c.post("/v1/intents", json={**INTENT, "action_id": "inv-1"})
        shown = (await c.get("/v1/intents/inv-1")).json()
    assert shown["action_id"] == "inv-1" and shown["attempts"] == []
    assert [e["kind"] for e in shown["events"]] == ["enqueued"]
    assert shown["events"][0]["actor"].startswith("token:")


async def test_list_filters_and_paginates_with_a_cursor(api: Api):
    async with api.client(api.producer) as c:
        for i in range(5):
            await c.post("/v1/intents", json={**INTENT, "action_id": f"p-{i}",
                                              "scope": "shop" if i == 4 else "acme"})
        seen, cursor = [], None
        while True:
            page = (await c.get("/v1/intents", params={"limit": 2, **({"cursor": cursor} if cursor else {})})).json()
            seen += [i["action_id"] for i in page["items"]]
            if not (cursor := page["next_cursor"]):
                break
        assert seen == ["p-4", "p-3", "p-2", "p-1", "p-0"]
        only = (await c.get("/v1/intents", params={"scope": "shop", "status": "pending"})).json()
        assert [i["action_id"] for i in only["items"]] == ["p-4"]
        assert_problem(await c.get("/v1/intents", params={"cursor": "@@"}), 400, "bad-cursor")
        huge = base64.urlsafe_b64encode(b"seq:99999999999999999999").decode()
        assert_problem(await c.get("/v1/intents", params={"cursor": huge}), 400, "bad-cursor")
        assert_problem(await c.get("/v1/intents", params={"status": "lost"}), 422, "invalid-input", "status")
        assert_problem(await c.get("/v1/intents", params={"limit": 501}), 422, "invalid-input", "limit")
    async with api.client(api.operator) as operator:  # reads every scope: the store would meet the NUL
        assert_problem(await operator.get("/v1/intents", params={"scope": "acme\x00"}), 422, "invalid-input",
                       "scope")


async def test_producers_stay_inside_their_scopes(api: Api):
    async with api.client(api.admin) as admin:
        created = await admin.post("/v1/intents", json={**INTENT, "scope": "globex", "action_id": "g-1"})
        assert created.status_code == 201
    async with api.client(api.producer) as c:
        assert_problem(await c.post("/v1/intents", json={**INTENT, "scope": "globex"}), 403,
                       "forbidden-scope", "globex")
        assert_problem(await c.get("/v1/intents/g-1"), 404, "not-found")
        assert_problem(await c.get("/v1/intents", params={"scope": "globex"}), 403, "forbidden-scope")
        assert (await c.get("/v1/intents")).json()["items"] == []


async def test_every_route_checks_its_role(api: Api):
    spec = {"url": "https://crm.example/", "secret": SECRET}
    async with api.client(None) as anonymous:
        missing = await anonymous.post("/v1/intents", json=INTENT)
        assert_problem(missing, 401, "unauthenticated", "Bearer")
        assert missing.headers["www-authenticate"].startswith("Bearer")
        assert_problem(await anonymous.get("/v1/destinations"), 401, "unauthenticated")
    async with api.client("obx_nope_nope") as forged:
        assert_problem(await forged.get("/v1/intents"), 401, "unauthenticated", "unknown or revoked")
    async with api.client(api.producer) as producer:
        assert_problem(await producer.put("/v1/destinations/crm", json=spec), 403, "forbidden", "producer")
        assert_problem(await producer.get("/v1/destinations"), 403, "forbidden")
    async with api.client(api.operator) as operator:
        assert_problem(await operator.put("/v1/destinations/crm", json=spec), 403, "forbidden",
                       "a token of role operator cannot do this; it needs role admin")
        assert_problem(await operator.post("/v1/intents", json=INTENT), 403, "forbidden",
                       "a token of role operator cannot do this; it needs role producer")
        assert (await operator.get("/v1/destinations")).status_code == 200
        assert (await operator.get("/v1/intents")).status_code == 200


async def test_a_token_revoked_elsewhere_stops_working_within_the_cache_time(api: Api, db_url):
    async with await Outbox.open(db_url) as box:
        token, info = await box.create_token(Role.PRODUCER, ["acme"])
        async with api.client(token) as c:
            assert (await c.get("/v1/intents")).status_code == 200
            await box.revoke_token(info.id)
            revoked_at = time.monotonic()
            while (response := await c.get("/v1/intents")).status_code == 200:
                assert time.monotonic() - revoked_at < 1.5, "revocation not seen within 1 s"
            assert_problem(response, 401, "unauthenticated")


async def test_with_no_token_cache_a_revocation_is_seen_at_once(db_url, serve_api):
    async with await Outbox.open(db_url) as box:
        token, info = await box.create_token(Role.OPERATOR)
        url = serve_api(Settings(database_url=db_url, token_cache_seconds=0, worker=False))
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}) as c:
            assert (await c.get("/v1/intents")).status_code == 200
            await box.revoke_token(info.id)
            assert_problem(await c.get("/v1/intents"), 401, "unauthenticated")


async def test_destinations_are_managed_by_admins_and_never_show_secrets(api: Api):
    async with api.client(api.admin) as c:
        created = await c.put("/v1/destinations/crm", json={"url": "https://crm.example/", "secret": SECRET,
                                                             "idempotent": True, "retention_seconds": 7200})
        assert created.status_code == 201
        replaced = await c.put("/v1/destinations/crm", json={"url": "https://crm.example/v2"})
        assert replaced.status_code == 200 and replaced.json()["signing_secrets"] == 1
        shown = await c.get("/v1/destinations/crm")
        listed = await c.get("/v1/destinations")
        for response in (created, replaced, shown, listed):
            assert SECRET not in response.text and "whsec_" not in response.text
        assert shown.json()["url"] == "https://crm.example/v2"
        assert [d["id"] for d in listed.json()["items"]] == ["billing", "crm"]
        assert_problem(await c.put("/v1/destinations/new", json={"url": "https://n.example/"}), 422,
                       "invalid-input", "needs a whsec_ secret")
        assert_problem(await c.put("/v1/destinations/x", json={"url": "ftp://x/", "secret": SECRET}),
                       422, "invalid-input", "url")
        await c.post("/v1/intents", json=INTENT)
        assert_problem(await c.delete("/v1/destinations/billing"), 409, "destination-in-use", "1 intent")
        assert (await c.delete("/v1/destinations/crm")).status_code == 204
        assert_problem(await c.get("/v1/destinations/crm"), 404, "not-found", "crm")


async def test_a_destinations_retry_schedule_and_max_age_are_set_shown_and_checked(api: Api):
    async with api.client(api.admin) as c:
        body = {"url": "https://crm.example/", "secret": SECRET}
        shown = (await c.get("/v1/destinations/billing")).json()
        assert (shown["retry_schedule"], shown["max_age_seconds"]) == (None, None)
        made = await c.put("/v1/destinations/crm", json={**body, "retry_schedule": [5, 30, 300, 1800, 3600],
                                                          "max_age_seconds": 86_400})
        assert made.status_code == 201
        shown = (await c.get("/v1/destinations/crm")).json()
        assert (shown["retry_schedule"], shown["max_age_seconds"]) == ([5, 30, 300, 1800, 3600], 86_400)
        for bad, words in (({"retry_schedule": [5, 7200]}, "retry_schedule.1: Input should be less than or equal "
                            "to 3600"), ({"retry_schedule": []}, "retry_schedule: List should have at least 1"),
                           ({"max_age_seconds": 0}, "max_age_seconds: Input should be greater than or equal to 1")):
            assert_problem(await c.put("/v1/destinations/crm", json={**body, **bad}), 422, "invalid-input", words)
        assert (await c.get("/v1/destinations/crm")).json() == shown  # a refused change left it as it was


async def test_a_destinations_limits_are_set_shown_and_refused_whole(api: Api):
    async with api.client(api.admin) as c:
        limits = {"rate_limit": {"per_second": 5, "burst": 10}, "max_in_flight": 4}
        created = await c.put("/v1/destinations/metered", json={"url": "https://m.example/", "secret": SECRET,
                                                                 **limits})
        assert created.status_code == 201
        assert {k: created.json()[k] for k in (*limits, "paused_until")} == {**limits, "paused_until": None}
        for bad, words in (({"rate_limit": {"per_second": 0}}, "rate_limit.per_second"),
                           ({"rate_limit": {"per_second": 1e-12}},  # (the next token 31,700 years away)
                            "rate_limit.per_second: Input should be greater than or equal to 0.00001"),
                           ({"rate_limit": {"per_second": 5e-324, "burst": 1}}, "greater than or equal to 0.00001"),
                           ({"rate_limit": {"per_second": 5, "every": 2}}, "rate_limit.every"),
                           ({"rate_limit": 5}, "rate_limit"), ({"max_in_flight": 0}, "max_in_flight")):
            assert_problem(await c.put("/v1/destinations/metered", json={"url": "https://m.example/", **bad}),
                           422, "invalid-input", words)
        shown = (await c.get("/v1/destinations/metered")).json()  # unchanged by the refusals
        assert {k: shown[k] for k in limits} == limits
        cleared = await c.put("/v1/destinations/metered", json={"url": "https://m.example/"})
        assert (cleared.json()["rate_limit"], cleared.json()["max_in_flight"]) == (None, None)  # unlimited again


@pytest.mark.parametrize(("spec", "words"), [
    ({"url": "http://１２７.０.０.１:8080/hook"},
     "url: Value error, host '１２７.０.０.１' is read as the address '127.0.0.1'"),
    ({"url": "http://127。0。0。1:8080/hook", "allow_private_network": True}, "read as the address '127.0.0.1'"),
    ({"url": "http://１６９.２５４.１６９.２５４/latest/meta-data/"}, "read as the address '169.254.169.254'"),
    ({"url": "http://0x7f000001/"}, "url: Value error, host '0x7f000001' looks like an IPv4 address"),
    ({"url": "http://10.0.0.1/"},
     "url: Value error, the url's host 10.0.0.1 is not a public address"),
    ({"url": "http://169.254.169.254/"}, "169.254.169.254 is not a public address"),
])
async def test_a_destination_whose_host_the_sender_would_refuse_is_refused_at_registration(api: Api, spec, words):
    """A 422 problem that says what is wrong, and nothing is stored."""
    async with api.client(api.admin) as c:
        body = assert_problem(await c.put("/v1/destinations/internal", json={**spec, "secret": SECRET}),
                              422, "invalid-input", words)
        assert [e["field"] for e in body["errors"]] in (["url"], ["allow_private_network"])
        assert_problem(await c.get("/v1/destinations/internal"), 404, "not-found")
        allowed = await c.put("/v1/destinations/internal", json={"url": "http://10.0.0.1/", "secret": SECRET,
                                                                  "allow_private_network": True})
        assert allowed.status_code == 201  # a literal private address, allowed: stored (never sent here)


@pytest.mark.parametrize(
    "body,headers,status,kind,words",
    [
        (b'{"scope": "acme",', {}, 400, "invalid-json", "not JSON"),
        (b'{"scope": "acme"}', {}, 422, "invalid-input", "payload: Field required"),
        (b'{"scope": "acme", "destination": "billing", "payload": {}, "colour": 1}', {}, 422,
         "invalid-input", "colour"),
        (b'{"scope": "acme", "destination": "nowhere", "payload": {}}', {}, 422,
         "unknown-destination", "'nowhere' is not registered"),
        (b'{"scope": "acme", "destination": "billing", "payload": {}, "action_id": "a b"}', {}, 422,
         "invalid-input", "action_id"),
        (b'{"scope": "acme", "destination": "billing", "payload": {"n": 100000000000000000000}}', {},
         422, "invalid-input", "I-JSON"),
        (b'{"scope": "acme", "destination": "billing", "payload": {"x": "' + b"y" * 5000 + b'"}}', {},
         413, "payload-too-large", "limit is 4096"),
        (b"x" * 100_000, {}, 413, "payload-too-large", "limit"),  # (over 6 x 4096 + 64 KiB: refused unread)
        (b'{"scope": "acme", "destination": "billing", "payload": {}}', {"content-type": "text/plain"},
         415, "unsupported-media-type", "application/json"),
        (b'[1, 2]', {}, 422, "invalid-input", ""),
        (b'{"scope": "acme", "destination": "billing", "payload": {}, "not_before": "2030-01-01T00:00:00"}',
         {}, 422, "invalid-input", "not_before"),
        (b'{"scope": "acme", "destination": "billing", "payload": {}, "action_id": "nl-1\\n"}', {}, 422,
         "invalid-input", "action_id"),
        (b'{"scope": "acme", "destination": "billing", "payload": {}, "ordering_key": "a b"}', {}, 422,
         "invalid-input", "ordering_key"),
        (b'{"scope": "acme", "destination": "billing", "payload": {}, "ordering_key": "' + b"k" * 256 + b'"}', {},
         422, "invalid-input", "ordering_key"),
        (b'{"scope": "acme", "destination": "billing", "payload": {}, "ordering_key": ""}', {}, 422,
         "invalid-input", "ordering_key"),
        (b'{"scope": "acme", "destination": "billing", "payload": ' + b"[" * 60_000, {}, 422,
         "invalid-input", "a payload may nest 64 levels"),
        (b'{"scope": "acme", "destination": "billing", "payload": ' + b"[" * 65 + b"]" * 65 + b"}", {}, 422,
         "invalid-input", "deeper than 64 levels"),
        (b'{"scope": "acme", "destination": "billing", "payload": ' + b"[" * 900 + b"]" * 900 + b"}", {}, 422,
         "invalid-input", "a payload may nest 64 levels"),
    ],
)
async def test_bad_input_gets_a_problem_and_leaves_the_store_unchanged(api: Api, body, headers, status, kind, words):
    before = snapshot(api.db_path)
    async with api.client(api.producer) as c:
        response = await c.post("/v1/intents", content=body,
                                headers={"content-type": "application/json", **headers})
    assert_problem(response, status, kind, words)
    assert snapshot(api.db_path) == before


async def test_an_intent_says_what_it_waits_behind_naming_only_what_the_reader_may_read(api: Api, db_url):
    async with await Outbox.open(db_url) as box:
        other, _ = await box.create_token(Role.PRODUCER, ["globex"])
    async with api.client(api.admin) as c:
        spec = {"url": "https://billing.example/", "ordering": "key"}
        assert (await c.put("/v1/destinations/billing", json=spec)).json()["ordering"] == "key"
    keyed = {**INTENT, "ordering_key": "customer-7"}
    async with api.client(api.producer) as c:
        first = await c.post("/v1/intents", json={**keyed, "action_id": "first"})
        assert first.status_code == 201 and first.json()["ordering_key"] == "customer-7"
        await c.post("/v1/intents", json={**keyed, "action_id": "second"})
        assert (await c.get("/v1/intents/second")).json()["waiting_behind"] == {
            "action_id": "first", "scope": "acme", "status": "pending"}
        assert (await c.get("/v1/intents/first")).json()["waiting_behind"] is None
        again = await c.post("/v1/intents", json={**keyed, "action_id": "first", "ordering_key": "customer-8"})
        assert_problem(again, 409, "intent-conflict", "ordering_key")
    async with api.client(other) as c:
        await c.post("/v1/intents", json={**keyed, "scope": "globex", "action_id": "theirs"})
        shown = (await c.get("/v1/intents/theirs")).json()
        assert shown["waiting_behind"] == {"action_id": None, "scope": None, "status": None}
        assert "first" not in json.dumps(shown)
    async with api.client(api.operator) as c:
        assert (await c.get("/v1/intents/theirs")).json()["waiting_behind"]["action_id"] == "first"


@pytest.mark.parametrize("payload", [None, 0, "text", json.loads("[" * 64 + "]" * 64)])
async def test_any_json_payload_up_to_the_nesting_limit_is_taken(api: Api, payload):
    """null is JSON too (it was a 500), and 64 levels of nesting are allowed."""
    async with api.client(api.producer) as c:
        created = await c.post("/v1/intents", json={**INTENT, "payload": payload})
        assert created.status_code == 201, created.text
        assert created.json()["payload"] == payload
        assert (await c.get(created.headers["location"])).json()["payload"] == payload


async def test_operator_booleans_are_strict(api: Api):
    """A 0 or "no" for dry_run used to be taken as false and ran a real bulk replay."""
    before = snapshot(api.db_path)
    async with api.client(api.operator) as c:
        for value in (0, "false", "no", None):
            refused = await c.post("/v1/replay", json={"reason": "r", "dry_run": value})
            assert_problem(refused, 422, "invalid-input", "dry_run")
        assert_problem(await c.post("/v1/intents/x/replay", json={"reason": "r", "accept_duplicate_risk": 1}),
                       422, "invalid-input", "accept_duplicate_risk")
    async with api.client(api.admin) as c:
        loose = await c.put("/v1/destinations/d", json={"url": "https://d.example/", "secret": SECRET,
                                                        "idempotent": "yes"})
        assert_problem(loose, 422, "invalid-input", "idempotent")
    assert snapshot(api.db_path) == before


async def test_a_rotation_ends_by_dropping_the_previous_secrets(api: Api):
    other = "whsec_" + "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
    async with api.client(api.admin) as c:
        rotated = await c.put("/v1/destinations/billing", json={"url": "https://billing.example/", "secret": other})
        assert rotated.json()["signing_secrets"] == 2
        ended = await c.put("/v1/destinations/billing", json={"url": "https://billing.example/",
                                                               "drop_previous_secrets": True})
        assert ended.json()["signing_secrets"] == 1
    async with await Outbox.open(f"sqlite:///{api.db_path}") as box:
        assert (await box.get_destination("billing")).secrets == (other,)


async def test_grants_name_registered_destinations_and_keep_them_from_being_deleted(api: Api):
    before = snapshot(api.db_path)
    async with api.client(api.admin) as c:
        missing = await c.put("/v1/grants/g", json={"scope": "acme", "destination": "nowhere"})
        assert_problem(missing, 422, "unknown-destination", "'nowhere' is not registered")
        assert snapshot(api.db_path) == before
        assert (await c.put("/v1/grants/g", json={"scope": "acme", "destination": "billing"})).status_code == 201
        assert_problem(await c.delete("/v1/destinations/billing"), 409, "destination-in-use", "grants 'g'")
        assert (await c.delete("/v1/grants/g")).status_code == 204
        assert (await c.delete("/v1/destinations/billing")).status_code == 204


async def test_a_content_length_of_non_ascii_digits_is_refused_not_a_500(db_url):
    """'²'.isdigit() is true but int('²') raises. uvicorn refuses such a header itself, so the
    app is called as a server that passes it on would call it."""
    async with await Outbox.open(db_url) as box:
        producer, _ = await box.create_token(Role.PRODUCER, ["acme"])
        app = create_app(outbox=box)
        sent: list[dict] = []

        async def receive() -> dict:
            return {"type": "http.request", "body": b"{}", "more_body": False}

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/v1/intents", "raw_path": b"/v1/intents", "query_string": b"",
                 "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
                 "headers": [(b"authorization", b"Bearer " + producer.encode()),
                             (b"content-type", b"application/json"), (b"content-length", b"\xb2")]}
        async with app.router.lifespan_context(app):
            await app(scope, receive, send)
    assert sent[0]["status"] < 500, sent


async def test_malformed_ids_and_unknown_routes_are_problems(api: Api):
    async with api.client(api.operator) as c:
        assert_problem(await c.get("/v1/intents/bad%20id"), 422, "invalid-input", "action_id")
        assert_problem(await c.get("/v1/intents/missing"), 404, "not-found", "'missing'")
        assert_problem(await c.get("/v1/destinations/Bad!"), 422, "invalid-input", "destination id")
        assert_problem(await c.get("/v2/nothing"), 404, "not-found", "/docs")
        assert_problem(await c.delete("/v1/intents"), 405, "method-not-allowed", "DELETE")


async def test_a_locked_database_answers_503_with_retry_after(api: Api, db_url, serve_api):
    import sqlite3

    url = serve_api(Settings(database_url=db_url, sqlite_busy_timeout_ms=50, worker=False))
    locker = sqlite3.connect(api.db_path, isolation_level=None)
    before = snapshot(api.db_path)
    locker.execute("BEGIN IMMEDIATE")
    try:
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {api.producer}"}) as c:
            response = await c.post("/v1/intents", json=INTENT)
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    assert_problem(response, 503, "store-unavailable", "locked")
    assert response.headers["retry-after"] == "1"
    assert snapshot(api.db_path) == before


async def test_probes_and_openapi(api: Api):
    async with api.client(None) as c:
        assert (await c.get("/healthz")).json() == {"status": "ok"}
        assert (await c.get("/readyz")).json() == {"status": "ready"}
        schema = (await c.get("/openapi.json")).json()
        assert "/v1/intents" in schema["paths"] and "/v1/destinations/{destination_id}" in schema["paths"]
        body = schema["paths"]["/v1/intents"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        body = schema["components"]["schemas"][body["$ref"].removeprefix("#/components/schemas/")]
        assert set(body["required"]) == {"scope", "destination", "payload"}
        assert (await c.get("/docs")).status_code == 200


async def test_grants_are_managed_by_admins_and_revisioned(api: Api):
    async with api.client(api.admin) as c:
        created = await c.put("/v1/grants/acme-billing", json={"scope": "acme", "destination": "billing"})
        assert created.status_code == 201 and created.json()["revision"] == 1
        replaced = await c.put("/v1/grants/acme-billing", json={
            "scope": "acme", "destination": "billing", "expires_at": "2031-01-01T00:00:00Z", "note": "renewed"})
        assert replaced.status_code == 200 and replaced.json()["revision"] == 2
        assert replaced.json()["expires_at"] == "2031-01-01T00:00:00Z"
        assert_problem(await c.put("/v1/grants/x", json={"scope": "acme"}), 422, "invalid-input", "destination")
        assert_problem(await c.put("/v1/grants/x", json={"scope": "a b", "destination": "*"}), 422,
                       "invalid-input", "scope")
    async with api.client(api.operator) as c:
        assert [g["id"] for g in (await c.get("/v1/grants")).json()["items"]] == ["acme-billing"]
        assert_problem(await c.delete("/v1/grants/acme-billing"), 403, "forbidden", "admin")
    async with api.client(api.producer) as c:
        assert_problem(await c.get("/v1/grants"), 403, "forbidden")
    async with api.client(api.admin) as c:
        assert (await c.delete("/v1/grants/acme-billing")).status_code == 204
        assert_problem(await c.get("/v1/grants/acme-billing"), 404, "not-found")


async def test_wait_returns_at_once_for_a_settled_or_after_the_timeout_for_a_pending_intent(api: Api):
    async with api.client(api.producer) as c:
        await c.post("/v1/intents", json={**INTENT, "action_id": "w-1"})
        started = time.monotonic()
        waited = await c.get("/v1/intents/w-1", params={"wait": 0.3})
        assert time.monotonic() - started >= 0.3
        assert waited.json()["status"] == "pending" and waited.json()["settled"] is False
        assert_problem(await c.get("/v1/intents/w-1", params={"wait": 61}), 422, "invalid-input", "wait")


async def test_admins_manage_tokens_over_http_as_on_the_host(api: Api, caplog):
    caplog.set_level(logging.INFO, logger="outbox")
    async with api.client(api.admin) as admin:
        admin_id = next(t["id"] for t in (await admin.get("/v1/tokens")).json()["items"] if t["role"] == "admin")
        made = await admin.post("/v1/tokens", json={"role": "producer", "scopes": ["acme"], "label": "billing app"})
        assert made.status_code == 201 and made.headers["cache-control"] == "no-store"
        new = made.json()
        assert new["token"].startswith(f"obx_{new['id']}_")
        assert {k: new[k] for k in ("role", "scopes", "label", "revoked_at")} == {
            "role": "producer", "scopes": ["acme"], "label": "billing app", "revoked_at": None}
        listed = (await admin.get("/v1/tokens")).json()["items"]
        assert [t for t in listed if t["id"] == new["id"]] == [{k: v for k, v in new.items() if k != "token"}]
        assert new["token"] not in json.dumps(listed)  # its text is in the creating answer only

        async with api.client(new["token"]) as producer:
            assert (await producer.post("/v1/intents", json=INTENT)).status_code == 201
            assert_problem(await producer.get("/v1/tokens"), 403, "forbidden", "admin")
            revoked = await admin.delete(f"/v1/tokens/{new['id']}")
            assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
            assert_problem(await producer.get("/v1/intents"), 401, "unauthenticated")  # at once here
        assert_problem(await admin.delete(f"/v1/tokens/{new['id']}"), 404, "not-found", "no active token")

    audit = [r.getMessage() for r in caplog.records if r.name == "outbox"]
    assert f"token {new['id']} (producer) created by token:{admin_id}" in audit
    assert f"token {new['id']} (producer) revoked by token:{admin_id}" in audit
    async with api.client(api.operator) as operator:
        assert_problem(await operator.get("/v1/tokens"), 403, "forbidden", "admin")
        assert_problem(await operator.post("/v1/tokens", json={"role": "admin"}), 403, "forbidden", "admin")


async def test_the_last_admin_token_is_never_revoked_over_http_not_even_by_itself(api: Api):
    async with api.client(api.admin) as admin:
        admin_id = next(t["id"] for t in (await admin.get("/v1/tokens")).json()["items"] if t["role"] == "admin")
        before = snapshot(api.db_path)
        assert_problem(await admin.delete(f"/v1/tokens/{admin_id}"), 409, "last-admin",
                       f"token {admin_id!r} is the last active admin token")
        assert snapshot(api.db_path) == before  # refused: nothing changed, and it still works
        second = (await admin.post("/v1/tokens", json={"role": "admin", "label": "on-call"})).json()
        assert (await admin.delete(f"/v1/tokens/{admin_id}")).status_code == 200  # another is left
    async with api.client(second["token"]) as on_call:
        assert_problem(await on_call.delete(f"/v1/tokens/{second['id']}"), 409, "last-admin")
        items = (await on_call.get("/v1/tokens")).json()["items"]
        assert [t["id"] for t in items if t["role"] == "admin" and t["revoked_at"] is None] == [second["id"]]
        operator_id = next(t["id"] for t in items if t["role"] == "operator")
        assert (await on_call.delete(f"/v1/tokens/{operator_id}")).status_code == 200  # other roles: any


@pytest.mark.parametrize(("body", "words"), [
    ({"role": "producer"}, "needs at least one scope"),
    ({"role": "operator", "scopes": ["acme"]}, "acts in every scope"),
    ({"role": "root"}, "role"),
    ({"role": "producer", "scopes": ["acme"], "label": "a\nb"}, "label"),
    ({"role": "producer", "scopes": ["ac me"]}, "scope"),
    ({"role": "admin", "expires": 1}, "expires"),
])
async def test_a_token_refused_is_a_problem_and_changes_nothing(api: Api, body, words):
    before = snapshot(api.db_path)
    async with api.client(api.admin) as admin:
        assert_problem(await admin.post("/v1/tokens", json=body), 422, "invalid-input", words)
        assert_problem(await admin.delete("/v1/tokens/not-an-id"), 422, "invalid-input", "token id")
    assert snapshot(api.db_path) == before
