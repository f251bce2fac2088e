"""The console's on-call views over HTTP: the overview's headline, a destination's page, the
bulk replay's duplicate-risk warning and the resolve form that chooses nothing for the operator,
against a real outbox served by uvicorn, a real receiver and in-process workers."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from outbox import Attempt, Destination, DestinationSpec, Event, EventKind, OnUnknown, Outcome, Status, Submission
from outbox.app.console.history import attempts
from outbox.app.console.templates import ENV

from ..conftest import SECRET
from .conftest import Ops
from .signing import csrf
from .test_console_pages import console, rows


def headline(page: str) -> dict[str, str]:
    """The headline's items: label to its count and link."""
    found = re.search(r"<ul class='headline'[^>]*>(.*?)</ul>", page)
    assert found is not None, page[:2000]
    return {label: f"{count} {href}" for href, count, label in
            re.findall(r"<a[^>]* href='([^']+)'>(?:<b>(\d+)</b>)?([^<]+)</a>", found.group(1))}


async def test_the_headline_counts_what_needs_attention_each_linking_to_its_list(ops: Ops):
    await ops.dead_letters("d1", "d2")
    await ops.unknowns("u1")
    await ops.destination("approvals", "/ok", requires_approval=True)
    await ops.enqueue("h1", destination="approvals")
    await ops.deliver(["h1"])
    await ops.destination("retired", "/ok", disabled=True)
    async with console(ops) as http:
        page = (await http.get("/console")).text
        assert page.index("<ul class='headline'") < page.index("<h2>Last hour</h2>")  # the first thing seen
        assert headline(page) == {
            "dead": "2 /console/intents?status=dead", "unknown outcome": "1 /console/intents?status=unknown",
            "held for approval": "1 /console/intents?status=held", "revoked": "0 /console/intents?status=revoked",
            # no sender runs in this process: its circuits are not known here, and it says so
            "circuits: not known here (no sender in this process)": " /console/destinations",
            "paused": "0 /console/destinations?state=paused", "disabled": "1 /console/destinations?state=disabled",
            "settings unusable": "0 /console/destinations?state=unusable"}
        assert "Nothing counted here" not in page
        disabled = (await http.get("/console/destinations", params={"state": "disabled"})).text
        assert [r.split()[0] for r in rows(disabled, "Last hour")] == ["retired"]
        every = (await http.get("/console/destinations")).text
        assert [r.split()[0] for r in rows(every, "Last hour")] == ["approvals", "hook", "retired", "slow"]
        assert (await http.get("/console/destinations", params={"state": "sideways"})).status_code == 400
        dead = (await http.get("/console/intents", params={"status": "dead"})).text
        assert sorted(re.findall(r">(d\d)</a>", dead)) == ["d1", "d2"]


async def test_a_quiet_outbox_says_nothing_needs_an_operator(ops: Ops):
    await ops.destination("hook", "/ok")
    async with console(ops) as http:
        page = (await http.get("/console")).text
    assert "Nothing counted here needs an operator." in page
    assert set(headline(page).values()) >= {"0 /console/intents?status=dead", "0 /console/intents?status=unknown"}


