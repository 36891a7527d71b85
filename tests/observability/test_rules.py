"""promtool against the shipped files: every alert expression and every dashboard query
parses, the alert unit tests (rules_test.yaml) pass, and both checks have teeth."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml
from promkit import ROOT, promtool, recording_rules_file

from ministream_observability.alerts import AlertParams
from ministream_observability.catalog import CLUSTER_ONLY
from ministream_observability.generate import RULES_FILE, Query, queries
from ministream_observability.promql import metric_names

UNIT_TESTS = ROOT / "tests" / "observability" / "rules_test.yaml"


def test_alert_rules_parse() -> None:
    out = promtool("check", "rules", ROOT / RULES_FILE)
    assert out.returncode == 0, out.stdout + out.stderr
    alerts = [q for q in queries(AlertParams()) if q.kind == "alert"]
    assert f"SUCCESS: {len(alerts)} rules found" in out.stdout


def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    """Dashboard queries (Grafana variables replaced) as recording rules: promtool parses
    each one with Prometheus's own parser."""
    qs = [q for q in queries(AlertParams()) if q.kind != "alert"]
    out = promtool("check", "rules", recording_rules_file(qs, tmp_path / "queries.yaml"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(qs)} rules found" in out.stdout


def test_a_broken_query_fails_the_parse_check(tmp_path: Path) -> None:
    broken = Query("broken", "histogram_quantile(0.95, sum by (le) rate(x_bucket[5m]))", "panel")
    out = promtool("check", "rules", recording_rules_file([broken], tmp_path / "broken.yaml"))
    assert out.returncode != 0 and "parse error" in (out.stdout + out.stderr)


def test_alert_unit_tests() -> None:
    out = promtool("test", "rules", UNIT_TESTS)
    assert out.returncode == 0, out.stdout + out.stderr


def test_unit_tests_catch_a_counter_without_total(tmp_path: Path) -> None:
    """The classic broken alert: a counter queried without `_total` never fires. The unit
    tests must notice (they run against a copy of the rules with that mistake)."""
    rules = tmp_path / "charts" / "ministream" / "rules" / "ministream-alerts.yaml"
    rules.parent.mkdir(parents=True)
    text = (ROOT / RULES_FILE).read_text()
    assert "vllm:num_preemptions_total" in text
    rules.write_text(text.replace("vllm:num_preemptions_total", "vllm:num_preemptions"))
    (tmp_path / "tests" / "observability").mkdir(parents=True)
    shutil.copy(UNIT_TESTS, tmp_path / "tests" / "observability" / "rules_test.yaml")
    out = promtool("test", "rules", tmp_path / "tests" / "observability" / "rules_test.yaml")
    assert out.returncode != 0
    assert "alertname: MiniStreamPreempting" in out.stdout + out.stderr


# Synthetic kube-state-metrics and sidecar series of one namespace: a Deployment release
# (pods <deployment>-<replicaset hash>-<id>, one not ready), a multi-node release (LeaderWorkerSet
# leaders <lws>-<group>, sidecar and all; a worker <lws>-<group>-<index> is ready but runs no
# sidecar), and a pod of something else. kube-state-metrics exports kube_pod_status_ready per
# pod and condition, 1 on the pod's current one.
_POD_READY = {
    "ms-ministream-6b7c9d8f5-x2k9p": (1, True),
    "ms-ministream-6b7c9d8f5-q8w4z": (0, True),
    "big-ministream-lws-0": (1, True),
    "big-ministream-lws-1": (1, True),
    "big-ministream-lws-0-1": (1, False),
    "other-5d4f7c9b8-abcde": (1, False),
}
_READY_BY_WORKLOAD = {"ms-ministream": 1, "big-ministream-lws": 2}


def _ready_replicas_tests(expr: str) -> dict[str, Any]:
    series = []
    for pod, (ready, sidecar) in _POD_READY.items():
        for condition, value in (("true", ready), ("false", 1 - ready)):
            name = (
                f'kube_pod_status_ready{{namespace="prod", pod="{pod}", condition="{condition}"}}'
            )
            series.append({"series": name, "values": f"{value}x5"})
        if sidecar:
            info = f'ministream_info{{namespace="prod", pod="{pod}", model="m", revision="r"}}'
            series.append({"series": info, "values": "1x5"})
    samples = [
        {"labels": f'{{namespace="prod", workload="{w}"}}', "value": n}
        for w, n in _READY_BY_WORKLOAD.items()
    ]
    test = {"interval": "1m", "input_series": series}
    test["promql_expr_test"] = [{"expr": expr, "eval_time": "3m", "exp_samples": samples}]
    return {"rule_files": [], "tests": [test]}


def test_ready_replicas_counts_both_workload_kinds(tmp_path: Path) -> None:
    """The fleet dashboard's kube-state-metrics "Ready replicas" query, as generated, run by
    Prometheus's engine (promtool) over synthetic series: the ready serving pods per workload,
    a Deployment's and a LeaderWorkerSet's leaders alike (one sidecar per replica), never a
    group's workers or another app's pods."""
    (query,) = [
        q
        for q in queries(AlertParams())
        if q.origin.startswith("ministream-fleet / Ready replicas")
        and metric_names(q.promql) & CLUSTER_ONLY
    ]
    path = tmp_path / "ready_test.yaml"
    path.write_text(yaml.safe_dump(_ready_replicas_tests(query.promql)))
    out = promtool("test", "rules", path)
    assert out.returncode == 0, query.promql + "\n" + out.stdout + out.stderr
