"""deploy/grafana/outbox.json: a dashboard Grafana can load (its JSON model, a Prometheus data
source variable, panels laid out on the grid), covering what the deploy issue asks for, with every
query parsed by Prometheus's own parser (promtool). That each query names only metrics a running
service exposes is checked in tests/operators/test_metrics.py."""

from __future__ import annotations

import json

import yaml

from .prometheus import DASHBOARD, check_rules, dashboard_queries

#: What the dashboard must show, as the metric each topic is read from.
TOPICS = {
    "backlog by status and channel": "outbox_intents",
    "oldest due age": "outbox_oldest_due_age_seconds",
    "deliveries and failures per minute": "outbox_attempts_total",
    "latency percentiles": "outbox_delivery_latency_seconds_bucket",
    "dead letters": "outbox_dead_lettered_total",
    "unknowns": "outbox_unknown_outcomes_total",
    "paused destinations": "outbox_paused_destinations",
    "lease expiries": "outbox_lease_expiries_total",
    "authority denials": "outbox_authority_denials_total",
    "sends held back by a destination's limits": "outbox_sends_held_total",
}


def model() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_a_dashboard_model_with_a_prometheus_data_source_variable():
    board = model()
    assert 36 <= board["schemaVersion"] <= 41, board["schemaVersion"]
    assert board["uid"] and board["title"] and "id" not in board  # id is Grafana's to give
    [variable] = board["templating"]["list"]
    assert (variable["type"], variable["query"], variable["name"]) == ("datasource", "prometheus", "datasource")
    for panel in board["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"] and target["expr"].strip(), panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]


def test_panels_have_unique_ids_and_do_not_overlap_on_the_grid():
    panels = model()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    taken: set[tuple[int, int]] = set()
    for panel in panels:
        g = panel["gridPos"]
        assert g["w"] > 0 and g["h"] > 0 and 0 <= g["x"] <= 24 - g["w"], panel["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


def test_every_topic_of_the_issue_has_a_panel():
    queries = dashboard_queries()
    for topic, metric in TOPICS.items():
        assert any(metric in expr for _, expr in queries), f"no panel shows {topic} ({metric})"
    latency = [expr for _, expr in queries if "outbox_delivery_latency_seconds_bucket" in expr]
    assert {expr.split(",")[0] for expr in latency} == {f"histogram_quantile({q}" for q in ("0.5", "0.9", "0.99")}
    assert all("by (le)" in expr for expr in latency)


def test_every_query_parses_as_promql(tmp_path):
    """Each query becomes a recording rule, which promtool parses as Prometheus would."""
    queries = dashboard_queries()
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{n}", "expr": expr} for n, (_, expr) in enumerate(queries)]}]}
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(rules))
    assert f"SUCCESS: {len(queries)} rules found" in check_rules(path)


def test_a_broken_query_fails_the_parse(tmp_path):
    """The check above can fail."""
    path = tmp_path / "broken.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [
        {"record": "dashboard:broken", "expr": "sum by (le (rate(x[1m]))"}]}]}))
    try:
        check_rules(path)
    except AssertionError as failed:
        assert "parse error" in str(failed)
    else:
        raise AssertionError("promtool accepted a broken query")