async def test_a_destination_page_shows_its_health_backlog_last_errors_and_policy(ops: Ops):
    await ops.dead_letters("e1", "e2")  # 'hook' at /flaky, answering 503
    await ops.enqueue("e3", max_attempts=1)
    await ops.destination("fine", "/ok")
    async with console(ops) as http:
        overview = (await http.get("/console")).text
        assert "<a href='/console/destinations/hook'>hook</a>" in overview  # every name links to its page
        intent = (await http.get("/console/intents/e1")).text
        assert "<a href='/console/destinations/hook'>hook</a>" in intent
        page = (await http.get("/console/destinations/hook")).text
        assert (await http.get("/console/destinations/nowhere")).status_code == 404
    assert f"webhook to <b>{ops.receiver.url}/flaky</b>" in page
    assert "circuit: not known here (no sender in this process)" in page
    [health] = [" ".join(r.split()) for r in rows(page, "Last hour")]
    assert health.startswith("0 2 100% ")  # delivered, failed, failure rate over the overview's hour
    backlog = {r.split()[0]: r.split()[1] for r in rows(page, "Backlog by status")}
    assert (backlog["dead"], backlog["pending"], backlog["delivered"]) == ("2", "1", "0")
    assert "/console/intents?destination=hook&amp;status=dead" in page
    errors = [" ".join(r.split()) for r in rows(page, "Last errors")]
    last_errors = page.split(">Last errors</h2>", 1)[1].split("</table>")[0]
    assert sorted(re.findall(r">(e\d)</a>", last_errors)) == ["e1", "e2"]
    finished = re.findall(r"<tr><td data-label='finished'><time datetime='([^']+)'", last_errors)
    assert len(finished) == 2 and finished == sorted(finished, reverse=True)  # newest first
    assert all("retryable 503 receiver answered 503" in e for e in errors), errors
    policy = dict(re.findall(r"<dt>([^<]+)</dt><dd>([^<]*)</dd>", page.split("<h2>Policy</h2>", 1)[1]))
    assert policy["idempotent"] == "false" and policy["retention_seconds"] == "86400"
    assert policy["url"] == f"{ops.receiver.url}/flaky" and policy["signing_secrets"] == "1"
    assert SECRET not in page


def test_the_policy_list_draws_whatever_fields_a_record_has():
    drawn = ENV.get_template("parts.html").module.fields(
        {"rate_limit": {"per_second": 5}, "paused_until": None, "retry_schedule": [1, 60], "url": "<x>"})
    assert drawn == ("<dl class='fields'><dt>rate_limit</dt><dd>{&#34;per_second&#34;: 5}</dd>"
                     "<dt>paused_until</dt><dd>—</dd><dt>retry_schedule</dt><dd>[1, 60]</dd>"
                     "<dt>url</dt><dd>&lt;x&gt;</dd></dl>")


async def test_the_bulk_replay_confirm_step_warns_of_duplicate_risk(ops: Ops):
    await ops.dead_letters("b1", "b2")  # answered 503: nothing half-happened
    await ops.unknowns("u1", "u2")  # timed out at 'slow', which does not declare idempotency
    await ops.unknowns("u3", destination="dedupe", idempotent=True, on_unknown="never")
    async with console(ops) as http:
        preview = (await http.get("/console/replay")).text
        dead_only = (await http.get("/console/replay", params={"status": "dead"})).text
    assert "Dry run: 5 intents match" in preview
    warning = re.search(r"<p class='warning' id='duplicate-risk'>(.*?)</p>", preview)
    assert warning is not None
    text = re.sub(r"<[^>]+>", "", warning.group(1))
    assert text.startswith("Duplicate risk: 2 of these 5 intents may already have taken effect")
    assert "(slow)" in text and "dedupe" not in text and "hook" not in text
    assert preview.index("id='duplicate-risk'") < preview.index("<form method='post' action='/console/replay'>")
    assert "accept duplicate risk (<b>2 may have taken effect already</b>; unticked, they are refused)" in preview
    assert "Replay 5 intents</button>" in preview
    assert "Dry run: 2 intents match" in dead_only and "duplicate-risk" not in dead_only
    assert "may have taken effect already" not in dead_only


