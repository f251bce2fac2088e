"""GET /metrics after a scripted scenario, and the Prometheus alert rules checked against what
the service actually exposes."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from outbox import Attempt, DestinationSpec, Event, ManualClock, Outbox, Role, Settings, Status
from outbox.app.service import create_service
from outbox.grants import GrantSpec
from outbox.model import Start
from sender import Worker

from ..conftest import SECRET
from ..deploy.prometheus import check_rules, dashboard_queries
from ..receiver import Receiver, Reply
from ..servers import Served
from .conftest import serve_in_loop

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
WEBHOOK = {"channel": "webhook"}


class Scrape:
    """One /metrics answer: every sample by name and labels."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                self.samples[(sample.name, frozenset(sample.labels.items()))] = sample.value

    def __call__(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))

    def total(self, name: str, **labels: str) -> float | None:
        """The sum of the samples of ``name`` carrying ``labels`` (whatever their other labels),
        None when there is none."""
        found = [v for (n, ls), v in self.samples.items() if n == name and set(labels.items()) <= ls]
        return sum(found) if found else None

    def names(self) -> set[str]:
        return {name for name, _ in self.samples}

    def labelled(self, name: str) -> list[dict[str, str]]:
        return [dict(labels) for n, labels in self.samples if n == name]


async def scrape(client: httpx.AsyncClient) -> Scrape:
    response = await client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return Scrape(response.text)


@dataclass
class Scene:
    box: Outbox
    clock: ManualClock
    worker: Worker
    receiver: Receiver
    client: httpx.AsyncClient


@pytest.fixture
async def scene(tmp_path: Path) -> AsyncIterator[Scene]:
    """An outbox (manual clock) served by uvicorn in this loop, an in-process worker on the
    same Outbox (so its counters are the ones /metrics shows), and a receiver."""
    clock = ManualClock(datetime.now(UTC).replace(microsecond=0))
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'm.db'}", worker=False, authority="grants",
                        authority_seconds=0, lease_seconds=30)
    box = await Outbox.open(settings=settings, clock=clock)
    receiver = Receiver().start()
    worker = Worker(box)
    try:
        async with serve_in_loop(create_service(outbox=box)) as url, httpx.AsyncClient(base_url=url, timeout=30) as c:
            yield Scene(box, clock, worker, receiver, c)
    finally:
        await worker.aclose()
        receiver.stop()
        await box.close()


async def _scenario(s: Scene) -> None:
    """Two delivered, one rejected (dead), one exhausted (dead), one unknown (read timeout at a
    receiver without idempotency), one revoked (no grant), one lease lost by a vanished worker
    and recovered by the sweeper, then overdue by 45 s."""
    r = s.receiver
    r.script("/ok", Reply(200))
    r.script("/no", Reply(400, body="no such account"))
    r.script("/down", Reply(503))
    r.script("/slow", Reply(200, delay=2))
    for name, path, extra in (("hook", "/ok", {}), ("refuses", "/no", {}), ("down", "/down", {}),
                              ("slow", "/slow", {"timeout_seconds": 0.3})):
        spec = {"secret": SECRET, "allow_private_network": True, "timeout_seconds": 2, **extra}
        await s.box.put_destination(name, DestinationSpec(url=r.url + path, **spec))
    await s.box.put_grant("acme-all", GrantSpec(scope="acme", destination="*"))
    plan = [("ok-1", "hook", "acme", {}), ("ok-2", "hook", "acme", {}), ("no-1", "refuses", "acme", {}),
            ("down-1", "down", "acme", {"max_attempts": 1}), ("slow-1", "slow", "acme", {}),
            ("rogue-1", "hook", "globex", {})]
    for action_id, destination, scope, extra in plan:
        await s.box.enqueue(action_id=action_id, destination=destination, scope=scope, payload={"id": action_id},
                            **extra)
    assert await s.worker.run_once() == 6
    statuses = {a: (await s.box.get(a)).status for a, *_ in plan}
    assert statuses == {"ok-1": Status.DELIVERED, "ok-2": Status.DELIVERED, "no-1": Status.DEAD,
                        "down-1": Status.DEAD, "slow-1": Status.UNKNOWN, "rogue-1": Status.REVOKED}

    # a worker that claimed lost-1 and vanished: its lease runs out and the sweeper recovers it
    await s.box.enqueue(action_id="lost-1", destination="hook", scope="acme", payload={"id": "lost-1"})
    [claimed] = await s.box.store.claim("vanished-worker", now=s.clock.now(),
                                        lease_until=s.clock.now() + timedelta(seconds=30), limit=10)
    assert claimed.action_id == "lost-1"
    s.clock.advance(60)
    assert await s.worker.sweep() == 1
    lost = await s.box.get("lost-1")
    assert lost.status is Status.PENDING and lost.next_attempt_at == s.clock.now()
    assert (await s.box.history("lost-1")).events[-1].kind == "lease_expired"
    s.clock.advance(45)  # nobody sends it: overdue


