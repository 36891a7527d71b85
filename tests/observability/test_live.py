"""Dashboards and alerts against the live stack: a real vLLM CPU server, the real sidecar and
a real Prometheus scraping both (fixtures in conftest.py). Nothing here is mocked."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from promkit import NAMESPACE, POD, ROOT, LiveStack, missing_metrics

from ministream_observability import catalog
from ministream_observability.alerts import AlertParams
from ministream_observability.generate import Query, queries
from ministream_observability.promql import concrete, metric_names
from ministream_observability.render import render_dashboards
from ministream_testkit.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.network]

PARAMS = AlertParams()
# vLLM's router does not run in this stack: its queries and names are checked against the
# real router's own /metrics (tests/charts/test_router_discovery.py).
SERVING_DASHBOARDS = ("ministream-serving", "ministream-fleet")
QUERIES = [q for q in queries(PARAMS) if not metric_names(q.promql) & catalog.ROUTER_ONLY]
DASHBOARD_QUERIES = [q for q in QUERIES if q.kind != "alert"]
# Grafana's $__rate_interval, stretched over the whole test (warmup came a minute before the
# checks; in Grafana it would be four scrape intervals).
WINDOW = "5m"


def _live_promql(q: Query) -> str:
    return concrete(q.expr, rate_interval=WINDOW)


# After warmup and load these must be real, positive numbers (not just present series).
POSITIVE = (
    "ministream-serving / Time to first token / p95",
    "ministream-serving / Inter-token latency / p95",
    "ministream-serving / End-to-end request latency / p95",
    "ministream-serving / Tokens per second / prompt",
    "ministream-serving / Tokens per second / generation",
    "ministream-serving / Prefix-cache hit rate / hit rate",
    "ministream-serving / Generation tokens per second by pod / {{pod}}",
    "ministream-serving / Time to first token p95 by pod / {{pod}}",
    "ministream-fleet / Cold-start phases / {{phase}} {{pod}}",
    "ministream-fleet / Warmup request latency / p95",
    "ministream-fleet / Drain duration / p95",
)


def _cluster_only(q: Query) -> bool:
    return bool(metric_names(q.promql) & catalog.CLUSTER_ONLY)


# Series this stack's vLLM does not export: those of pods serving LoRA adapters
# (test_lora_live.py), of KV offload, which the CPU build cannot run
# (test_kv_offload_names.py), and of P/D's NIXL connector (tests/pd/test_pd_live.py).
ELSEWHERE = catalog.LORA_ONLY | catalog.OFFLOAD_ONLY | catalog.PD_ONLY


def _exported_elsewhere(q: Query) -> bool:
    return bool(metric_names(q.promql) & ELSEWHERE)


def test_every_metric_name_exists_in_the_live_scrape(live: LiveStack) -> None:
    present = live.prom.names()
    missing = missing_metrics([q for q in QUERIES if not _exported_elsewhere(q)], present)
    assert not missing, "metrics missing from the live scrape"
    # ... and the catalog itself is true to what vLLM 0.32 and the sidecar export.
    exported = {
        n
        for m in catalog.ALL
        if m.source not in (catalog.Source.CLUSTER, catalog.Source.ROUTER)
        for n in m.series_names
        if n not in ELSEWHERE
    }
    assert exported <= present, sorted(exported - present)


def test_a_renamed_metric_fails_the_check(live: LiveStack) -> None:
    """Mutation: the TTFT panel with a pre-rename name, and a counter without `_total` — the
    two ways dashboards silently go blank. The name check must name both."""
    present = live.prom.names()
    (ttft,) = [q for q in QUERIES if q.origin == "ministream-serving / Time to first token / p95"]
    (preempt,) = [q for q in QUERIES if "Preemptions per second" in q.origin]
    mutated = [
        Query(
            ttft.origin,
            ttft.expr.replace(
                "vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_bucket"
            ),
            ttft.kind,
        ),
        Query(
            preempt.origin,
            preempt.expr.replace("vllm:num_preemptions_total", "vllm:num_preemptions"),
            preempt.kind,
        ),
    ]
    assert missing_metrics(mutated, present) == {
        "vllm:time_to_first_token_bucket": [ttft.origin],
        "vllm:num_preemptions": [preempt.origin],
    }
    # Prometheus itself answers the mutated query with nothing (no error: hence the check).
    assert live.prom.query(mutated[0].promql, at=live.finished) == []


@pytest.mark.parametrize("query", DASHBOARD_QUERIES, ids=lambda q: q.origin)
def test_dashboard_query_returns_data(live: LiveStack, query: Query) -> None:
    result = live.prom.query(_live_promql(query), at=live.finished)
    if _cluster_only(query) or _exported_elsewhere(query):
        return  # kube-state-metrics, LoRA, KV offload: parsed and run above, no data here
    assert result, f"no data: {_live_promql(query)}"
    if query.kind == "variable":
        return
    values = [float(r["value"][1]) for r in result]
    if query.origin in POSITIVE:
        assert all(math.isfinite(v) and v > 0 for v in values), (_live_promql(query), values)
    labels = result[0]["metric"]
    if "pod" in labels:
        assert labels["pod"] == POD and labels.get("namespace", NAMESPACE) == NAMESPACE


def test_panels_show_what_happened(live: LiveStack) -> None:
    """A few panels read back against what the fixture did."""
    at = live.finished
    q = {x.origin: x for x in QUERIES}

    def series(origin: str) -> dict[str, float]:
        out = {}
        for r in live.prom.query(_live_promql(q[origin]), at=at):
            key = ",".join(f"{k}={v}" for k, v in sorted(r["metric"].items()))
            out[key] = float(r["value"][1])
        return out

    drains = series("ministream-fleet / Drains by outcome / {{outcome}}")
    assert drains == {
        "outcome=idle": pytest.approx(1, abs=0.5),
        "outcome=timeout": pytest.approx(1, abs=0.5),
        "outcome=never_up": pytest.approx(0, abs=0.5),  # vLLM was up before both drains
    }
    runs = series("ministream-fleet / Warmup runs by outcome / {{outcome}}")
    assert runs["outcome=success"] >= 0.5 and runs["outcome=failure"] == 0
    phases = series("ministream-fleet / Cold-start phases / {{phase}} {{pod}}")
    assert {k.split(",")[0] for k in phases} == {
        "phase=engine_start",
        "phase=warmup",
        "phase=total",
    }
    reasons = series("ministream-serving / Finished requests by reason / {{finished_reason}}")
    assert reasons["finished_reason=length"] > 0


def test_alert_rules_load_and_evaluate_in_prometheus(live: LiveStack) -> None:
    groups = live.prom.api("rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    # Every alert rule of the generated file (the router's too: the file is one), each loaded
    # once: counted from the catalog.
    assert sorted(r["name"] for r in rules) == sorted(
        q.origin.removeprefix("alert ") for q in queries(PARAMS) if q.kind == "alert"
    )
    for r in rules:
        assert r["health"] == "ok" and not r.get("lastError"), r


def test_alert_expressions_run(live: LiveStack) -> None:
    for q in QUERIES:
        if q.kind == "alert":
            live.prom.query(q.promql, at=live.finished)  # raises on an evaluation error


def test_timed_out_drain_fires_and_health_alerts_stay_quiet(live: LiveStack) -> None:
    firing = ("MiniStreamDrainTimingOut", "timeout", "firing")
    active: set[tuple[str, str, str]] = set()  # (alert, reason, state), as last seen

    def drain_alert_firing() -> bool:
        active.clear()
        active.update(
            (a["labels"]["alertname"], a["labels"].get("reason", ""), a["state"])
            for a in live.prom.api("alerts")["alerts"]
        )
        return firing in active

    wait_until(drain_alert_firing, 30, 1, what="the drain alert firing", detail=lambda: f"{active}")
    names = {name for name, _, _ in active}
    # Load-dependent alerts (TTFT, queue, preemptions) are not asserted: two shared CPU cores.
    quiet = {
        "MiniStreamPodNotReady",
        "MiniStreamLoadingStuck",
        "MiniStreamWarmupFailing",
        "MiniStreamRequestErrors",
        "MiniStreamKVCacheNearlyFull",
    }
    assert not names & quiet, active


def test_render_dashboard_images(live: LiveStack, tmp_path: Path) -> None:
    """The docs' dashboard images, plotted with the dashboards' queries. Written to the docs
    with MINISTREAM_DOCS_IMAGES=1."""
    out = ROOT / "docs" / "images" if os.environ.get("MINISTREAM_DOCS_IMAGES") else tmp_path
    minutes = (live.finished - live.started + 5) / 60
    paths = render_dashboards(
        live.prom.url, out, PARAMS, minutes=minutes, end=live.finished, only=SERVING_DASHBOARDS
    )
    assert [p.name for p in paths] == ["ministream-serving.png", "ministream-fleet.png"]
    for p in paths:
        assert 20_000 < p.stat().st_size < 300_000, (p, p.stat().st_size)
