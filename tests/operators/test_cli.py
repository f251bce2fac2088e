"""Operators' powers through the installed ``outbox`` command, run in subprocesses on a real
SQLite file that the test prepares with the library and a real receiver."""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

from outbox import DestinationSpec, ManualClock, Outbox, Settings, Status
from outbox.grants import GrantSpec
from receivers.wire import new_secret
from sender.email import EmailSpec

from ..conftest import SECRET, eventually, snapshot
from ..receiver import Receiver, Reply
from .conftest import Filled

pytestmark = pytest.mark.acceptance
OUTBOX = str(Path(sys.executable).parent / "outbox")
ACTOR = f"cli:{getpass.getuser()}"


@dataclass
class Shell(Filled):
    """An outbox database that the test fills with the library and the CLI acts on."""

    cwd: Path
    db: Path
    box: Outbox
    clock: ManualClock | None
    receiver: Receiver

    def env(self, **extra: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
        return {**base, "OUTBOX_DATABASE_URL": f"sqlite:///{self.db}", **extra}

    def run(self, *args: str, code: int = 0, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([OUTBOX, *args], cwd=self.cwd, env=env or self.env(), capture_output=True,
                              text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert done.returncode == code, f"exit {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
        return done

    def json(self, *args: str, code: int = 0, env: dict[str, str] | None = None) -> Any:
        return json.loads(self.run("--json", *args, code=code, env=env).stdout)


async def _open(tmp_path: Path, clock: ManualClock | None = None) -> Shell:
    db = tmp_path / "cli.db"
    settings = Settings(database_url=f"sqlite:///{db}", authority="grants", authority_seconds=0,
                        backoff_initial_seconds=0.05, backoff_cap_seconds=0.2)
    box = await Outbox.open(settings=settings, clock=clock)
    await box.put_grant("acme-all", GrantSpec(scope="acme", destination="*"))
    return Shell(tmp_path, db, box, clock, Receiver().start())


@pytest.fixture
async def shell(tmp_path: Path) -> AsyncIterator[Shell]:
    sh = await _open(tmp_path)
    try:
        yield sh
    finally:
        sh.receiver.stop()
        await sh.box.close()


@pytest.fixture
async def old_shell(tmp_path: Path) -> AsyncIterator[Shell]:
    """As ``shell``, with a manual clock starting ten days ago."""
    sh = await _open(tmp_path, ManualClock(datetime.now(UTC) - timedelta(days=10)))
    try:
        yield sh
    finally:
        sh.receiver.stop()
        await sh.box.close()


# -- replay ------------------------------------------------------------------------------------


async def test_replay_one_intent(shell: Shell):
    switch = await shell.dead_letters("one-1", "one-2")
    before = snapshot(shell.db)
    missing = shell.run("replay", "one-1", code=2)
    assert "--reason" in missing.stderr
    blank = shell.run("replay", "one-1", "--reason", "   ", code=2)
    assert "say why" in blank.stderr
    both = shell.run("replay", "one-1", "--status", "dead", "--reason", "x", code=2)
    assert "not both" in both.stderr
    assert snapshot(shell.db) == before

    done = shell.run("replay", "one-1", "--reason", "receiver fixed")
    assert done.stdout.strip() == "replayed one-1 (now pending, 24 more attempts)"
    event = (await shell.box.history("one-1")).events[-1]
    assert (event.kind, event.actor, event.reason) == ("replayed", ACTOR, "receiver fixed")
    assert event.data == {"from": "dead", "accept_duplicate_risk": False}

    as_json = shell.json("replay", "one-2", "--reason", "also fixed")
    assert as_json["action_id"] == "one-2" and as_json["status"] == "pending"

    refused = shell.run("--json", "replay", "one-2", "--reason", "again", code=1)
    assert refused.stdout == ""
    error = json.loads(refused.stderr)
    assert error["error"] == "IllegalTransition" and "pending" in error["detail"]
    text_error = shell.run("replay", "nope-1", "--reason", "x", code=1)
    assert text_error.stderr.strip() == "error: intent 'nope-1' does not exist"

    switch.fix()
    await shell.deliver(["one-1", "one-2"])
    assert switch.successes() == {"one-1": 1, "one-2": 1}


async def test_replay_checks_authority_and_duplicate_risk(shell: Shell):
    shell.receiver.script("/ok", Reply(200))
    shell.receiver.script("/slow", Reply(200, delay=2))
    await shell.destination("hook", "/ok")
    await shell.destination("slow", "/slow", timeout_seconds=0.3)
    await shell.enqueue("auth-1", scope="globex")
    await shell.enqueue("dup-1", destination="slow")
    await shell.deliver(["auth-1", "dup-1"])
    assert await shell.status("auth-1") is Status.REVOKED
    assert await shell.status("dup-1") is Status.UNKNOWN

    denied = shell.run("replay", "auth-1", "--reason", "please", code=1)
    assert "authority does not allow 'auth-1' now" in denied.stderr
    risky = shell.run("replay", "dup-1", "--reason", "please", code=1)
    assert "--accept-duplicate-risk" in risky.stderr
    assert await shell.status("auth-1") is Status.REVOKED and await shell.status("dup-1") is Status.UNKNOWN

    shell.run("grants", "put", "globex-hook", "--scope", "globex", "--destination", "hook")
    assert shell.json("replay", "auth-1", "--reason", "granted")["status"] == "pending"
    accepted = shell.json("replay", "dup-1", "--reason", "checked", "--accept-duplicate-risk")
    assert accepted["status"] == "pending"
    assert (await shell.box.history("dup-1")).events[-1].data["accept_duplicate_risk"] is True


async def test_bulk_replay_dry_run_then_real_run(shell: Shell):
    ids = [f"bulk-{n}" for n in range(5)]
    switch = await shell.dead_letters(*ids)
    await shell.enqueue("bulk-rev", scope="globex")
    await shell.deliver(["bulk-rev"])
    assert await shell.status("bulk-rev") is Status.REVOKED
    before = snapshot(shell.db)

    dry = shell.run("replay", "--status", "dead", "--dry-run", "--reason", "receiver back")
    lines = dry.stdout.strip().splitlines()
    assert lines[-1] == "5 intent(s) would be replayed"
    assert sorted(line.split()[0] for line in lines[:-1]) == ids
    assert all(" dead " in line and "attempts exhausted" in line for line in lines[:-1])
    dry_json = shell.json("replay", "--status", "dead", "--dry-run", "--reason", "receiver back")
    assert dry_json["dry_run"] is True and dry_json["matched"] == 5 and sorted(dry_json["action_ids"]) == ids
    everything = shell.json("replay", "--dry-run", "--reason", "all of them")  # dead, revoked and unknown
    assert sorted(everything["action_ids"]) == sorted([*ids, "bulk-rev"])
    assert snapshot(shell.db) == before

    real = shell.run("replay", "--status", "dead", "--destination", "hook", "--reason", "receiver back")
    assert real.stdout.strip().splitlines()[-1] == "replayed 5 of 5"
    assert "replaying" in real.stderr  # the progress bar (a plain label when stderr is not a terminal)
    for action_id in ids:
        assert await shell.status(action_id) is Status.PENDING
        event = (await shell.box.history(action_id)).events[-1]
        assert (event.kind, event.actor, event.reason) == ("replayed", ACTOR, "receiver back")
    assert await shell.status("bulk-rev") is Status.REVOKED

    # what authority still refuses is listed, and the exit code says so
    listed = shell.run("replay", "--status", "revoked", "--reason", "the rest", code=1).stdout.strip().splitlines()
    assert len(listed) == 2 and listed[1] == "replayed 0 of 1", listed
    assert listed[0].startswith("refused bulk-rev: authority does not allow 'bulk-rev' now: no live grant"), listed
    refused = shell.run("--json", "replay", "--reason", "the rest", code=1)
    result = json.loads(refused.stdout)
    assert result["matched"] == 1 and result["replayed"] == 0 and list(result["refused"]) == ["bulk-rev"]
    assert "no live grant" in result["refused"]["bulk-rev"]

    switch.fix()
    await shell.deliver(ids)
    assert switch.successes() == dict.fromkeys(ids, 1)


# -- resolve, cancel, approve, reject ----------------------------------------------------------


async def test_resolve_cancel_approve_and_reject(shell: Shell):
    shell.receiver.script("/slow", Reply(200, delay=2))
    shell.receiver.script("/ok", Reply(200))
    await shell.destination("slow", "/slow", timeout_seconds=0.3)
    await shell.destination("hook", "/ok")
    await shell.destination("approvals", "/ok", requires_approval=True)
    await shell.enqueue("res-1", destination="slow")
    await shell.enqueue("res-2", destination="slow")
    await shell.deliver(["res-1", "res-2"])
    shell.receiver.script("/slow", Reply(200))
    await shell.enqueue("can-1")
    await shell.enqueue("hold-1", destination="approvals")
    await shell.enqueue("hold-2", destination="approvals")

    done = shell.run("resolve", "res-1", "--as", "delivered", "--external-id", "inv-77", "--reason", "seen at receiver")
    assert done.stdout.strip() == "resolved res-1: delivered"
    event = (await shell.box.history("res-1")).events[-1]
    assert (event.kind, event.actor, event.reason) == ("resolved", ACTOR, "seen at receiver")
    assert event.data == {"resolution": "delivered", "external_id": "inv-77"}
    assert shell.json("resolve", "res-2", "--as", "retry", "--reason", "never arrived")["status"] == "pending"
    shell.run("resolve", "res-2", "--as", "dead", "--reason", "x", code=1)  # no longer unknown
    shell.run("resolve", "res-1", "--as", "maybe", "--reason", "x", code=2)

    assert shell.run("cancel", "can-1", "--reason", "duplicate").stdout.strip() == "cancelled can-1"
    assert await shell.status("can-1") is Status.CANCELLED
    shell.run("cancel", "can-1", code=2)  # --reason is required

    held = await shell.box.get("hold-1")
    assert held.status is Status.HELD
    wrong = shell.run("approve", "hold-1", "--digest", "sha256:" + "0" * 64, "--reason", "ok", code=1)
    assert held.payload_digest in wrong.stderr
    approved = shell.run("approve", "hold-1", "--digest", held.payload_digest, "--valid-seconds", "600",
                         "--reason", "reviewed")
    assert approved.stdout.startswith("approved hold-1 until ")
    intent = await shell.box.get("hold-1")
    assert intent.status is Status.PENDING and intent.approved_digest == held.payload_digest
    assert intent.approved_by == ACTOR
    assert timedelta(seconds=590) < intent.approval_expires_at - datetime.now(UTC) <= timedelta(seconds=600)

    assert shell.run("reject", "hold-2", "--reason", "wrong amount").stdout.strip() == "rejected hold-2"
    assert await shell.status("hold-2") is Status.CANCELLED
    assert (await shell.box.history("hold-2")).events[-1].kind == "rejected"

    await shell.deliver(["res-2", "hold-1"])
    assert await shell.status("res-2") is Status.DELIVERED and await shell.status("hold-1") is Status.DELIVERED
    assert sorted(r.headers["idempotency-key"] for r in shell.receiver.requests("/ok")) == ["acme/hold-1"]


# -- prune and list ----------------------------------------------------------------------------


async def _history_over_ten_days(shell: Shell) -> None:
    """old-1, old-2 delivered, old-dead dead and old-cancel cancelled ten days ago; new-1
    delivered and new-2 pending now."""
    from outbox import operations

    assert shell.clock is not None
    shell.receiver.script("/ok", Reply(200))
    shell.receiver.script("/no", Reply(400))
    await shell.destination("hook", "/ok")
    await shell.destination("refuses", "/no")
    for action_id in ("old-1", "old-2"):
        await shell.enqueue(action_id)
    await shell.enqueue("old-dead", destination="refuses")
    await shell.enqueue("old-cancel", not_before=shell.clock.now() + timedelta(hours=1))
    await operations.cancel(shell.box, "old-cancel", operations.Actor("test", "not needed"))
    await shell.deliver(["old-1", "old-2", "old-dead"])
    shell.clock.advance(timedelta(days=10).total_seconds() - 5)
    await shell.enqueue("new-1")
    await shell.deliver(["new-1"])
    await shell.enqueue("new-2", not_before=datetime.now(UTC) + timedelta(days=1))
    statuses = {i: (await shell.box.get(i)).status.value for i in
                ("old-1", "old-2", "old-dead", "old-cancel", "new-1", "new-2")}
    assert statuses == {"old-1": "delivered", "old-2": "delivered", "old-dead": "dead",
                        "old-cancel": "cancelled", "new-1": "delivered", "new-2": "pending"}


async def test_prune_dry_run_then_real_run(old_shell: Shell):
    shell = old_shell
    await _history_over_ten_days(shell)
    before = snapshot(shell.db)

    assert shell.run("prune", "--older-than-days", "30", "--dry-run").stdout.strip() == "would prune 0 intent(s)"
    dry = shell.run("prune", "--older-than-days", "5", "--dry-run")
    assert dry.stdout.strip() == "would prune 3 intent(s)"
    dry_json = shell.json("prune", "--older-than-days", "5", "--dry-run")
    assert dry_json["dry_run"] is True and sorted(dry_json["action_ids"]) == ["old-1", "old-2", "old-cancel"]
    # the default age is the retention setting (7 days) ...
    assert shell.json("prune", "--dry-run")["pruned"] == 3
    # ... which OUTBOX_DELIVERED_RETENTION_SECONDS changes
    eleven_days = shell.env(OUTBOX_DELIVERED_RETENTION_SECONDS=str(11 * 86_400))
    assert shell.json("prune", "--dry-run", env=eleven_days)["pruned"] == 0
    assert snapshot(shell.db) == before

    five_days = shell.env(OUTBOX_DELIVERED_RETENTION_SECONDS=str(5 * 86_400))
    pruned = shell.json("prune", env=five_days)
    assert pruned["dry_run"] is False and sorted(pruned["action_ids"]) == ["old-1", "old-2", "old-cancel"]
    left = shell.json("list")["items"]
    assert sorted(i["action_id"] for i in left) == ["new-1", "new-2", "old-dead"]
    gone = shell.run("show", "old-1", code=1)
    assert "does not exist" in gone.stderr
    after = snapshot(shell.db)
    assert not [row for row in after["events"] if row not in before["events"]]  # nothing new was written
    assert len(after["events"]) < len(before["events"]) and len(after["attempts"]) < len(before["attempts"])
    assert shell.run("prune", "--older-than-days", "5").stdout.strip() == "pruned 0 intent(s)"


PAST_RETENTION = ["old-1", "old-2", "old-cancel"]


async def test_prune_takes_as_many_batches_as_it_needs(old_shell: Shell, monkeypatch):
    """Three intents are past retention and a batch holds two: all three go."""
    from outbox import operations

    monkeypatch.setattr(operations, "PRUNE_BATCH", 2)
    await _history_over_ten_days(old_shell)
    five_days = timedelta(days=5)
    assert sorted(await operations.prune(old_shell.box, older_than=five_days, dry_run=True)) == PAST_RETENTION
    assert sorted(await operations.prune(old_shell.box, older_than=five_days, dry_run=False)) == PAST_RETENTION
    assert await operations.prune(old_shell.box, older_than=five_days, dry_run=False) == []


async def test_the_workers_prune_takes_as_many_batches_as_it_needs(old_shell: Shell, monkeypatch):
    from outbox import operations
    from sender import Worker

    monkeypatch.setattr(operations, "PRUNE_BATCH", 2)
    await _history_over_ten_days(old_shell)
    worker = Worker(old_shell.box)  # retention: the default 7 days
    running = asyncio.create_task(worker.run())

    async def left() -> list[str]:
        return [i for i in PAST_RETENTION if await old_shell.box.store.intents_named(i)]

    async def all_gone() -> bool:
        return not await left()

    try:
        assert await eventually(all_gone, timeout=10), f"the worker's prune left {await left()}"
    finally:
        worker.stop()
        await asyncio.wait_for(running, 10)


async def test_list_created_after(old_shell: Shell):
    shell = old_shell
    await _history_over_ten_days(shell)
    since = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S+00:00")
    recent = shell.json("list", "--created-after", since)
    assert [i["action_id"] for i in recent["items"]] == ["new-2", "new-1"]  # newest first
    assert recent["next_cursor"] is None
    text = shell.run("list", "--created-after", since, "--status", "delivered").stdout.strip().splitlines()
    assert text[0].split() == ["ACTION_ID", "STATUS", "DESTINATION", "SCOPE", "ATTEMPTS"]
    assert len(text) == 2 and text[1].split()[:2] == ["new-1", "delivered"]
    older = shell.json("list", "--created-before", since, "--status", "delivered")
    assert sorted(i["action_id"] for i in older["items"]) == ["old-1", "old-2"]
    paged = shell.json("list", "--limit", "2")
    assert len(paged["items"]) == 2 and paged["next_cursor"] is not None
    rest = shell.json("list", "--limit", "10", "--cursor", paged["next_cursor"])
    assert len(paged["items"]) + len(rest["items"]) == 6
    assert rest["items"][0]["created_at"] <= paged["items"][-1]["created_at"]
    more = shell.run("list", "--limit", "2").stdout.strip().splitlines()[-1]
    assert more == f"more: --cursor {paged['next_cursor']}"
    for bad_time in ("yesterday", since.replace("+00:00", "+0000")):  # (RFC 3339's offset has its colon)
        bad = shell.run("list", "--created-after", bad_time, code=2)
        assert "--created-after" in bad.stderr and "RFC 3339" in bad.stderr
    altered = shell.run("list", "--cursor", "bm90LWEtY3Vyc29y", code=2)
    assert "--cursor" in altered.stderr and "Traceback" not in altered.stderr


async def test_the_times_the_cli_prints_are_accepted_back(old_shell: Shell):
    shell = old_shell
    await _history_over_ten_days(shell)
    everything = shell.json("list")["items"]
    printed = everything[0]["created_at"]  # RFC 3339 in UTC with fractions and Z (new-1's and new-2's)
    assert printed.endswith("Z") and "." in printed
    after = shell.json("list", "--created-after", printed)  # from that microsecond on
    before = shell.json("list", "--created-before", printed)
    assert [i["action_id"] for i in after["items"]] == ["new-2", "new-1"]
    assert [i["action_id"] for i in before["items"]] == [i["action_id"] for i in everything[2:]]
    offset = shell.json("list", "--created-before", "2999-01-01T01:00:00.5+01:00")
    assert len(offset["items"]) == 6
    for wrong in ("2026-11-30", "2026-11-30T08:30:07", "2026-11-30T08:30:07.Z", "2026-11-30T08:30:07Zjunk"):
        refused = shell.run("list", "--created-after", wrong, code=2)
        assert "RFC 3339" in refused.stderr and "Traceback" not in refused.stderr


async def test_a_time_outside_the_range_the_stores_hold_is_a_usage_error_and_stores_nothing(shell: Shell):
    """``--expires-at 0001-01-01T00:00:00+01:00`` stored a row that then failed every claim."""
    await shell.destination("hook", "/ok")
    before = snapshot(shell.db)
    for option, value in (("--expires-at", "0001-01-01T00:00:00+01:00"), ("--not-before", "9999-12-31T23:59:59-01:00")):
        refused = shell.run("enqueue", "--destination", "hook", "--scope", "acme", "--payload", "{}", option, value,
                            code=2)
        assert "outside the times the outbox takes" in refused.stderr and option in refused.stderr
        assert "Traceback" not in refused.stderr
    granted = shell.run("grants", "put", "g", "--scope", "acme", "--destination", "hook", "--expires-at",
                        "0001-01-01T00:00:00+00:01", code=2)
    assert "outside the times" in granted.stderr
    assert "outside the times" in shell.run("list", "--created-after", "9999-06-01T00:00:00Z", code=2).stderr
    assert snapshot(shell.db) == before


async def test_a_bad_setting_is_a_usage_error_that_names_it(shell: Shell):
    cases = (("OUTBOX_PORT", "abc", "valid integer"),
             ("OUTBOX_LOG_LEVEL", "verbose", "'debug', 'info', 'warning' or 'error'"),
             ("OUTBOX_LEASE_SECONDS", "-1", "greater than 0"))
    for variable, value, why in cases:
        done = shell.run("worker", code=2, env=shell.env(**{variable: value}))
        assert f"{variable} (or " in done.stderr and repr(value) in done.stderr and why in done.stderr
        assert "Traceback" not in done.stderr
    secret = "has a space in it, x"  # a metrics token refused is not printed
    done = shell.run("worker", code=2, env=shell.env(OUTBOX_METRICS_TOKEN=secret))
    assert "OUTBOX_METRICS_TOKEN (or metrics_token in outbox.toml) = (not shown: a secret)" in done.stderr
    assert "visible ASCII" in done.stderr and secret not in done.stderr
    (shell.cwd / "outbox.toml").write_text("prot = 9001\n")
    done = shell.run("list", code=2)
    assert "OUTBOX_PROT (or prot in outbox.toml)" in done.stderr and "Extra inputs" in done.stderr
    (shell.cwd / "outbox.toml").unlink()
    assert shell.json("list", env=shell.env(OUTBOX_LOG_LEVEL="WARNING")) == {"items": [], "next_cursor": None}


async def test_destinations_put_refuses_a_host_the_sender_would_refuse(shell: Shell):
    before = snapshot(shell.db)
    disguised = shell.run("destinations", "put", "internal", "--url", "http://１２７.０.０.１:8080/hook", code=1)
    assert "host '１２７.０.０.１' is read as the address '127.0.0.1'" in disguised.stderr
    numeric = shell.run("--json", "destinations", "put", "internal", "--url", "http://0x7f000001:8080/hook",
                        "--allow-private-network", code=1)
    error = json.loads(numeric.stderr)
    assert error["error"] == "InvalidInput" and "looks like an IPv4 address" in error["detail"]
    private = shell.run("destinations", "put", "internal", "--url", "http://10.0.0.1/hook", code=1)
    assert "10.0.0.1 is not a public address" in private.stderr and "--allow-private-network" in private.stderr
    assert "Traceback" not in disguised.stderr + private.stderr
    assert "input_value" not in disguised.stderr + private.stderr  # one line per problem, not pydantic's dump
    assert snapshot(shell.db) == before


async def test_destinations_put_takes_the_channel_and_its_own_settings(shell: Shell):
    """``--channel`` names a channel from the registry and ``--set NAME=VALUE`` carries its own
    settings (a JSON value or else text); ``--url`` is the webhook's shorthand for one."""
    before = snapshot(shell.db)
    unknown = shell.run("destinations", "put", "fax", "--channel", "fax", "--set", "number=1", code=1)
    installed = ", ".join(sorted(entry.name for entry in entry_points(group="outbox.channels")))
    assert f"there is no channel 'fax'; installed: {installed}" in unknown.stderr
    assert {"email", "kafka", "webhook"} <= set(installed.split(", "))
    malformed = shell.run("destinations", "put", "hook", "--set", "url", code=1)
    assert "--set takes NAME=VALUE, not 'url'" in malformed.stderr
    shared = shell.run("destinations", "put", "hook", "--set", "url=https://h.example/", "--set", "idempotent=true",
                       code=1)
    assert "--set idempotent=... names a shared option; use --idempotent" in shared.stderr
    stranger = shell.run("destinations", "put", "hook", "--set", "url=https://h.example/", "--set", "port=587",
                         code=1)
    assert "port: Extra inputs are not permitted" in stranger.stderr
    assert snapshot(shell.db) == before
    made = shell.json("destinations", "put", "hook", "--channel", "webhook", "--set", "url=https://h.example/in")
    assert (made["channel"], made["url"], made["created"], made["signing_secrets"]) == (
        "webhook", "https://h.example/in", True, 1)
    assert made["generated_secret"].startswith("whsec_")
    listed = shell.run("destinations", "list").stdout
    assert "hook" in listed and "webhook" in listed and "https://h.example/in" in listed


async def test_ordering_is_set_on_a_destination_and_show_says_what_an_intent_waits_behind(shell: Shell):
    made = shell.json("destinations", "put", "ordered", "--url", "https://h.example/in", "--set", "ordering=key",
                      "--set", "ordering_on_dead=skip")
    assert (made["ordering"], made["ordering_on_dead"]) == ("key", "skip")
    refused = shell.run("destinations", "put", "ordered", "--url", "https://h.example/in", "--set", "ordering=lol",
                        code=1)
    assert "ordering" in refused.stderr
    for action_id in ("first", "second"):
        shell.run("enqueue", "--destination", "ordered", "--scope", "acme", "--action-id", action_id,
                  "--ordering-key", "customer-7", "--payload", "{}")
    assert "waiting          behind first (pending)" in shell.run("show", "second").stdout
    shown = shell.json("show", "second")
    assert shown["ordering_key"] == "customer-7" and shown["waiting_behind"]["action_id"] == "first"
    assert shell.json("show", "first")["waiting_behind"] is None
    bad = shell.run("enqueue", "--destination", "ordered", "--scope", "acme", "--ordering-key", "a b",
                    "--payload", "{}", code=1)
    assert "ordering_key 'a b' is malformed" in bad.stderr


async def test_a_retry_schedule_and_a_max_age_are_set_from_the_cli(shell: Shell):
    made = shell.json("destinations", "put", "hook", "--url", "https://h.example/in",
                      "--retry-schedule", "5,30,0.5", "--max-age-seconds", "3600")
    assert (made["retry_schedule"], made["max_age_seconds"]) == ([5, 30, 0.5], 3600)
    assert "retry_schedule         [5, 30, 0.5]" in shell.run("destinations", "show", "hook").stdout
    before = snapshot(shell.db)
    words = shell.run("destinations", "put", "hook", "--url", "https://h.example/in", "--retry-schedule", "5,soon",
                      code=2)
    assert "takes seconds separated by commas (5,30,300), not '5,soon'" in words.stderr
    long = shell.run("destinations", "put", "hook", "--url", "https://h.example/in", "--retry-schedule", "7200",
                     code=1)
    assert "less than or equal to 3600" in long.stderr
    assert snapshot(shell.db) == before
    cleared = shell.json("destinations", "put", "hook", "--url", "https://h.example/in")
    assert (cleared["retry_schedule"], cleared["max_age_seconds"]) == (None, None)


async def test_an_email_destination_from_the_cli_keeps_the_channels_defaults(shell: Shell):
    """Options left out take the channel's defaults (an email destination's on_unknown is never),
    and a destination's own settings read back as name=value."""
    made = shell.json("destinations", "put", "mail", "--channel", "email", "--set", "host=smtp.example.com",
                      "--set", "port=465", "--set", "tls=implicit", "--set", "from=Shop <shop@example.com>")
    assert (made["on_unknown"], made["port"], made["tls"], made["signing_secrets"]) == ("never", 465, "implicit", 0)
    assert "generated_secret" not in made  # an SMTP password is not the outbox's to invent
    chosen = shell.json("destinations", "put", "mail", "--channel", "email", "--set", "host=smtp.example.com",
                        "--set", "from=shop@example.com", "--on-unknown", "always")
    assert chosen["on_unknown"] == "always" and chosen["created"] is False
    listed = shell.run("destinations", "list").stdout
    assert "mail" in listed and "host=smtp.example.com port=587 tls=starttls" in listed


async def test_a_kafka_destination_from_the_cli_gets_a_signing_secret_and_keeps_its_sasl_password(shell: Shell):
    """A new Kafka destination is given a signing secret, printed once; its SASL password is a
    setting of its own that no answer shows, and a rotation of the signing secret keeps it."""
    kafka = ("destinations", "put", "events", "--channel", "kafka", "--set", 'bootstrap_servers=["k.example.com:9092"]',
             "--set", "topic=orders", "--set", "tls=true", "--set", "sasl_mechanism=PLAIN",
             "--set", "sasl_username=svc")
    made = shell.json(*kafka, "--set", "sasl_password=hunter2-pw")
    assert made["generated_secret"].startswith("whsec_")
    assert "hunter2" not in json.dumps(made)
    rotated = shell.json(*kafka, "--secret", new_secret())
    assert rotated["created"] is False and "generated_secret" not in rotated
    held = (await shell.box.get_destination("events")).secrets
    assert held[1:] == (made["generated_secret"], "hunter2-pw")  # the password kept, last


# -- tokens ------------------------------------------------------------------------------------


async def test_the_host_may_revoke_the_last_admin_token_and_is_told_how_to_make_another(shell: Shell):
    """The API refuses it (409 last-admin); on the host another can always be made, and a leaked
    last admin token must stop working at once."""
    made = shell.json("tokens", "create", "--role", "admin")
    revoked = shell.run("tokens", "revoke", made["id"])
    assert revoked.stdout.strip() == f"revoked {made['id']}"
    assert "warning: no active admin token is left" in revoked.stderr
    assert "outbox tokens create --role admin" in revoked.stderr
    assert [t["revoked_at"] is not None for t in shell.json("tokens", "list")] == [True]
    kept = shell.json("tokens", "create", "--role", "admin")
    other = shell.json("tokens", "create", "--role", "admin")
    assert shell.run("tokens", "revoke", other["id"]).stderr == ""  # another is left: no warning
    assert await shell.box.store.count_active_tokens("admin") == 1 and kept["revoked_at"] is None



async def test_tenants_portal_link_mints_a_link_under_the_oldest_admin_token_or_the_one_named(shell: Shell):
    """The link opens the portal as the scope's tenant once (the library opens it here, as the
    portal's /portal/open does); it is minted under a token, and revoking that token ends it."""
    shell.run("tenants", "portal-link", "acme", code=2)  # no admin token yet: told how to make one
    admin = shell.json("tokens", "create", "--role", "admin")
    shell.json("tokens", "create", "--role", "admin")
    globex = shell.json("tokens", "create", "--role", "producer", "--scope", "globex")
    printed = shell.run("tenants", "portal-link", "acme", "--base-url", "https://hooks.example/").stdout.strip()
    assert re.fullmatch(r"https://hooks\.example/portal/open\?link=[A-Za-z0-9_-]{43}", printed), printed
    minted = shell.json("tenants", "portal-link", "acme", "--read-only", "--session-seconds", "120")
    assert minted["url"].startswith("/portal/open?link=") and minted["scope"] == "acme"
    assert (minted["read_only"], minted["session_seconds"]) == (True, 120)
    link_of = {"printed": printed.rsplit("=", 1)[1], "minted": minted["url"].rsplit("=", 1)[1]}
    opened = await shell.box.open_portal_link(link_of["minted"])
    assert opened is not None and opened[1].scope == "acme" and opened[1].read_only
    assert await shell.box.open_portal_link(link_of["minted"]) is None  # once
    refused = shell.run("tenants", "portal-link", "acme", "--token-id", globex["id"], code=2)
    assert "not an active admin token or producer token of 'acme'" in refused.stderr
    shell.run("tenants", "portal-link", "globex", "--token-id", globex["id"])
    shell.run("tokens", "revoke", admin["id"])  # the oldest admin's: its link opens nothing now
    assert await shell.box.open_portal_link(link_of["printed"]) is None
    assert await shell.box.portal_session(opened[0]) is None
    too_long = shell.run("tenants", "portal-link", "acme", "--session-seconds", "999999", code=1)
    assert "portal_session_seconds" in too_long.stderr

# -- rough edges a newcomer meets ------------------------------------------------------------


async def test_json_is_accepted_after_the_command_as_well_as_before(shell: Shell):
    await shell.destination("hook", "/ok")
    await shell.enqueue("json-1")
    for args in (("list",), ("show", "json-1"), ("tokens", "list"), ("grants", "list"), ("destinations", "list"),
                 ("destinations", "show", "hook")):
        before = json.loads(shell.run("--json", *args).stdout)
        after = json.loads(shell.run(*args, "--json").stdout)
        assert before == after, args
    assert [i["action_id"] for i in shell.json("list")["items"]] == ["json-1"]
    refused = shell.run("show", "nope-1", "--json", code=1)
    assert json.loads(refused.stderr)["error"] == "NotFound" and refused.stdout == ""


async def test_show_writes_absent_values_and_booleans_as_json_does_never_as_python(shell: Shell):
    """An intent with no ordering key, times or error, and an attempt without a status code: each
    absent value reads ``-``, a boolean ``true``/``false``, as in --json (null, false), never
    Python's None or False."""
    with socket.socket() as s:  # a port nobody listens on: the attempt gets no status code
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    await shell.box.put_destination("gone", DestinationSpec(url=f"http://127.0.0.1:{closed}/hook", secret=SECRET,
                                                            allow_private_network=True))
    await shell.enqueue("plain-1", destination="gone", max_attempts=1)
    await shell.deliver(["plain-1"])
    await shell.box.put_destination("mail", EmailSpec.model_validate(
        {"channel": "email", "host": "smtp.example.com", "from": "shop@example.com"}))
    shown = shell.run("show", "plain-1").stdout
    fields = dict(line.split(None, 1) for line in shown.splitlines()
                  if not line.startswith((" ", "attempts", "events")))
    assert (fields["ordering_key"], fields["not_before"], fields["lease_owner"]) == ("-", "-", "-")
    assert fields["status"] == "dead" and fields["payload"] == '{"action": "plain-1"}'
    [attempt] = [line for line in shown.splitlines() if line.startswith("  #")]
    assert re.fullmatch(r"  #1 \S+ not_submitted retryable ClientConnectorError: .+", attempt), attempt
    described = shell.run("destinations", "show", "mail").stdout
    settings = dict(line.split(None, 1) for line in described.splitlines())
    assert settings["idempotent"] == "false" and settings["reply_to"] == "-" and settings["headers"] == "{}"
    for printed in (shown, described):
        assert not re.search(r"\b(None|False|True)\b", printed), printed


async def test_an_unreadable_payload_file_is_one_error_line(shell: Shell):
    await shell.destination("hook", "/ok")
    before = snapshot(shell.db)
    for path in ("/missing.json", str(shell.cwd)):
        done = shell.run("enqueue", "--destination", "hook", "--scope", "acme", "--payload", f"@{path}", code=1)
        assert done.stderr.startswith(f"error: --payload @{path}: cannot read it: ")
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert snapshot(shell.db) == before


async def test_commands_refuse_to_create_a_database_elsewhere(shell: Shell):
    elsewhere = shell.cwd / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in shell.env().items() if k != "OUTBOX_DATABASE_URL"}
    for args in (("list",), ("show", "x-1"), ("tokens", "create", "--role", "admin"), ("grants", "list"),
                 ("enqueue", "--destination", "hook", "--scope", "acme", "--payload", "{}"),
                 ("replay", "--reason", "x")):
        done = subprocess.run([OUTBOX, *args], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1, (args, done.stderr)
        assert done.stderr.startswith("error: there is no outbox database at sqlite:///./outbox.db (")
        assert str(elsewhere / "outbox.db") in done.stderr and "OUTBOX_DATABASE_URL" in done.stderr
    as_json = subprocess.run([OUTBOX, "list", "--json"], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert json.loads(as_json.stderr)["error"] == "NoDatabase"
    assert list(elsewhere.iterdir()) == []
    migrated = subprocess.run([OUTBOX, "migrate"], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert migrated.returncode == 0 and (elsewhere / "outbox.db").exists()
    listed = subprocess.run([OUTBOX, "list"], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert listed.returncode == 0 and listed.stdout.strip() == "no intents"


async def test_every_cli_event_names_the_user_the_same_way(shell: Shell):
    await shell.destination("hook", "/ok")
    shell.run("enqueue", "--destination", "hook", "--scope", "acme", "--payload", "{}", "--action-id", "who-1",
              "--not-before", "2999-01-01T00:00:00Z")
    shell.run("cancel", "who-1", "--reason", "not needed")
    events = (await shell.box.history("who-1")).events
    assert [(e.kind, e.actor) for e in events] == [("enqueued", ACTOR), ("cancelled", ACTOR)]


async def test_replay_gives_a_fresh_budget_counted_from_the_attempts_made(shell: Shell):
    shell.receiver.script("/no", Reply(400))
    await shell.destination("refuses", "/no", idempotent=True)
    await shell.enqueue("budget-1", destination="refuses")
    budget = shell.box.settings.default_max_attempts
    assert (await shell.box.get("budget-1")).max_attempts == budget
    for made in (1, 2):
        await shell.deliver(["budget-1"])  # refused at once: a dead letter after one more attempt
        intent = await shell.box.get("budget-1")
        assert (intent.status, intent.attempts) == (Status.DEAD, made)
        replayed = shell.run("replay", "budget-1", "--reason", f"round {made}")
        assert replayed.stdout.strip() == f"replayed budget-1 (now pending, {budget} more attempts)"
        intent = await shell.box.get("budget-1")
        # attempts are never renumbered, so the ceiling is the attempts made plus a fresh budget
        assert (intent.attempts, intent.max_attempts) == (made, made + budget)


def test_replay_help_lists_statuses_in_one_order(tmp_path: Path):
    for _ in range(3):
        shown = subprocess.run([OUTBOX, "replay", "--help"], capture_output=True, text=True, check=True,
                               env={**os.environ, "PYTHONHASHSEED": "random"}).stdout
        assert "[dead|revoked|unknown]" in shown


def test_the_shell_completion_script_is_produced(tmp_path: Path):
    for shell_name, marker in (("bash", "complete -o nosort -F _outbox_completion outbox"),
                               ("zsh", "#compdef outbox"), ("fish", "complete --no-files --command outbox")):
        done = subprocess.run([OUTBOX], env={**os.environ, "_OUTBOX_COMPLETE": f"{shell_name}_source"},
                              capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert done.returncode == 0 and marker in done.stdout, shell_name
    words = subprocess.run([OUTBOX], env={**os.environ, "_OUTBOX_COMPLETE": "bash_complete",
                                          "COMP_WORDS": "outbox rep", "COMP_CWORD": "1"},
                           capture_output=True, text=True, timeout=60, cwd=tmp_path).stdout
    assert "plain,replay" in words.splitlines()
    assert list(tmp_path.iterdir()) == []


async def test_a_tenant_token_is_made_and_a_secret_rotated_with_its_window_printed_once(shell: Shell):
    tenant = shell.json("tokens", "create", "--role", "tenant", "--scope", "acme")
    assert (tenant["role"], tenant["scopes"]) == ("tenant", ["acme"]) and tenant["token"].startswith("obx_")
    refused = shell.run("tokens", "create", "--role", "tenant", "--scope", "acme", "--scope", "globex", code=1)
    assert "exactly one scope" in refused.stderr
    made = shell.json("destinations", "put", "hook", "--url", "https://h.example/in")
    rotated = shell.json("destinations", "rotate-secret", "hook", "--window-seconds", "3600")
    assert rotated["secret"].startswith("whsec_") and rotated["secret"] != made["generated_secret"]
    assert rotated["signing_secrets"] == 2 and rotated["previous_secrets_until"]
    assert "new signing secret (shown once" in shell.run("destinations", "rotate-secret", "hook").stdout
    assert shell.json("destinations", "list", "--owner", "acme") == []
