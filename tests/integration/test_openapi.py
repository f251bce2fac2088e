"""/openapi.json is a complete, valid OpenAPI 3.1 document a client can be generated from, and
/docs shows it from local assets only; served by a real uvicorn over a real SQLite file."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx
import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate

from outbox import DestinationSpec, Outbox, Role, Settings, channels
from outbox.fields import ecma
from outbox.grants import GrantSpec
from outbox.ids import ACTION_ID, DESTINATION_ID, SCOPE, TOKEN_ID
from outbox.topics import EVENT_ID

from ..conftest import SECRET

PROBLEM = "application/problem+json"
#: The operator actions: each reads a JSON body the document must describe.
ACTIONS = ["replay", "resolve", "cancel", "approve", "reject"]


@dataclass
class Served:
    url: str
    admin: str
    producer: str
    document: dict[str, Any]

    def client(self, token: str | None = None) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=10)

    def schema(self, name: str) -> Draft202012Validator:
        """A validator for one of the document's component schemas."""
        return Draft202012Validator({"$ref": f"#/components/schemas/{name}",
                                     "components": self.document["components"]})

    def answer(self, method: str, path: str, status: int) -> Draft202012Validator:
        """A validator for the schema the document gives ``method path``'s ``status`` answer."""
        response = self.document["paths"][path][method]["responses"][str(status)]
        [(media_type, content)] = response["content"].items()
        assert media_type == ("application/json" if status < 400 else PROBLEM)
        return Draft202012Validator({**content["schema"], "components": self.document["components"]})


@pytest.fixture
async def served(db_url, serve_api) -> AsyncIterator[Served]:
    async with await Outbox.open(db_url) as box:
        await box.put_destination("billing", DestinationSpec(url="https://billing.example/", secret=SECRET))
        await box.put_grant("acme-billing", GrantSpec(scope="acme", destination="billing"))
        admin, _ = await box.create_token(Role.ADMIN)
        producer, _ = await box.create_token(Role.PRODUCER, ["acme"])
    url = serve_api(Settings(database_url=db_url, worker=False))
    async with httpx.AsyncClient(base_url=url) as c:
        answer = await c.get("/openapi.json")
    assert answer.status_code == 200
    yield Served(url, admin, producer, answer.json())