async def test_resolve_chooses_no_outcome_and_refuses_a_form_without_one(ops: Ops):
    await ops.unknowns("u1")
    async with console(ops) as http:
        page = (await http.get("/console/intents/u1")).text
        select = re.search(r"<select name='resolution' required>(.*?)</select>", page)
        assert select is not None
        assert re.findall(r"<option([^>]*)>([^<]*)</option>", select.group(1)) == [
            (" value='' selected", "choose the outcome…"), ("", "delivered"), ("", "retry"), ("", "dead")]
        for chosen in ({}, {"resolution": ""}, {"resolution": "maybe"}):
            refused = await http.post("/console/intents/u1/resolve?scope=acme",
                                      data={"reason": "checked", "csrf": csrf(http), **chosen})
            assert refused.status_code == 422, chosen
            assert "choose the outcome to resolve it as: delivered, retry or dead" in refused.text
        assert (await ops.box.get("u1")).status is Status.UNKNOWN
        assert [e.kind.value for e in await ops.events("u1")][-1] != "resolved"
        done = await http.post("/console/intents/u1/resolve?scope=acme", data={
            "reason": "seen in their ledger", "resolution": "delivered", "csrf": csrf(http)})
        assert done.status_code == 303
    assert (await ops.box.get("u1")).status is Status.DELIVERED


async def test_an_attempt_says_where_it_went_even_after_the_destination_moved(ops: Ops):
    await ops.dead_letters("w1")
    async with console(ops) as http:
        await ops.box.put_destination("hook", DestinationSpec(url=ops.receiver.url + "/moved", secret=SECRET,
                                                              allow_private_network=True, timeout_seconds=1))
        page = (await http.get("/console/intents/w1")).text
        destination = (await http.get("/console/destinations/hook")).text
    [attempt] = [" ".join(r.split()) for r in rows(page, "Attempts")]
    assert f"hook · {ops.receiver.url}/flaky submitted retryable 503" in attempt  # as recorded when it started
    assert "moved" not in attempt and "not recorded" not in attempt
    assert f"webhook to <b>{ops.receiver.url}/moved</b>" in destination  # where it delivers now


def test_an_attempt_that_recorded_no_target_shows_the_destination_as_registered_now():
    """Attempts started before attempts recorded where they went."""
    at = datetime(2030, 1, 1, 12, tzinfo=UTC)
    destination = Destination("hook", "webhook", {"url": "https://hooks.example/now"}, (), False, 86_400,
                              OnUnknown.DECLARED, 10.0, False, False, False, at, at + timedelta(hours=1))
    old = Attempt("0193a5f2-7c1e-7d44-9e0b-5f7a1c2d3e4f", 1, 1, "w1", at, at, Submission.SUBMITTED,
                  Outcome.RETRYABLE, 503, None, None, "receiver answered 503", 4.0)
    later = replace(old, attempt_id="0193a5f2-7c1e-7d44-9e0b-5f7a1c2d3e50", number=2,
                    started_at=at + timedelta(hours=2))
    started = Event(EventKind.ATTEMPT_STARTED, at, "w1", None, {"attempt_id": old.attempt_id})
    drawn = str(ENV.get_template("history.html").module.attempts(attempts([old, later], [started], destination),
                                                                 destination.id, at + timedelta(hours=3)))
    first, second = (" ".join(r.split()) for r in rows("<h2>Attempts</h2>" + drawn, "Attempts"))
    assert "https://hooks.example/now (not recorded; registered now; changed since this attempt)" in first
    assert "https://hooks.example/now (not recorded; registered now)" in second


async def test_a_destination_its_receiver_paused_is_counted_and_its_page_says_until_when(ops: Ops):
    await ops.destination("hook", "/ok")
    await ops.destination("slow", "/ok")
    until = ops.box.clock.now() + timedelta(minutes=5)
    await ops.box.store.pause_destination("slow", until)  # as a 429 with Retry-After: 300 does
    async with console(ops) as http:
        page = (await http.get("/console")).text
        assert headline(page)["paused"] == "1 /console/destinations?state=paused"
        paused = (await http.get("/console/destinations", params={"state": "paused"})).text
        assert [r.split()[0] for r in rows(paused, "Last hour")] == ["slow"]
        shown = (await http.get("/console/destinations/slow")).text
        assert "flow: no rate limit · no in-flight limit · <b>paused</b> by its receiver until" in shown
        assert "flow: no rate limit · no in-flight limit · subscribes to no topics" in (
            await http.get("/console/destinations/hook")).text
