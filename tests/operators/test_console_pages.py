"""The console's pages over HTTP, as on call uses them: the overview's charts and destination
health, the intent search, bulk replay (dry run, reason, progress) and the intent page, against
a real outbox served by uvicorn, a real receiver and in-process workers."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

from outbox import DestinationSpec, Status

from ..conftest import SECRET
from ..receiver import Reply
from .conftest import OpenOps, Ops
from .signing import csrf, signed_in


@asynccontextmanager
async def console(ops: Ops) -> AsyncIterator[httpx.AsyncClient]:
    """A client signed in to the console with the operator token (its cookie kept)."""
    async with httpx.AsyncClient(base_url=ops.url, timeout=30) as http:
        answer = await signed_in(http, ops.operator)
        assert answer.status_code == 303 and answer.headers["location"] == "/console"
        yield http


def rows(html: str, heading: str) -> list[str]:
    """The text of each row of the table under ``heading`` (tags dropped), header row excluded."""
    section = html.split(f">{heading}</h2>", 1)[1].split("</table>", 1)[0]
    return [re.sub(r"<[^>]+>", " ", row) for row in section.split("<tr>")[2:]]


async def test_the_overview_charts_the_last_hour_and_each_destinations_health(ops: Ops):
    await ops.dead_letters("d1", "d2")  # /flaky answers 503: two failed attempts to "hook"
    ops.receiver.script("/ok", Reply(200, body={"ok": True}))
    await ops.destination("fine", "/ok")
    await ops.enqueue("ok-1", destination="fine")
    await ops.deliver(["ok-1"])
    await ops.destination("idle", "/ok")
    async with console(ops) as http:
        page = (await http.get("/console")).text
    assert "<script" not in page and " style=" not in page
    assert page.count("<svg") == 2
    assert "<b>Attempts per minute</b> · 1 delivered, 2 failed in 60 min" in page
    assert "<b>Backlog (open intents)</b> · now 0 open" in page
    assert re.search(r"<title>\d\d:\d\d UTC: 1 delivered, 0 failed</title>", page) or re.search(
        r"<title>\d\d:\d\d UTC: 1 delivered, 2 failed</title>", page)
    health = {row.split()[0]: " ".join(row.split()) for row in rows(page, "Destinations (last hour)")}
    assert list(health) == ["fine", "hook", "idle"]
    assert "not known here (no sender in this process)" in health["hook"]
    assert " 0 2 100% " in health["hook"] and "503: receiver answered 503" in health["hook"]
    assert " 1 0 0% " in health["fine"] and "just now" in health["fine"]
    assert " 0 0 — — 0 — — — " in health["idle"] + " "
    assert re.search(r"<time datetime='[^']+' title='\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC'>", page)
    dead = rows(page, "Dead letters")
    assert sorted(row.split()[0] for row in dead) == ["d1", "d2"]


async def test_a_destination_paused_by_the_embedded_sender_says_until_when(open_ops: OpenOps):
    ops = await open_ops(worker=True, circuit_failures=1, circuit_pause_seconds=300)
    with socket.socket() as s:  # a port nobody listens on: sends get no answer at all
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    await ops.box.put_destination("gone", DestinationSpec(url=f"http://127.0.0.1:{closed}/hook", secret=SECRET,
                                                          allow_private_network=True, timeout_seconds=1))
    await ops.destination("hook", "/ok")
    await ops.enqueue("lost-1", destination="gone")
    deadline = time.monotonic() + 20
    while (await ops.box.get("lost-1")).attempts == 0:
        assert time.monotonic() < deadline, "the embedded sender did not try"
        await asyncio.sleep(0.05)
    async with console(ops) as http:
        page = (await http.get("/console")).text
    health = {row.split()[0]: " ".join(row.split()) for row in rows(page, "Destinations (last hour)")}
    assert re.match(r"gone paused until in [45] min ", health["gone"]), health["gone"]  # (pauses cap at 300 s)
    assert health["hook"].startswith("hook closed ")


async def test_the_search_filters_finds_by_action_id_and_pages(ops: Ops):
    await ops.destination("hook", "/ok")
    await ops.destination("other", "/ok")
    for n in range(55):
        await ops.enqueue(f"p-{n:02}")
    await ops.enqueue("elsewhere", destination="other", scope="globex")
    async with console(ops) as http:
        first = await http.get("/console/intents", params={"status": "pending", "destination": "hook"})
        assert first.status_code == 200
        found = re.findall(r">(p-\d\d)</a>", first.text)
        assert found == [f"p-{n:02}" for n in range(54, 4, -1)]  # newest first, 50 a page
        older = re.search(r"<a rel='next' href='([^']+)'>older →</a>", first.text)
        assert older is not None
        second = await http.get(older.group(1).replace("&amp;", "&"))
        assert re.findall(r">(p-\d\d)</a>", second.text) == [f"p-{n:02}" for n in range(4, -1, -1)]
        assert "older →" not in second.text

        by_id = await http.get("/console/intents", params={"q": "elsewhere"})
        assert re.findall(r"intents/([^?']+)\?scope=(\w+)'", by_id.text) == [("elsewhere", "globex")]
        by_scope = await http.get("/console/intents", params={"scope": "globex", "range": "1h"})
        assert re.findall(r">(elsewhere|p-\d\d)</a>", by_scope.text) == ["elsewhere"]
        assert "Replay what this filter matches" in by_scope.text  # no status named: the replayable ones
        pending = await http.get("/console/intents", params={"status": "pending"})
        assert "Replay what this filter matches" not in pending.text

        for bad, words in ((("status", "lost"), "status must be one of"), (("range", "2y"), "range must be"),
                           (("after", "yesterday"), "after must be a date"), (("q", "a b"), "action id"),
                           (("destination", "NO"), "destination")):
            refused = await http.get("/console/intents", params=dict([bad]))
            assert refused.status_code == 400 and words in refused.text, (bad, refused.text[-600:])


async def test_bulk_replay_previews_then_replays_with_a_reason_and_shows_progress(ops: Ops):
    switch = await ops.dead_letters("b1", "b2", "b3")
    switch.fix()
    async with console(ops) as http:
        preview = await http.get("/console/replay", params={"status": "dead", "destination": "hook"})
        assert "Dry run: 3 intents match" in preview.text
        assert sorted(re.findall(r">(b\d)</a>", preview.text)) == ["b1", "b2", "b3"]
        assert {i.status for i in [await ops.box.get(a) for a in ("b1", "b2", "b3")]} == {Status.DEAD}

        form = {"status": "dead", "destination": "hook", "reason": "hook fixed (INC-9)"}
        forged = await http.post("/console/replay", data={**form, "csrf": "x" * 32})
        assert forged.status_code == 403
        no_reason = await http.post("/console/replay", data={**form, "reason": " ",
                                                             "csrf": csrf(http)})
        assert no_reason.status_code == 400 and "say why" in no_reason.text
        assert {(await ops.box.get(a)).status for a in ("b1", "b2", "b3")} == {Status.DEAD}

        started = await http.post("/console/replay", data={**form, "csrf": csrf(http)})
        assert started.status_code == 303 and started.headers["location"].startswith("/console/replay/")
        deadline = time.monotonic() + 20
        while "finished" not in (progress := await http.get(started.headers["location"])).text:
            assert "http-equiv='refresh'" in progress.text  # it reloads itself while running
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert "3 of 3 looked at · <b>3 replayed</b> · 0 refused" in progress.text
        assert "http-equiv='refresh'" not in progress.text
        assert (await http.get("/console/replay/nope")).status_code == 404
    for action_id in ("b1", "b2", "b3"):
        assert (await ops.box.get(action_id)).status is Status.PENDING
        event = (await ops.events(action_id))[-1]
        assert (event.kind.value, event.actor, event.reason) == ("replayed", ops.operator_actor, "hook fixed (INC-9)")


async def test_the_intent_page_pretty_prints_replies_and_hides_a_resolved_error(ops: Ops):
    switch = await ops.dead_letters("r1")
    ops.receiver.script("/flaky", Reply(200, body={"ok": True, "note": "<i>fine</i>"}))
    del switch
    async with console(ops) as http:
        dead = (await http.get("/console/intents/r1")).text
        assert "last error: attempts exhausted" in dead
        await http.post("/console/intents/r1/replay?scope=acme",
                        data={"reason": "retry", "csrf": csrf(http)})
        await ops.deliver(["r1"])
        page = (await http.get("/console/intents/r1")).text
    assert (await ops.box.get("r1")).status is Status.DELIVERED
    assert "last error:" not in page
    # the webhook's reply holds the body as a string; it is shown as indented JSON, escaped once
    assert '&#34;body&#34;: {\n    &#34;ok&#34;: true,\n    &#34;note&#34;: &#34;&lt;i&gt;fine&lt;/i&gt;&#34;' \
        in page.replace("&#39;", "'")
    assert "\\&#34;" not in page and "&amp;#34;" not in page


async def test_the_intent_page_shows_the_trace_context_it_keeps(ops: Ops):
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    await ops.destination("hook", "/hook")
    await ops.enqueue("t1", trace_context={"traceparent": parent})
    await ops.enqueue("t2", trace_context={"traceparent": "garbage"})
    await ops.enqueue("t3", trace_context={"traceparent": parent, "tracestate": "congo=t61rcWkgMzE,rojo=00f0<b>"})
    async with console(ops) as http:
        kept = (await http.get("/console/intents/t1")).text
        none = (await http.get("/console/intents/t2")).text
        stated = (await http.get("/console/intents/t3")).text
    assert f"<p>trace <code>{parent}</code></p>" in kept  # (no SDK here: the create span carries its parent's)
    assert "<p>trace " not in none
    # the tracestate it keeps beside it, escaped (a tracestate value may hold < and >)
    assert (f"<p>trace <code>{parent}</code> · tracestate <code>congo=t61rcWkgMzE,rojo=00f0&lt;b&gt;</code></p>"
            in stated)