def _values(m: Scrape) -> dict[str, float | None]:
    values: dict[str, float | None] = {
        f"outbox_intents{{status={s.value}}}": m("outbox_intents", status=s.value, **WEBHOOK) for s in Status}
    for outcome in ("delivered", "retryable", "rejected", "conflict", "unknown", "denied"):
        values[f"outbox_attempts_total{{outcome={outcome}}}"] = m.total("outbox_attempts_total", outcome=outcome)
    for name in ("outbox_dead_lettered_total", "outbox_unknown_outcomes_total", "outbox_authority_denials_total",
                 "outbox_lease_expiries_total", "outbox_delivery_latency_seconds_count",
                 "outbox_oldest_due_age_seconds"):
        values[name] = m(name)
    return values


async def test_metrics_after_a_scripted_scenario(scene: Scene):
    await _scenario(scene)
    m = await scrape(scene.client)
    assert _values(m) == {
        "outbox_intents{status=pending}": 1,
        "outbox_intents{status=leased}": 0,
        "outbox_intents{status=held}": 0,
        "outbox_intents{status=delivered}": 2,
        "outbox_intents{status=unknown}": 1,
        "outbox_intents{status=revoked}": 1,
        "outbox_intents{status=dead}": 2,
        "outbox_intents{status=cancelled}": 0,
        "outbox_attempts_total{outcome=delivered}": 2,
        "outbox_attempts_total{outcome=retryable}": 1,  # the 503 that exhausted down-1
        "outbox_attempts_total{outcome=rejected}": 1,  # the 400
        "outbox_attempts_total{outcome=conflict}": None,  # never happened: no series yet
        "outbox_attempts_total{outcome=unknown}": 1,  # the read timeout
        "outbox_attempts_total{outcome=denied}": None,
        "outbox_dead_lettered_total": 2,
        "outbox_unknown_outcomes_total": 1,
        "outbox_authority_denials_total": 1,
        "outbox_lease_expiries_total": 1,  # lost-1, recovered by the sweeper
        "outbox_delivery_latency_seconds_count": 2,
        "outbox_oldest_due_age_seconds": 45.0,  # lost-1 has been due for 45 s (manual clock)
    }


async def test_metrics_follow_the_overdue_intent_to_delivery(scene: Scene):
    await _scenario(scene)
    before = await scrape(scene.client)
    assert before("outbox_oldest_due_age_seconds") == 45.0
    assert before("outbox_delivery_latency_seconds_count") == 2
    assert await scene.worker.run_once() == 1  # lost-1, overdue, is sent now
    after = await scrape(scene.client)
    assert after("outbox_intents", status="delivered", **WEBHOOK) == 3
    assert after("outbox_intents", status="pending", **WEBHOOK) == 0
    assert after("outbox_oldest_due_age_seconds") == 0
    assert after("outbox_delivery_latency_seconds_count") == 3
    assert after("outbox_delivery_latency_seconds_sum") == 105.0  # lost-1 was enqueued 105 s before (manual clock)
    assert after("outbox_delivery_latency_seconds_bucket", le="60.0") == 2
    assert after("outbox_delivery_latency_seconds_bucket", le="300.0") == 3
    assert after("outbox_attempts_total", destination="hook", outcome="delivered") == 3  # ok-1, ok-2, lost-1
    assert after("outbox_attempts_total", destination="refuses", outcome="rejected") == 1


