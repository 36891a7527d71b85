"""The chart ships the same dashboards and alerts as the plain files, narrowed to its release
(real helm from .tools/bin, see scripts/install_tools.sh)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from promkit import ROOT, promtool

from ministream_observability.alerts import (
    ALL_DEPLOYMENTS,
    ALL_NAMESPACES,
    ALL_ROUTERS,
    ALL_STATEFULSETS,
)
from ministream_observability.generate import DASHBOARD_DIR, RULES_FILE
from ministream_testkit.helm import render

CHART = ROOT / "charts" / "ministream"
VALUES = CHART / "ci" / "local-tp1-values.yaml"
MULTINODE = CHART / "ci" / "multinode-2x8-values.yaml"
SELECTOR = 'namespace="serving", pod=~"ms-ministream-[a-z0-9]+-[a-z0-9]+"'
ROUTER_SELECTOR = 'namespace="serving", pod=~"ms-ministream-router-[a-z0-9]+-[a-z0-9]+"'


def _render(*sets: str, values: Path = VALUES) -> list[dict[str, Any]]:
    return render(CHART, [values], set_args=sets, namespace="serving")


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    return _render(
        "monitoring.prometheusRule.enabled=true",
        "monitoring.dashboards.enabled=true",
        "router.enabled=true",
    )


def test_router_alerts_and_dashboard_only_with_the_router() -> None:
    off = _render("monitoring.prometheusRule.enabled=true", "monitoring.dashboards.enabled=true")
    (rule,) = [d for d in off if d["kind"] == "PrometheusRule"]
    groups = {g["name"] for g in rule["spec"]["groups"]}
    assert "ministream.router" not in groups and "ministream.serving" in groups
    (cm,) = [
        d
        for d in off
        if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"]["labels"]
    ]
    assert set(cm["data"]) == {"ministream-serving.json", "ministream-fleet.json"}


def test_prometheus_rule_embeds_the_rule_file_for_this_release(
    rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    (rule,) = [d for d in rendered if d["kind"] == "PrometheusRule"]
    (deployment,) = [
        d
        for d in rendered
        if d["kind"] == "Deployment"
        and d["metadata"]["labels"]["app.kubernetes.io/component"] != "router"
    ]
    plain = yaml.safe_load((ROOT / RULES_FILE).read_text())["groups"]
    by_name = {g["name"]: g for g in rule["spec"]["groups"]}
    for group in plain:
        shipped = by_name[group["name"]]["rules"]
        assert len(shipped) == len(group["rules"])
        for mine, theirs in zip(group["rules"], shipped, strict=True):
            # Same rule, the all-namespaces matcher replaced by the release's selector (the
            # workload-level ones by its Deployment's name, the router's alerts by its router
            # pods); Prometheus templates in the annotations untouched (no `tpl`).
            workloads = (
                mine["expr"]
                .replace(
                    ALL_DEPLOYMENTS,
                    f'namespace="serving", deployment="{deployment["metadata"]["name"]}"',
                )
                .replace(ALL_ROUTERS, ROUTER_SELECTOR)
            )
            if ALL_STATEFULSETS in workloads:  # the LeaderWorkerSet rule: its own test below
                continue
            assert theirs["expr"] == workloads.replace(ALL_NAMESPACES, SELECTOR)
            assert ALL_NAMESPACES not in theirs["expr"]
            assert {k: v for k, v in theirs.items() if k != "expr"} == {
                k: v for k, v in mine.items() if k != "expr"
            }
    # What the operator hands to Prometheus must parse, too.
    path = tmp_path / "from-chart.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    out = promtool("check", "rules", path)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize(
    ("values", "kind", "label"),
    [(VALUES, "Deployment", "deployment"), (MULTINODE, "LeaderWorkerSet", "statefulset")],
)
def test_rollout_alert_watches_this_releases_workload(values: Path, kind: str, label: str) -> None:
    """MiniStreamRolloutStalled reads kube-state-metrics series of the workload object: the
    release's Deployment, or its LeaderWorkerSet's leader StatefulSet (named as the
    LeaderWorkerSet), never a pod selector (those series have no pod of ours)."""
    rendered = _render("monitoring.prometheusRule.enabled=true", values=values)
    (rule,) = [d for d in rendered if d["kind"] == "PrometheusRule"]
    (workload,) = [d for d in rendered if d["kind"] == kind]
    (stalled,) = [
        r
        for g in rule["spec"]["groups"]
        for r in g["rules"]
        if r.get("alert") == "MiniStreamRolloutStalled" and r["labels"]["kind"] == kind
    ]
    selectors = set(re.findall(r"\{([^}]*)\}", stalled["expr"]))
    mine = f'namespace="serving", {label}="{workload["metadata"]["name"]}"'
    assert selectors and all(s.startswith(mine) for s in selectors), stalled["expr"]
    assert "pod=~" not in stalled["expr"] and '=~".*"' not in stalled["expr"]


def test_dashboard_configmap_carries_the_generated_dashboards(
    rendered: list[dict[str, Any]],
) -> None:
    (cm,) = [
        d
        for d in rendered
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboards")
    ]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    files = {p.name: p.read_text() for p in (ROOT / DASHBOARD_DIR).glob("*.json")}
    assert set(files) == {
        "ministream-serving.json",
        "ministream-fleet.json",
        "ministream-router.json",
    }
    assert cm["data"] == files


def test_monitoring_objects_are_switchable() -> None:
    kinds = {d["kind"] for d in _render()}
    assert "PrometheusRule" not in kinds