def refs(value: Any) -> Iterator[str]:
    """Every ``$ref`` in a document."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "$ref" and isinstance(item, str):
                yield item
            else:
                yield from refs(item)
    elif isinstance(value, list):
        for item in value:
            yield from refs(item)


def operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method, path, operation) for path, methods in document["paths"].items()
            for method, operation in methods.items()]


# -- the document ----------------------------------------------------------------------------


async def test_the_document_is_valid_openapi_and_no_reference_dangles(served: Served):
    validate(served.document)  # openapi-spec-validator: OpenAPI 3.1 and its JSON Schema dialect
    defined = set(served.document["components"]["schemas"])
    dangling = sorted({r for r in refs(served.document)
                       if not r.startswith("#/components/schemas/") or r.split("/")[-1] not in defined})
    assert dangling == []
    assert "$defs" not in str(served.document)  # nothing inlined with its own definitions


async def test_every_json_body_a_route_reads_is_a_component(served: Served):
    bodies = {(method, path): operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
              for method, path, operation in operations(served.document) if "requestBody" in operation}
    assert bodies == {
        ("post", "/v1/intents"): "#/components/schemas/IntentIn",
        ("post", "/v1/intents:batch"): "#/components/schemas/BatchIn",
        **{("post", f"/v1/intents/{{action_id}}/{action}"): f"#/components/schemas/{body}"
           for action, body in zip(ACTIONS, ["ReplayIn", "ResolveIn", "ReasonIn", "ApproveIn", "ReasonIn"],
                                   strict=True)},
        ("post", "/v1/replay"): "#/components/schemas/BulkReplayIn",
        ("put", "/v1/destinations/{destination_id}"): "#/components/schemas/DestinationSpec",
        ("put", "/v1/grants/{grant_id}"): "#/components/schemas/GrantSpec",
        ("post", "/v1/tokens"): "#/components/schemas/TokenSpec",
        ("post", "/v1/events"): "#/components/schemas/EventIn",
        ("post", "/v1/events:batch"): "#/components/schemas/EventBatchIn",
        ("post", "/v1/events/{event_id}/deliver"): "#/components/schemas/DeliverIn",
        ("post", "/v1/destinations/{destination_id}/rotate-secret"): "#/components/schemas/RotateIn",
        ("post", "/v1/tenant/destinations"): "#/components/schemas/DestinationSpec",
        ("put", "/v1/tenant/destinations/{destination_id}"): "#/components/schemas/DestinationSpec",
        ("post", "/v1/tenant/destinations/{destination_id}/rotate-secret"): "#/components/schemas/RotateIn",
        ("post", "/v1/tenant/destinations/{destination_id}/test"): "#/components/schemas/TestIn",
        ("post", "/v1/tenant/intents/{action_id}/replay"): "#/components/schemas/ReplayIn",
        ("post", "/v1/tenants/{scope}/portal-links"): "#/components/schemas/PortalLinkIn",
    }
    assert served.document["components"]["schemas"]["IntentIn"]["properties"]["payload"] == {
        "$ref": "#/components/schemas/JsonValue", "description": "the JSON the destination receives"}


async def test_every_answer_is_documented_with_its_schema_and_errors_as_problems(served: Served):
    for method, path, operation in operations(served.document):
        responses = operation["responses"]
        where = f"{method.upper()} {path}"
        assert "default" in responses, where
        for status, response in responses.items():
            if status == "default" or int(status) >= 400:
                assert list(response["content"]) == [PROBLEM], (where, status)
                assert response["content"][PROBLEM]["schema"] == {"$ref": "#/components/schemas/Problem"}
            elif status != "204":
                [schema] = [content["schema"] for content in response["content"].values()]
                assert schema.get("$ref") or schema == {"type": "string"}, (where, status, schema)
        if path.startswith("/v1/"):
            assert operation["security"] == [{"bearer": []}], where
            assert "401" in responses and "503" in responses, where
        if "requestBody" in operation:
            assert {"400", "413", "415", "422"} <= set(responses), where
    paths = served.document["paths"]
    assert set(paths["/v1/intents"]["post"]["responses"]) >= {"200", "201", "409"}
    assert set(paths["/v1/intents/{action_id}/replay"]["post"]["responses"]) >= {"200", "404", "409"}
    assert set(paths["/v1/destinations/{destination_id}"]["delete"]["responses"]) >= {"204", "404", "409"}
    assert list(paths["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]
    assert served.document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert "HTTPValidationError" not in served.document["components"]["schemas"]  # 422 is a problem here


async def test_operations_are_named_for_what_they_do(served: Served):
    """Generated clients name their methods after the operation ids: short, unique, and the
    routes' own names rather than FastAPI's path-derived defaults."""
    ids = {(method, path): operation["operationId"] for method, path, operation in operations(served.document)}
    assert len(set(ids.values())) == len(ids)
    assert ids[("put", "/v1/destinations/{destination_id}")] == "put_destination"
    assert ids[("get", "/v1/intents/{action_id}")] == "get_intent"
    assert ids[("post", "/v1/intents:batch")] == "enqueue_batch"
    assert ids[("delete", "/v1/tokens/{token_id}")] == "revoke_token"
    assert all(re.fullmatch(r"[a-z]+(_[a-z]+)*", name) for name in ids.values()), ids


async def test_a_destination_answer_is_its_channels_one_told_apart_by_channel(served: Served):
    schemas = served.document["components"]["schemas"]
    union = schemas["Destination"]
    assert union["discriminator"]["propertyName"] == "channel"
    assert set(union["discriminator"]["mapping"]) == set(channels.names())
    webhook = schemas[union["discriminator"]["mapping"]["webhook"].rsplit("/", 1)[1]]
    assert webhook["properties"]["channel"]["const"] == "webhook" and "url" in webhook["required"]
    assert "secret" not in webhook["properties"]
    assert "required when the destination is new" in schemas["WebhookSpec"]["properties"]["secret"]["description"]
    async with served.client(served.admin) as admin:
        shown = (await admin.get("/v1/destinations/billing")).json()
    served.schema(webhook["title"]).validate(shown)
    assert shown["url"] == "https://billing.example/"


async def test_id_parameters_carry_the_patterns_the_api_checks(served: Served):
    expected = {"action_id": ACTION_ID, "destination_id": DESTINATION_ID, "grant_id": DESTINATION_ID,
                "token_id": TOKEN_ID, "event_id": EVENT_ID, "scope": SCOPE}
    seen = set()
    for _, path, operation in operations(served.document):
        for parameter in operation.get("parameters", []):
            if parameter["in"] == "path":
                assert parameter["schema"]["pattern"] == ecma(expected[parameter["name"]]), path
                seen.add(parameter["name"])
    assert seen == set(expected)
    # an ECMA-262 pattern searches, so it is anchored; its final $ is Python's \Z (no newline before it)
    action_id = as_ecma(ecma(ACTION_ID))
    assert action_id.search("inv-42.send:1") and not action_id.search("inv-42\n")
    assert not action_id.search("x/../y") and not action_id.search("a" * 201)
    intent_in = served.document["components"]["schemas"]["IntentIn"]["properties"]
    scope = as_ecma(intent_in["scope"]["pattern"])
    assert scope.search("acme/eu") and not scope.search("") and not scope.search("acme eu")
    topic = as_ecma(served.document["components"]["schemas"]["EventIn"]["properties"]["topic"]["pattern"])
    assert topic.search("invoice.paid") and not topic.search("invoice.*") and not topic.search("invoice.paid\n")
    assert not topic.search("a" * 201) and not topic.search(".".join("a" * 9))


async def test_times_are_date_time_strings_with_their_range_and_integers_integers(served: Served):
    """What the API takes, as it checks it: a time is never a number, an integer never a string."""
    schemas = served.document["components"]["schemas"]
    times = [schemas["IntentIn"]["properties"]["not_before"], schemas["IntentIn"]["properties"]["expires_at"],
             schemas["GrantSpec"]["properties"]["expires_at"], schemas["ReplayFilter"]["properties"]["created_after"],
             *(p["schema"] for p in served.document["paths"]["/v1/intents"]["get"]["parameters"]
               if p["name"] in ("created_after", "created_before"))]
    for time in times:
        [text] = [branch for branch in time["anyOf"] if branch != {"type": "null"}]
        assert text["type"] == "string" and text["format"] == "date-time", time
        assert "0001-01-01T00:00:00Z to 9998-12-31T23:59:59.999999Z" in text["description"]
    integers = [schemas["IntentIn"]["properties"]["max_attempts"]["anyOf"][0],
                schemas["WebhookSpec"]["properties"]["retention_seconds"]]
    assert [i["type"] for i in integers] == ["integer", "integer"]


def as_ecma(pattern: str) -> re.Pattern[str]:
    """A JSON Schema pattern as ECMA-262 reads it (without the m flag)."""
    assert pattern.startswith("^") and pattern.endswith("$")
    return re.compile(pattern[:-1] + r"\Z")


async def test_what_the_api_answers_is_what_the_document_says(served: Served):
    """Every field an answer has is documented, and every answer matches its schema."""
    async with served.client(served.admin) as admin:
        enqueued = await admin.post("/v1/intents", json={"action_id": "inv-1", "scope": "acme",
                                                          "destination": "billing", "payload": {"n": [1, None]}})
        shown = await admin.get("/v1/intents/inv-1")
        listed = await admin.get("/v1/intents", params={"limit": 1})
        cancelled = await admin.post("/v1/intents/inv-1/cancel", json={"reason": "test"})
        replayed = await admin.post("/v1/intents/inv-1/replay", json={"reason": "test"})
        bulk = await admin.post("/v1/replay", json={"reason": "test", "dry_run": True})
        destination = await admin.get("/v1/destinations/billing")
        destinations = await admin.get("/v1/destinations")
        grant = await admin.get("/v1/grants/acme-billing")
        grants = await admin.get("/v1/grants")
        health, ready = await admin.get("/healthz"), await admin.get("/readyz")
        made = await admin.post("/v1/tokens", json={"role": "operator", "label": "docs"})
        tokens = await admin.get("/v1/tokens")
        revoked = await admin.delete(f"/v1/tokens/{made.json()['id']}")
    checks = [
        (enqueued, "post", "/v1/intents", 201, "Intent"),
        (shown, "get", "/v1/intents/{action_id}", 200, "IntentDetail"),
        (listed, "get", "/v1/intents", 200, "IntentPage"),
        (cancelled, "post", "/v1/intents/{action_id}/cancel", 200, "IntentHistory"),
        (replayed, "post", "/v1/intents/{action_id}/replay", 409, "Problem"),
        (bulk, "post", "/v1/replay", 200, "BulkReplayResult"),
        (destination, "get", "/v1/destinations/{destination_id}", 200, "Destination"),
        (destinations, "get", "/v1/destinations", 200, "DestinationList"),
        (grant, "get", "/v1/grants/{grant_id}", 200, "Grant"),
        (grants, "get", "/v1/grants", 200, "GrantList"),
        (health, "get", "/healthz", 200, "Health"),
        (ready, "get", "/readyz", 200, "Ready"),
        (made, "post", "/v1/tokens", 201, "NewToken"),
        (tokens, "get", "/v1/tokens", 200, "TokenList"),
        (revoked, "delete", "/v1/tokens/{token_id}", 200, "Token"),
    ]
    for response, method, path, status, name in checks:
        assert response.status_code == status, (path, response.text)
        served.answer(method, path, status).validate(response.json())
        served.schema(name).validate(response.json())
    schemas = served.document["components"]["schemas"]
    documented = {name: set(schemas[name]["properties"]) for name in
                  ("IntentDetail", "IntentHistory", "Attempt", "Event", "Destination", "Grant", "Problem")}
    assert set(shown.json()) <= documented["IntentDetail"]
    assert set(cancelled.json()) <= documented["IntentHistory"]
    assert set(shown.json()["events"][0]) <= documented["Event"]
    # the shared fields, and the channel's own settings as its spec documents them
    assert set(destination.json()) <= documented["Destination"] | set(schemas["WebhookSpec"]["properties"])
    assert set(grant.json()) <= documented["Grant"]
    assert set(replayed.json()) <= documented["Problem"]
    assert "secret" not in documented["Destination"]
    assert set(made.json()) == set(schemas["NewToken"]["properties"])
    assert set(revoked.json()) == set(schemas["Token"]["properties"])


async def test_what_the_event_routes_answer_is_what_the_document_says(served: Served):
    async with served.client(served.admin) as admin:
        subscribed = await admin.put("/v1/destinations/billing", json={
            "url": "https://billing.example/", "subscriptions": [{"topic": "invoice.*", "scopes": ["acme"]}]})
        published = await admin.post("/v1/events", json={"event_id": "e1", "scope": "acme", "topic": "invoice.paid",
                                                          "payload": {"n": 1}})
        again = await admin.post("/v1/events", json={"event_id": "e1", "scope": "acme", "topic": "invoice.paid",
                                                      "payload": {"n": 1}})
        conflict = await admin.post("/v1/events", json={"event_id": "e1", "scope": "acme", "topic": "invoice.sent",
                                                         "payload": {"n": 1}})
        shown = await admin.get("/v1/events/e1")
        listed = await admin.get("/v1/events", params={"topic": "invoice.*"})
        batch = await admin.post("/v1/events:batch", json={"events": [
            {"event_id": "e2", "scope": "acme", "topic": "invoice.paid", "payload": {}}, {"scope": "acme"}]})
        delivered = await admin.post("/v1/events/e1/deliver", json={"destination": "billing"})
        missing = await admin.get("/v1/events/nope")
        intent = await admin.get("/v1/intents/evt~e1~billing")
    checks = [
        (subscribed, "put", "/v1/destinations/{destination_id}", 200, "Destination"),
        (published, "post", "/v1/events", 201, "PublishedEvent"),
        (again, "post", "/v1/events", 200, "PublishedEvent"),
        (conflict, "post", "/v1/events", 409, "Problem"),
        (shown, "get", "/v1/events/{event_id}", 200, "PublishedEvent"),
        (listed, "get", "/v1/events", 200, "EventPage"),
        (batch, "post", "/v1/events:batch", 200, "EventBatchResult"),
        (delivered, "post", "/v1/events/{event_id}/deliver", 200, "PublishedEvent"),
        (missing, "get", "/v1/events/{event_id}", 404, "Problem"),
        (intent, "get", "/v1/intents/{action_id}", 200, "IntentDetail"),
    ]
    for response, method, path, status, name in checks:
        assert response.status_code == status, (path, response.text)
        served.answer(method, path, status).validate(response.json())
        served.schema(name).validate(response.json())
    schemas = served.document["components"]["schemas"]
    assert set(shown.json()) == set(schemas["PublishedEvent"]["properties"])
    assert set(shown.json()["fanout"][0]) == set(schemas["Delivery"]["properties"])
    assert intent.json()["event_id"] == "e1" and "event_id" in schemas["IntentDetail"]["properties"]
    assert subscribed.json()["subscriptions"] == [{"topic": "invoice.*", "scopes": ["acme"]}]


async def test_the_documented_examples_are_accepted(served: Served):
    document = served.document
    example = document["paths"]["/v1/intents"]["post"]["requestBody"]["content"]["application/json"]["example"]
    async with served.client(served.producer) as producer:
        created = await producer.post("/v1/intents", json=example)
    assert created.status_code == 201, created.text
    for _, _, operation in operations(document):
        if "requestBody" in operation:
            content = operation["requestBody"]["content"]["application/json"]
            served.schema(content["schema"]["$ref"].split("/")[-1]).validate(content["example"])


# -- /docs -----------------------------------------------------------------------------------


class _Links(HTMLParser):
    """Every URL an HTML page loads or links to."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [value for name, value in attrs if name in ("src", "href") and value]


async def test_docs_loads_swagger_ui_from_this_server_only(served: Served):
    async with served.client() as c:
        page = await c.get("/docs")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        links = _Links()
        links.feed(page.text)
        assert len(links.urls) >= 3
        assert not re.search(r"https?://", page.text), "the docs page names another host"
        assert "url: '/openapi.json'" in page.text
        kinds = {}
        for url in links.urls:
            assert not urlsplit(url).netloc and url.startswith("/docs/assets/"), url
            asset = await c.get(urljoin(served.url, url))
            assert asset.status_code == 200 and len(asset.content) > 500, url
            kinds[url.rsplit(".", 1)[-1]] = asset.headers["content-type"].split(";")[0]
        assert kinds == {"js": "text/javascript", "css": "text/css", "png": "image/png"}
        assert (await c.get("/redoc")).status_code == 404  # it would load from a CDN
        assert (await c.get("/docs/assets/index.html")).status_code == 404  # only what /docs loads
        assert (await c.get("/docs/assets/..%2F..%2Fopenapi.py")).status_code == 404
