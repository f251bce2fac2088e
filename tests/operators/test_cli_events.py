"""Events through the installed ``outbox`` command, run in subprocesses on a real SQLite file:
subscriptions with ``destinations put --subscribe``, ``publish``, and ``events show|list|deliver``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .test_cli import ACTOR, OUTBOX

pytestmark = pytest.mark.acceptance


def outbox(tmp_path: Path, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "OUTBOX_DATABASE_URL": f"sqlite:///{tmp_path / 'o.db'}",
           "HOME": str(tmp_path)}
    done = subprocess.run([OUTBOX, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == code, f"exit {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    return done


def as_json(tmp_path: Path, *args: str) -> Any:
    return json.loads(outbox(tmp_path, "--json", *args).stdout)


def test_subscribe_publish_show_list_and_deliver(tmp_path: Path):
    outbox(tmp_path, "migrate")
    put = as_json(tmp_path, "destinations", "put", "ledger", "--url", "https://ledger.example/hooks",
                  "--subscribe", "invoice.*", "--subscribe", "user.created=acme,shop")
    assert put["subscriptions"] == [{"topic": "invoice.*", "scopes": None},
                                    {"topic": "user.created", "scopes": ["acme", "shop"]}]
    outbox(tmp_path, "destinations", "put", "late", "--url", "https://late.example/hooks")
    outbox(tmp_path, "grants", "put", "acme-all", "--scope", "acme", "--destination", "*")
    refused = outbox(tmp_path, "destinations", "put", "bad", "--url", "https://x.example/", "--subscribe",
                     "Invoice.*", code=1)
    assert "malformed" in refused.stderr

    published = as_json(tmp_path, "publish", "--scope", "acme", "--topic", "invoice.paid", "--event-id", "e1",
                        "--payload", '{"invoice": 42}')
    assert published["created"] and [d["action_id"] for d in published["fanout"]] == ["evt~e1~ledger"]
    again = outbox(tmp_path, "publish", "--scope", "acme", "--topic", "invoice.paid", "--event-id", "e1",
                   "--payload", '{"invoice": 42}').stdout
    assert again.startswith("already published e1") and "evt~e1~ledger  pending" in again
    conflict = outbox(tmp_path, "publish", "--scope", "acme", "--topic", "invoice.sent", "--event-id", "e1",
                      "--payload", '{"invoice": 42}', code=1)
    assert "topic" in conflict.stderr

    shown = outbox(tmp_path, "events", "show", "e1").stdout
    assert "topic" in shown and "ledger" in shown and "late" not in shown
    delivered = as_json(tmp_path, "events", "deliver", "e1", "--destination", "late", "--reason", "catch up")
    assert delivered["created"] and {d["destination"] for d in delivered["fanout"]} == {"late", "ledger"}
    assert not as_json(tmp_path, "events", "deliver", "e1", "--destination", "late")["created"]
    intent = as_json(tmp_path, "show", "evt~e1~late")
    assert intent["event_id"] == "e1" and intent["events"][0]["actor"] == ACTOR
    assert intent["events"][0]["reason"] == "catch up"

    as_json(tmp_path, "publish", "--scope", "acme", "--topic", "user.deleted", "--event-id", "e2", "--payload", "{}")
    listed = outbox(tmp_path, "events", "list").stdout.splitlines()
    assert [line.split()[0] for line in listed] == ["e2", "e1"] and "2 intent(s)" in listed[1]
    assert [e["event_id"] for e in as_json(tmp_path, "events", "list", "--topic", "invoice.*")] == ["e1"]