async def _vanish(scene: Scene, action_id: str, *, mid_send: bool) -> None:
    """A worker claims ``action_id`` (and, ``mid_send``, records its attempt's start the way a
    Worker does), then vanishes; the lease runs out and the sweeper recovers it."""
    s = scene
    [claimed] = await s.box.store.claim("vanished-worker", now=s.clock.now(),
                                        lease_until=s.clock.now() + timedelta(seconds=30), limit=10)
    assert claimed.action_id == action_id
    if mid_send:
        attempt = Attempt(attempt_id="a-" + action_id, number=1, fence=claimed.fence, worker="vanished-worker",
                          started_at=s.clock.now(), finished_at=None, submission=None, outcome=None,
                          status_code=None, reply=None, external_id=None, error=None, duration_ms=None)
        started = Start(claimed.key, claimed.fence, attempt,
                        Event("attempt_started", s.clock.now(), "vanished-worker", None, {"number": 1}))
        assert (await s.box.store.apply([started])).results == [None]
    s.clock.advance(60)
    assert await s.worker.sweep() == 1
    assert (await s.box.history(action_id)).events[-2 if mid_send else -1].kind == "lease_expired"


async def test_a_lease_recovered_before_its_attempt_started_is_counted(scene: Scene):
    await scene.box.put_destination("hook", DestinationSpec(url=scene.receiver.url + "/ok", secret=SECRET,
                                                            allow_private_network=True))
    await scene.box.enqueue(action_id="idle-1", destination="hook", scope="acme", payload={})
    await _vanish(scene, "idle-1", mid_send=False)
    assert await scene.box.store.count_by_status() == [("pending", "webhook", 1)]
    m = await scrape(scene.client)
    assert m("outbox_lease_expiries_total") == 1


async def test_a_lease_recovered_mid_send_is_counted(scene: Scene):
    await scene.box.put_destination("hook", DestinationSpec(url=scene.receiver.url + "/ok", secret=SECRET,
                                                            allow_private_network=True))
    await scene.box.enqueue(action_id="mid-1", destination="hook", scope="acme", payload={})
    await _vanish(scene, "mid-1", mid_send=True)
    intent = await scene.box.get("mid-1")
    assert intent.status is Status.UNKNOWN  # maybe submitted, and 'hook' does not declare idempotency
    [attempt] = (await scene.box.history("mid-1")).attempts
    assert attempt.submission.value == "maybe_submitted" and attempt.outcome.value == "unknown"
    m = await scrape(scene.client)
    assert m("outbox_lease_expiries_total") == 1
    assert m("outbox_unknown_outcomes_total") == 1
    assert m("outbox_intents", status="unknown", **WEBHOOK) == 1


async def test_the_embedded_worker_counts_into_the_served_metrics(tmp_path: Path):
    """``outbox serve`` wiring: create_service(settings) opens its own outbox and runs the worker on it."""
    receiver = Receiver().start()
    db_url = f"sqlite:///{tmp_path / 'e.db'}"
    async with await Outbox.open(db_url) as box:
        await box.put_destination("hook", DestinationSpec(url=receiver.url + "/ok", secret=SECRET,
                                                          allow_private_network=True))
        token, _ = await box.create_token(Role.PRODUCER, ["acme"])
    receiver.script("/ok", Reply(200))
    served = Served(create_service(Settings(database_url=db_url, worker=True, authority="allow-all")))
    try:
        async with httpx.AsyncClient(base_url=served.url, timeout=30,
                                     headers={"Authorization": f"Bearer {token}"}) as c:
            for n in range(3):
                created = await c.post("/v1/intents", json={"action_id": f"e-{n}", "scope": "acme",
                                                            "destination": "hook", "payload": {"n": n}})
                assert created.status_code == 201, created.text
            for n in range(3):
                assert (await c.get(f"/v1/intents/e-{n}", params={"wait": 20})).json()["status"] == "delivered"
            m = await scrape(c)
    finally:
        served.stop()
        receiver.stop()
    assert m("outbox_intents", status="delivered", **WEBHOOK) == 3
    assert m.total("outbox_attempts_total", outcome="delivered") == 3
    assert m("outbox_delivery_latency_seconds_count") == 3
    assert m("outbox_oldest_due_age_seconds") == 0


METRICS_TOKEN = "metrics-" + "5" * 32


