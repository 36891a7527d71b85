"""The generated dashboards and rule file: up to date, well-formed, and built the way that
keeps them honest (counters through rate(), quantiles over `sum by (le)`, names from the
catalog). No server needed; the live checks are in test_live.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from promkit import ROOT

from ministream_observability import catalog
from ministream_observability.__main__ import main
from ministream_observability.alerts import ALL_NAMESPACES, Alert, AlertParams, alerts
from ministream_observability.dashboards import all_dashboards
from ministream_observability.generate import (
    DASHBOARD_DIR,
    DOCS_FILE,
    RULES_FILE,
    queries,
    render_rules,
)
from ministream_observability.promql import concrete, metric_names, variable_selector

PARAMS = AlertParams()
QUERIES = queries(PARAMS)
DOCS = (ROOT / DOCS_FILE).read_text()


def test_generated_files_are_up_to_date() -> None:
    assert main(["generate", "--check", "--root", str(ROOT)]) == 0, (
        "run: python -m ministream_observability generate"
    )


def test_check_notices_a_hand_edit(tmp_path: Path) -> None:
    assert main(["generate", "--root", str(tmp_path)]) == 0
    dashboard = tmp_path / DASHBOARD_DIR / "ministream-serving.json"
    dashboard.write_text(
        dashboard.read_text().replace("vllm:num_preemptions_total", "vllm:num_preemptions")
    )
    assert main(["generate", "--check", "--root", str(tmp_path)]) == 1


def test_slo_is_a_parameter_of_the_generator(tmp_path: Path) -> None:
    assert main(["generate", "--root", str(tmp_path), "--ttft-p95-slo-seconds", "0.5"]) == 0
    rules = yaml.safe_load((tmp_path / RULES_FILE).read_text())
    (ttft,) = [
        r for g in rules["groups"] for r in g["rules"] if r["alert"] == "MiniStreamTTFTAboveSLO"
    ]
    assert ttft["expr"].endswith("> 0.5") and "(0.5 s)" in ttft["annotations"]["summary"]
    serving = json.loads((tmp_path / DASHBOARD_DIR / "ministream-serving.json").read_text())
    ttft_panel = next(p for p in serving["panels"] if p["title"] == "Time to first token")
    assert ttft_panel["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"] == 0.5


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="duration"):
        AlertParams(ttft_for="ten minutes")
    with pytest.raises(ValueError, match="kv_cache_usage_threshold"):
        AlertParams(kv_cache_usage_threshold=90)


# ------------------------------------------------------------------ the PromQL reader


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("vllm:num_requests_running", {"vllm:num_requests_running"}),
        (
            'sum by (pod, le) (rate(vllm:e2e_request_latency_seconds_bucket{pod=~"a|b"}[5m]))',
            {"vllm:e2e_request_latency_seconds_bucket"},
        ),
        ("histogram_quantile(0.95, sum(rate(x_bucket[1m])) by (le))", {"x_bucket"}),
        ("a / on (namespace, pod) group_left (model) b > bool 0.5", {"a", "b"}),
        ("max(x offset 5m) and ignoring(instance) y unless z", {"x", "y", "z"}),
        ('label_replace(up{job="a"}, "deployment", "$1", "pod", "(.+)-x")', {"up"}),
        ('count_values("v", build_info) or vector(1)', {"build_info"}),
        ("sum without (engine) (rate(c_total[1m:10s]))", {"c_total"}),
        ("1e3 * inf - nan", set()),
    ],
)
def test_metric_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_metric_names_refuses_hidden_names() -> None:
    with pytest.raises(ValueError, match="__name__"):
        metric_names('{__name__=~"vllm:.*"}')


def test_grafana_variables_are_replaced_or_refused() -> None:
    assert concrete('rate(x{pod=~"$pod"}[$__rate_interval])') == 'rate(x{pod=~".*"}[1m])'
    with pytest.raises(ValueError, match="Grafana variable"):
        concrete('x{cluster=~"$cluster"}')


# ------------------------------------------------------------------ how queries are built


def test_every_name_is_in_the_catalog() -> None:
    unknown = {q.origin: metric_names(q.promql) - catalog.KNOWN_SERIES for q in QUERIES}
    assert not {k: v for k, v in unknown.items() if v}


def test_catalog_agrees_with_the_metric_kinds() -> None:
    for m in catalog.ALL:
        assert m.name.endswith("_total") == (m.kind is catalog.Kind.COUNTER), m.name
        if m.source is catalog.Source.VLLM and m.name.startswith("vllm:"):
            continue
        assert m.source is not catalog.Source.SIDECAR or m.name.startswith("ministream_")


def test_cluster_only_allow_list_is_kube_state_metrics_only() -> None:
    expected = {
        "kube_pod_container_status_restarts_total",
        "kube_pod_status_ready",
        "kube_deployment_status_condition",
        "kube_statefulset_status_current_revision",
        "kube_statefulset_status_update_revision",
        "kube_statefulset_replicas",
        "kube_statefulset_status_replicas_updated",
    }
    assert expected == catalog.CLUSTER_ONLY
    # Alerts must work without kube-state-metrics, but for the rollout's: a workload's rollout
    # is the status of an API object, which only kube-state-metrics exports.
    for a in alerts(PARAMS):
        if a.name == "MiniStreamRolloutStalled":
            assert metric_names(a.expr) <= catalog.CLUSTER_ONLY, a.expr
        else:
            assert not metric_names(a.expr) & catalog.CLUSTER_ONLY, a.name


def test_counters_are_only_read_through_rate_or_increase() -> None:
    for q in QUERIES:
        if q.kind == "variable":
            continue
        for m in re.finditer(r"([a-z_]*\(?)([a-zA-Z_:]+_total)\b", q.promql):
            assert m.group(1) in {"rate(", "increase("}, f"{q.origin}: {m.group(0)}"


def test_quantiles_aggregate_rates_of_buckets_by_le() -> None:
    pattern = re.compile(
        r"histogram_quantile\([0-9.]+, sum by \(([a-z_, ]+)\) \(rate\("
        r"([a-zA-Z0-9_:]+)_bucket\{[^}]*\}\[[^\]]+\]\)\)\)"
    )
    found = 0
    for q in QUERIES:
        for call in q.promql.split("histogram_quantile(")[1:]:
            m = pattern.match("histogram_quantile(" + call)
            assert m, f"{q.origin}: {q.promql}"
            assert m.group(1).split(", ")[-1] == "le"
            found += 1
    assert found >= 12


def test_prefix_cache_hit_rate_is_a_ratio_of_rates() -> None:
    found = {
        q.origin.rsplit(" / ", 1)[1]: q for q in QUERIES if "Prefix-cache hit rate" in q.origin
    }
    for legend, prefix in (("hit rate", "vllm:"), ("offload tier hit rate", "vllm:external_")):
        hits, queries_ = found[legend].expr.split("\n/\n")
        assert f"rate({prefix}prefix_cache_hits_total" in hits
        assert f"rate({prefix}prefix_cache_queries_total" in queries_


def test_serving_dashboard_covers_the_issue() -> None:
    serving, fleet, _ = all_dashboards(PARAMS)
    exprs = "\n".join(t.expr for p in serving.panels() for t in p.targets)
    for name in (
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:prefix_cache_hits_total",
        "by (finished_reason)",
        "sum by (pod)",
    ):
        assert name in exprs, name
    assert {v.name for v in serving.variables} >= {"pod", "model"}
    fleet_exprs = "\n".join(t.expr for p in fleet.panels() for t in p.targets)
    for name in (
        "kube_pod_status_ready",
        "ministream_cold_start_phase_seconds",
        "ministream_warmup_runs_total",
        "ministream_drain_duration_seconds_bucket",
        "kube_pod_container_status_restarts_total",
        "ministream_upstream_health_failures_total",
    ):
        assert name in fleet_exprs, name


def test_router_dashboard_covers_the_issue() -> None:
    """Requests per replica, cache hit rate, retries, circuit breakers, replica health: from
    vllm-router's own metric names (checked live in tests/charts/test_router_discovery.py)."""
    (router,) = [d for d in all_dashboards(PARAMS) if d.uid == "ministream-router"]
    panels = {p.title: "\n".join(t.expr for t in p.targets) for p in router.panels()}
    assert (
        "sum by (worker) (rate(vllm_router_processed_requests_total"
        in panels["Requests per replica"]
    )
    hits, decisions = panels["Prefix-cache routing hit rate"].split("\n/\n")
    assert 'outcome="prefix_hit"' in hits and "outcome" not in decisions
    assert "vllm_router_retries_total" in panels["Retries"]
    assert "vllm_router_retries_exhausted_total" in panels["Retries"]
    assert "vllm_router_cb_state{" in panels["Circuit breaker state"]
    assert "vllm_router_worker_health{" in panels["Replica health and count"]
    assert {v.name for v in router.variables} == {"namespace", "router"}


