"""An intent whose stored times no datetime can hold, the issue's rows written into the database
by hand (plain sqlite3 on the real file; plain SQL on PostgreSQL), while the service runs with
its embedded sender and a real receiver: the sender sets it aside unsent and delivers the rest,
``/healthz`` and the console say so, the API lists and shows it, and the CLI shows and cancels
it. Before, every claim failed (nothing was delivered for any tenant), and the listings, the
console's search and ``outbox show``/``outbox cancel`` failed with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from outbox import IntentQuery, Status

from .. import pg
from ..conftest import eventually, rows
from ..problems import assert_problem
from ..receiver import Reply
from .conftest import OpenOps
from .test_console_pages import console

OUTBOX = str(Path(sys.executable).parent / "outbox")
#: By store: what each planted row is written with (the issue's two requests, as stored).
PLANTED = {
    "sqlite": {  # integer microseconds since 1970: 0000-12-31T23:00:00Z and 10000-01-01T00:59:59Z
        "expires_at": "-62135600400000000",
        "next_attempt_at": "253402304399000000",
        "now": lambda: str((datetime.now(UTC) - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)),
    },
    "postgres": {
        "expires_at": "'0001-01-01 00:00:00+01'",
        "next_attempt_at": "'9999-12-31 23:59:59-01'",
        "now": lambda: "now()",
    },
}


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}, "OUTBOX_DATABASE_URL": url,
           **(pg.key_env() if url.startswith("postgresql:") else {})}  # as every PostgreSQL process is given
    return subprocess.run([OUTBOX, *args], env=env, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


async def test_a_row_the_store_cannot_read_is_set_aside_and_the_rest_delivered(open_ops: OpenOps, store_url: str):
    ops = await open_ops(worker=True, database_url=store_url)
    url = ops.box.settings.database_url
    dialect = ops.box.store.dialect
    ops.receiver.script("/ok", Reply(200))
    await ops.destination("hook", "/ok")
    later = datetime.now(UTC) + timedelta(hours=1)  # not due until its row is written by hand
    await ops.enqueue("bad", not_before=later)
    await ops.enqueue("never", not_before=later)
    planted = PLANTED[dialect]
    await rows(url, f"UPDATE intents SET expires_at = {planted['expires_at']}, not_before = NULL, "
                    f"next_attempt_at = {planted['now']()} WHERE action_id = 'bad'")
    await rows(url, f"UPDATE intents SET next_attempt_at = {planted['next_attempt_at']} WHERE action_id = 'never'")
    for n in range(3):
        await ops.enqueue(f"good-{n}")

    async def settled() -> bool:
        return all([await ops.status(f"good-{n}") is Status.DELIVERED for n in range(3)]
                   + [await ops.status("bad") is Status.DEAD])

    assert await eventually(settled, 30), [(i.action_id, i.status) for i in
                                           (await ops.box.list_intents(IntentQuery())).intents]
    bad, history = await ops.box.show("bad")
    assert history.attempts == [] and history.events[-1].kind.value == "dead_lettered"
    assert bad.last_error and bad.last_error.startswith("set aside unsent: stored times beyond what can be read")
    assert "expires_at before 0001-01-01T00:00:00Z" in bad.last_error
    sent = {r.headers["idempotency-key"] for r in ops.receiver.requests("/ok")}
    assert sent == {f"acme/good-{n}" for n in range(3)}  # nothing was sent for it

    async with ops.client(None) as anyone:
        health = (await anyone.get("/healthz")).json()
    assert health["status"] == "degraded" and "set aside 1 intent whose stored times cannot be read" in health["detail"]
    assert "bad" not in health["detail"]  # the probes take no token: they name no intent

    async with ops.client(ops.operator) as c:
        listed = (await c.get("/v1/intents")).json()["items"]
        unreadable = {i["action_id"]: i["unreadable"] for i in listed}
        assert unreadable["good-0"] is None and "expires_at before" in unreadable["bad"]
        assert "next_attempt_at after 9999-12-31T23:59:59.999999Z" in unreadable["never"]
        assert (await c.get("/v1/intents/never")).json()["next_attempt_at"] == "9999-12-31T23:59:59.999999Z"
        assert_problem(await c.post("/v1/intents/bad/replay", json={"reason": "try"}), 409, "illegal-transition",
                       "cannot be sent")
        cancelled = await c.post("/v1/intents/never/cancel", json={"reason": "written by hand"})
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"

    async with console(ops) as http:
        overview = await http.get("/console")
        assert overview.status_code == 200 and "The sender set aside 1 intent(s)" in overview.text
        assert "/console/intents/bad?scope=acme" in overview.text
        found = await http.get("/console/intents", params={"status": "dead"})
        assert found.status_code == 200 and "unreadable" in found.text
        page = await http.get("/console/intents/bad")
        assert page.status_code == 200 and "the sender sets it aside unsent" in page.text

    shown = cli(url, "--json", "show", "bad")
    assert shown.returncode == 0, shown.stderr
    assert "expires_at before" in json.loads(shown.stdout)["unreadable"]
    gone = cli(url, "cancel", "bad", "--reason", "written by hand")
    assert gone.returncode == 0, gone.stderr
    assert await ops.status("bad") is Status.CANCELLED


async def test_a_stored_trace_context_that_is_not_one_fails_no_read_and_no_send(open_ops: OpenOps, store_url: str):
    """An intent's trace context written into the database by hand as text that is not its JSON.
    Before, every read that showed it failed (``GET /v1/intents/{id}``, each page of ``GET
    /v1/intents`` holding it, the console's search and its page: ``500``), and its attempt's span
    failed on it inside the send, which was recorded as maybe sent: ``unknown``, though nothing
    left. Now it reads as keeping no trace context."""
    ops = await open_ops(worker=True, database_url=store_url)
    ops.receiver.script("/ok", Reply(200))
    await ops.destination("hook", "/ok")
    later = datetime.now(UTC) + timedelta(hours=1)  # not due until its row is written by hand
    await ops.enqueue("t1", not_before=later)
    await ops.enqueue("t2", not_before=later)
    now = PLANTED[ops.box.store.dialect]["now"]()
    await rows(ops.box.settings.database_url, "UPDATE intents SET trace_context = CASE action_id WHEN 't1' THEN "
                                             "'not json' ELSE '{\"traceparent\": 5}' END, not_before = NULL, "
                                             f"next_attempt_at = {now} WHERE action_id IN ('t1', 't2')")

    async def delivered() -> bool:
        return [await ops.status(a) for a in ("t1", "t2")] == [Status.DELIVERED, Status.DELIVERED]

    assert await eventually(delivered, 30), [(a, await ops.status(a)) for a in ("t1", "t2")]
    assert sorted(r.headers["idempotency-key"] for r in ops.receiver.requests("/ok")) == ["acme/t1", "acme/t2"]
    async with ops.client(ops.operator) as operator:
        for action_id in ("t1", "t2"):
            shown = await operator.get(f"/v1/intents/{action_id}")
            assert shown.status_code == 200 and shown.json()["trace"] is None, shown.text
        listed = await operator.get("/v1/intents")
        assert listed.status_code == 200 and {i["action_id"] for i in listed.json()["items"]} == {"t1", "t2"}
    async with console(ops) as http:
        for path in ("/console/intents", "/console/intents/t1", "/console/intents/t2"):
            assert (await http.get(path)).status_code == 200, path


async def test_a_stored_attempt_count_past_what_can_be_counted_is_set_aside_and_the_rest_delivered(
        open_ops: OpenOps, store_url: str):
    """An attempt count written by hand at the top of its column (PostgreSQL's integer; SQLite's
    64 bits). The next attempt's number did not fit: the write of its start failed the cycle, and
    every cycle after it, since the failed start was kept to be written again, so nothing was
    delivered to any destination until the process restarted (``/healthz``: "the sender's cycles
    fail ... out of range"). Now the intent is set aside unsent, as one whose times cannot be read."""
    ops = await open_ops(worker=True, database_url=store_url)
    ops.receiver.script("/ok", Reply(200))
    await ops.destination("hook", "/ok")
    later = datetime.now(UTC) + timedelta(hours=1)  # not due until its row is written by hand
    await ops.enqueue("bad", not_before=later)
    top = 2**31 - 1 if ops.box.store.dialect == "postgres" else 2**63 - 1
    now = PLANTED[ops.box.store.dialect]["now"]()
    await rows(ops.box.settings.database_url, f"UPDATE intents SET attempts = {top}, max_attempts = {top}, "
                                             f"not_before = NULL, next_attempt_at = {now} WHERE action_id = 'bad'")
    await ops.enqueue("good")

    async def settled() -> bool:
        return [await ops.status(a) for a in ("good", "bad")] == [Status.DELIVERED, Status.DEAD]

    assert await eventually(settled, 30), [(a, await ops.status(a)) for a in ("good", "bad")]
    assert [r.headers["idempotency-key"] for r in ops.receiver.requests("/ok")] == ["acme/good"]
    bad = await ops.box.history("bad")
    assert bad.attempts == [] and bad.intent.attempts == top
    assert bad.intent.last_error.startswith("set aside unsent: a stored attempt count beyond what the sender "
                                            f"counts: attempts {top} (at most 2147482646)")
    async with ops.client(None) as anyone:
        health = (await anyone.get("/healthz")).json()
    assert "cycles fail" not in health.get("detail", "") and "set aside 1 intent" in health["detail"]