async def test_a_metrics_token_keeps_destination_ids_from_anyone_without_it(tmp_path: Path):
    """With OUTBOX_METRICS_TOKEN set, /metrics (whose labels name destinations) answers only its
    bearer and operators' and admins' tokens; the probes stay open."""
    settings = Settings(database_url=f"sqlite:///{tmp_path / 't.db'}", worker=False, authority="allow-all",
                        metrics_token=METRICS_TOKEN)
    box = await Outbox.open(settings=settings)
    receiver = Receiver().start()
    receiver.script("/ok", Reply(200))
    try:
        await box.put_destination("billing-eu", DestinationSpec(url=receiver.url + "/ok", secret=SECRET,
                                                                allow_private_network=True))
        await box.enqueue(action_id="t-1", destination="billing-eu", scope="acme", payload={})
        worker = Worker(box)
        assert await worker.run_once() == 1
        await worker.aclose()
        tokens = {role: (await box.create_token(role, ["acme"] if role in (Role.PRODUCER, Role.TENANT) else []))[0]
                  for role in Role}
        revoked, info = await box.create_token(Role.OPERATOR)
        await box.revoke_token(info.id)
        async with serve_in_loop(create_service(outbox=box)) as url, httpx.AsyncClient(base_url=url) as c:
            def get(token: str | None, path: str = "/metrics") -> Any:
                return c.get(path, headers={"Authorization": f"Bearer {token}"} if token else {})

            for token, status in ((None, 401), ("not-the-token-at-all", 401), (revoked, 401),
                                  (tokens[Role.PRODUCER], 403), (tokens[Role.TENANT], 403)):
                refused = await get(token)
                assert refused.status_code == status, (token, refused.text)
                assert refused.headers["content-type"] == "application/problem+json"
                assert "billing-eu" not in refused.text
            missing = await get(None)
            assert missing.json()["type"] == "urn:outbox:problem:unauthenticated"
            assert "OUTBOX_METRICS_TOKEN" in missing.json()["detail"]
            assert missing.headers["www-authenticate"] == 'Bearer realm="outbox"'
            for token in (METRICS_TOKEN, tokens[Role.OPERATOR], tokens[Role.ADMIN]):
                answered = await get(token)
                assert answered.status_code == 200, answered.text
                assert Scrape(answered.text)("outbox_attempts_total", destination="billing-eu",
                                             outcome="delivered") == 1
            for path in ("/healthz", "/readyz"):
                assert (await get(None, path)).status_code == 200
    finally:
        receiver.stop()
        await box.close()


# -- the alert rules -----------------------------------------------------------------------------

PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
                "offset", "inf", "nan", "atan2"}

#: One PromQL token that matters here: a string literal or a number/duration (skipped, so that
#: neither "src" nor the e of 1e3 reads as a metric), or an identifier with its braces and a
#: following "(" (which makes it a function or an aggregation, not a metric).
PROMQL_TOKEN = re.compile(r"""
      "(?:[^"\\]|\\.)*" | '(?:[^'\\]|\\.)*'
    | \d[\w.]*
    | (?P<name>[A-Za-z_:][\w:]*) \s* (?P<braces>\{[^}]*\})? \s* (?P<call>\()?
""", re.VERBOSE)


def _selectors(expr: str) -> list[tuple[str, dict[str, set[str]]]]:
    """The metric selectors of a PromQL expression: (sample name, label -> the values its equality
    matchers, or regex matchers that are a plain alternation of words, require)."""
    found = []
    text = re.sub(r"\[[^\]]*\]", "", expr)  # range and subquery durations
    # the label lists of grouping and matching clauses
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    for match in PROMQL_TOKEN.finditer(text):
        name, braces, call = match.group("name", "braces", "call")
        if not name or call or name.lower() in PROMQL_WORDS:
            continue  # a literal, a function, an aggregation, or a keyword
        matchers: dict[str, set[str]] = {}
        for label, op, value in re.findall(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|=)\s*"([^"]*)"', braces or ""):
            if op == "=" or re.fullmatch(r"\w+(\|\w+)*", value):
                matchers.setdefault(label, set()).update(value.split("|") if op == "=~" else {value})
        found.append((name, matchers))
    return found


def _assert_exposed(where: str, expr: str, exposed: Scrape) -> None:
    """Every metric ``expr`` selects is a sample name of ``exposed`` (so a histogram is named by its
    _bucket, _sum or _count, as PromQL names it), with every label value it requires."""
    selectors = _selectors(expr)
    assert selectors, f"{where}: no metric in {expr!r}"
    for metric, matchers in selectors:
        assert metric in exposed.names(), (
            f"{where} uses {metric}, which /metrics does not expose; it has {sorted(exposed.names())}")
        for label, values in matchers.items():
            seen = {labels.get(label) for labels in exposed.labelled(metric)}
            assert values <= seen, f"{where}: {metric}{{{label}={sorted(values - seen)}}} never exposed; seen {seen}"