# ------------------------------------------------------------------ dashboard JSON


@pytest.mark.parametrize(
    "path", sorted((ROOT / DASHBOARD_DIR).glob("*.json")), ids=lambda p: p.name
)
def test_dashboard_json(path: Path) -> None:
    d = json.loads(path.read_text())
    assert d["uid"] == path.stem and d["title"] and d["schemaVersion"] >= 36
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    for v in variables.values():
        if v["type"] == "query":
            assert v["allValue"] == ".*" and variable_selector(v["definition"])
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & mine, f"{p['title']} overlaps another panel"
        cells |= mine
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]
        for t in p["targets"]:
            # Every filter is a regex match, so "All" (.*) and multi-select both work.
            assert '="$' not in t["expr"], t["expr"]


# ------------------------------------------------------------------ alerts and runbooks


def test_rule_file_is_plain_prometheus_format() -> None:
    text = (ROOT / RULES_FILE).read_text()
    assert text == render_rules(PARAMS)
    doc = yaml.safe_load(text)
    assert set(doc) == {"groups"}
    names = [r["alert"] for g in doc["groups"] for r in g["rules"]]
    assert set(names) == {
        "MiniStreamPodNotReady",
        "MiniStreamLoadingStuck",
        "MiniStreamWarmupFailing",
        "MiniStreamLoraAdapterNotLoaded",
        "MiniStreamTTFTAboveSLO",
        "MiniStreamKVCacheNearlyFull",
        "MiniStreamQueueGrowing",
        "MiniStreamPreempting",
        "MiniStreamKVTransfersFailing",
        "MiniStreamKVReadAfterLeaseExpired",
        "MiniStreamRequestErrors",
        "MiniStreamDrainTimingOut",
        "MiniStreamRolloutStalled",
        "MiniStreamRouterWorkerEjected",
        "MiniStreamRouterWorkerUnhealthy",
        "MiniStreamRouterNoWorkers",
    }


@pytest.mark.parametrize("alert", alerts(PARAMS), ids=lambda a: f"{a.name}-{dict(a.labels)}")
def test_alert_has_text_runbook_and_scoping(alert: Alert) -> None:
    rule = alert.to_rule(PARAMS)
    assert rule["labels"]["severity"] in {"warning", "critical"}
    ann = rule["annotations"]
    assert ann["summary"] and ann["description"] and ann["runbook"]
    anchor = ann["runbook_url"].split("#")[1]
    assert f"### {rule['alert']}" in DOCS and anchor == rule["alert"].lower()
    # Every selector carries the all-namespaces matcher the chart narrows to its release.
    selectors = re.findall(r"[a-zA-Z_:]+\{([^}]*)\}", rule["expr"])
    assert selectors and all(ALL_NAMESPACES in s for s in selectors), rule["expr"]


def test_docs_list_every_query() -> None:
    for q in QUERIES:
        assert " ".join(q.expr.split()).replace("|", "\\|") in DOCS, q.origin
