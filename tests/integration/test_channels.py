"""The channel registry: a channel that is one module is registered, checked, listed, counted
and delivered through the served API and its embedded sender, with nothing else naming it."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from outbox import Destination, OnUnknown, Status, channels
from tests import file_channel
from tests.conftest import eventually

from ..problems import assert_problem
from .conftest import Api


@pytest.fixture
def file_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(channels._kinds, "file", file_channel.CHANNEL)


@pytest.fixture
def api_settings(file_installed: None) -> dict[str, Any]:
    """The API with its embedded sender, polling every 50 ms, and the file channel installed."""
    return {"poll_seconds": 0.05}


async def test_a_channel_of_its_own_module_is_registered_checked_and_delivered(api: Api, tmp_path: Path):
    journal = tmp_path / "journal.jsonl"
    async with api.client(api.admin) as admin, api.client(api.producer) as producer:
        registered = await admin.put("/v1/destinations/journal", json={"channel": "file", "path": str(journal)})
        assert registered.status_code == 201, registered.text
        shown = registered.json()
        assert (shown["channel"], shown["path"], shown["signing_secrets"]) == ("file", str(journal), 0)
        assert (await admin.put("/v1/grants/acme-journal", json={"scope": "acme", "destination": "journal"}
                                )).status_code == 201

        refused = await producer.post("/v1/intents", json={"scope": "acme", "destination": "journal",
                                                           "action_id": "bad-1", "payload": {"text": "no line"}})
        assert_problem(refused, 422, "invalid-input", "cannot be sent by the file channel: a file payload is")
        assert_problem(await producer.get("/v1/intents/bad-1"), 404, "not-found")

        created = await producer.post("/v1/intents", json={"scope": "acme", "destination": "journal",
                                                           "action_id": "note-1", "payload": {"line": "hello"}})
        assert created.status_code == 201 and created.json()["channel"] == "file"

        async def delivered() -> bool:
            return (await producer.get("/v1/intents/note-1")).json()["status"] == Status.DELIVERED.value

        assert await eventually(delivered, timeout=10)
        [written] = [json.loads(line) for line in journal.read_text().splitlines()]
        assert written == {"key": "acme/note-1", "line": "hello", "fence": 1}
        attempt = (await producer.get("/v1/intents/note-1")).json()["attempts"][0]
        assert (attempt["outcome"], attempt["external_id"]) == ("delivered", "offset 0")

        listed = (await producer.get("/v1/intents", params={"channel": "file"})).json()["items"]
        assert [i["action_id"] for i in listed] == ["note-1"]
        assert (await producer.get("/v1/intents", params={"channel": "webhook"})).json()["items"] == []
        assert_problem(await producer.get("/v1/intents", params={"channel": "fax"}), 422, "invalid-input",
                       "there is no channel 'fax'; installed: " + ", ".join(channels.names()))
        metrics = (await admin.get("/metrics")).text
        assert 'outbox_intents{channel="file",status="delivered"} 1.0' in metrics
        assert 'outbox_intents{channel="webhook",status="delivered"} 0.0' in metrics


async def test_a_destination_is_checked_by_its_channels_spec_and_keeps_its_channel(api: Api, tmp_path: Path):
    async with api.client(api.admin) as admin:
        relative = await admin.put("/v1/destinations/journal", json={"channel": "file", "path": "journal.jsonl"})
        body = assert_problem(relative, 422, "invalid-input", "must be absolute")
        assert [e["field"] for e in body["errors"]] == ["path"]
        alien = await admin.put("/v1/destinations/journal",
                                json={"channel": "file", "path": str(tmp_path / "j"), "url": "https://x.example/"})
        assert [e["field"] for e in assert_problem(alien, 422, "invalid-input")["errors"]] == ["url"]
        assert_problem(await admin.put("/v1/destinations/journal", json={"channel": "fax", "number": "1"}),
                       422, "invalid-input", "there is no channel 'fax'; installed: " + ", ".join(channels.names()))
        assert_problem(await admin.put("/v1/destinations/journal", json={"channel": ["file"]}),
                       422, "invalid-input", "channel")
        assert_problem(await admin.get("/v1/destinations/journal"), 404, "not-found")

        assert (await admin.put("/v1/destinations/journal",
                                json={"channel": "file", "path": str(tmp_path / "j")})).status_code == 201
        moved = await admin.put("/v1/destinations/journal",
                                json={"url": "https://x.example/", "secret": "whsec_" + "QUJD" * 8})
        assert_problem(moved, 422, "invalid-input", "is a file destination; a destination keeps its channel")
        assert (await admin.get("/v1/destinations/journal")).json()["path"] == str(tmp_path / "j")


async def test_the_document_offers_every_installed_channels_spec(api: Api):
    async with httpx.AsyncClient(base_url=api.url) as client:
        schemas = (await client.get("/openapi.json")).json()["components"]["schemas"]
    offered = [one["$ref"].rsplit("/", 1)[1] for one in schemas["DestinationSpec"]["oneOf"]]
    assert {"FileSpec", "WebhookSpec"} <= set(offered) and len(offered) == len(channels.names())
    assert {"channel", "path"} <= set(schemas["FileSpec"]["required"])
    assert "url" in schemas["WebhookSpec"]["required"]


def test_each_channel_says_where_a_destination_delivers(file_installed: None):
    """What each attempt records as its target (and the console shows)."""
    def record(channel: str, **settings: Any) -> Destination:
        at = datetime(2030, 1, 1, tzinfo=UTC)
        return Destination("d", channel, settings, (), False, 86_400, OnUnknown.DECLARED, 10.0, False, False, False,
                           at, at)

    assert channels.target(record("webhook", url="https://hooks.example/in")) == "https://hooks.example/in"
    assert channels.target(record("email", host="smtp.example", port=587, tls="starttls")) == "smtp smtp.example:587"
    assert channels.target(record("kafka", topic="invoices", bootstrap_servers=["k1:9092", "k2:9092"])) == (
        "topic invoices on k1:9092, k2:9092")
    assert channels.target(record("file", path="/tmp/j.jsonl")) == "file"  # a channel that says nothing more
    assert channels.target(record("gone")) == "gone"  # no longer installed