def _rules() -> list[dict]:
    document = yaml.safe_load(ALERTS.read_text())
    rules = [rule for group in document["groups"] for rule in group["rules"]]
    assert rules, "no rules"
    return rules


async def test_alert_rules_are_complete_and_use_only_exposed_metrics(scene: Scene):
    await _scenario(scene)  # so every labelled series has been seen
    # and a send held back: a paused destination's intent, passed over by a claim
    await scene.box.store.pause_destination("hook", scene.clock.now() + timedelta(hours=1))
    await scene.box.enqueue(action_id="held-1", destination="hook", scope="acme", payload={"id": "held-1"})
    assert await scene.worker.run_once() == 0
    exposed = await scrape(scene.client)
    assert exposed("outbox_sends_held_total", destination="hook", limit="paused") == 2  # with lost-1, overdue
    document = yaml.safe_load(ALERTS.read_text())
    assert isinstance(document["groups"], list) and document["groups"]
    names = []
    for group in document["groups"]:
        assert group["name"] and group["rules"], group
        for rule in group["rules"]:
            names.append(rule.get("alert"))
            assert set(rule) <= {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}, rule
            assert isinstance(rule.get("alert"), str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", rule["alert"])
            assert isinstance(rule.get("expr"), str) and rule["expr"].strip(), rule
            assert isinstance(rule.get("labels", {}).get("severity"), str) and rule["labels"]["severity"], rule
            assert isinstance(rule.get("annotations", {}).get("summary"), str) and rule["annotations"]["summary"]
            if "for" in rule:
                assert re.fullmatch(r"(\d+(ms|s|m|h|d|w|y))+", str(rule["for"])), rule["for"]
            _assert_exposed(rule["alert"], rule["expr"], exposed)
    assert len(names) == len(set(names)), "alert names repeat"


def test_alert_rules_pass_promtool():
    assert "SUCCESS" in check_rules(ALERTS)


async def test_dashboard_queries_use_only_exposed_metrics(scene: Scene):
    await _scenario(scene)  # so every labelled series has been seen
    # and a send held back: a paused destination's intent, passed over by a claim
    await scene.box.store.pause_destination("hook", scene.clock.now() + timedelta(hours=1))
    await scene.box.enqueue(action_id="held-1", destination="hook", scope="acme", payload={"id": "held-1"})
    assert await scene.worker.run_once() == 0
    exposed = await scrape(scene.client)
    assert exposed("outbox_sends_held_total", destination="hook", limit="paused") == 2  # with lost-1, overdue
    queries = dashboard_queries()
    assert queries, "the dashboard has no queries"
    for where, expr in queries:
        _assert_exposed(f"dashboard panel {where}", expr, exposed)


def test_selector_extraction_understands_the_promql_in_use():
    assert _selectors('sum by (status) (outbox_intents{status="dead", channel="webhook"}) > 100') == [
        ("outbox_intents", {"status": {"dead"}, "channel": {"webhook"}})]
    assert _selectors("increase(outbox_dead_lettered_total[15m]) > 0") == [("outbox_dead_lettered_total", {})]
    assert _selectors("rate(a_total[5m]) / ignoring(x) rate(b_total[5m])") == [("a_total", {}), ("b_total", {})]
    assert _selectors("histogram_quantile(0.99, sum by (le) (rate(h_seconds_bucket[1m]))) > 1e3") == [
        ("h_seconds_bucket", {})]
    assert _selectors('max by (status) (g{status=~"pending|dead", channel!="x"}) * 60 offset 5m') == [
        ("g", {"status": {"pending", "dead"}})]
    assert _selectors('label_replace(up, "dst", "$1", "instance", "(.*)") and bare_metric') == [
        ("up", {}), ("bare_metric", {})]


def test_alert_runbook_references_point_at_existing_readme_sections():
    """A description that sends the on-call reader to a README section must name one that exists."""
    headings = {line.lstrip("#").strip().lower() for line in (ROOT / "README.md").read_text().splitlines()
                if line.startswith("#")}
    for rule in _rules():
        for text in rule.get("annotations", {}).values():
            for section in re.findall(r"see the (.+?) section of the README", str(text)):
                assert section.lower() in headings, (
                    f"{rule['alert']} points at the README's {section!r} section, which does not exist; "
                    f"headings: {sorted(headings)}")
