"""Fleet scale: autoscaling on vLLM's queue, inference-gateway routing, rollout and
disruption control, pod spreading, and the NetworkPolicy letting the scraper in.

Each property is read from the rendered objects (the pod's probes and drain, the monitors'
ports, the Deployment's selector), never restated from the templates' formulas. The custom
kinds are validated against their upstream CRDs in test_chart_scenarios.py (every scenario)
and here for the variants these tests render.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crdkit
import kubernetes_validate
import pytest
import yaml
from chartkit import (
    CHART,
    KUBE_VERSIONS,
    NAMESPACE,
    ROOT,
    SCENARIOS,
    HelmError,
    Rendered,
    render,
    scenario_id,
    scenario_values,
)

from ministream_observability import autoscaling
from ministream_observability.alerts import ALL_NAMESPACES
from ministream_observability.dashboards import VLLM

FLEET = CHART / "ci" / "fleet-values.yaml"
BASE = CHART / "ci" / "local-tp1-values.yaml"
KEDA = {"serverAddress": "http://prometheus.monitoring.svc:9090"}
DOCS = ROOT / "docs"
# A KEDA trigger that wakes a scaled-to-zero release (vLLM's own metrics vanish with its
# last pod, so they cannot).
WAKE = {
    "type": "cron",
    "metadata": {
        "timezone": "UTC",
        "start": "0 8 * * *",
        "end": "0 20 * * *",
        "desiredReplicas": "1",
    },
}


def pod_spec(rendered: Rendered) -> dict[str, Any]:
    spec: dict[str, Any] = rendered.pod_template()["spec"]
    return spec


def vllm(rendered: Rendered) -> dict[str, Any]:
    return pod_spec(rendered)["containers"][0]


def write(tmp_path: Path, overrides: dict[str, Any], name: str = "o.yaml") -> Path:
    """A values file; one name per content (chartkit caches renders by file name)."""
    path = tmp_path / name
    assert not path.exists(), f"{path} written twice: the render cache would return the first"
    path.write_text(json.dumps(overrides))  # JSON is YAML
    return path


def autoscaled(tmp_path: Path, engine: str, **extra: Any) -> Rendered:
    keda = {"keda": KEDA} if engine == "keda" else {}
    values = {"autoscaling": {"enabled": True, "engine": engine, **keda, **extra}}
    return render(BASE, write(tmp_path, values, f"{engine}.yaml"))


def crd_errors(rendered: Rendered) -> list[str]:
    return [
        f"{d['kind']}: {e}"
        for d in rendered.docs
        if d["kind"] in crdkit.KINDS
        for e in crdkit.validate(d)
    ]


def release_selector() -> str:
    """The PromQL matchers the chart scopes its rules with, read from a rendered rule."""
    rule = render(BASE, monitoring__prometheusRule__enabled=True).one("PrometheusRule")
    exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    (up,) = [e for e in exprs if e.startswith("up{")]
    return up[len("up{") : up.index("}")]


# ---------------------------------------------------------------- replicas and the scalers


@pytest.mark.parametrize("scenario_file", SCENARIOS, ids=scenario_id)
def test_replicas_absent_iff_autoscaling(scenario_file: Path, tmp_path: Path) -> None:
    for enabled in (False, True):
        over = {"autoscaling": {"enabled": enabled, "keda": KEDA}}
        if enabled and scenario_values(scenario_file)["disaggregation"]["enabled"]:
            # One scaler cannot scale two pools: refused (tests/charts/test_chart_pd.py).
            with pytest.raises(HelmError, match=r"autoscaling\.enabled"):
                render(scenario_file, write(tmp_path, over, f"{enabled}.yaml"))
            continue
        out = render(scenario_file, write(tmp_path, over, f"{enabled}.yaml"))
        workload = out.workload()
        assert ("replicas" in workload["spec"]) is (not enabled), scenario_file.name


@pytest.mark.parametrize("engine", ["keda", "hpa"])
def test_scaler_targets_the_deployment_with_min_and_max(tmp_path: Path, engine: str) -> None:
    out = autoscaled(tmp_path, engine, minReplicas=2, maxReplicas=7)
    kinds = {"keda": "ScaledObject", "hpa": "HorizontalPodAutoscaler"}
    scaler = out.one(kinds[engine])
    assert not out.of_kind(kinds["hpa" if engine == "keda" else "keda"])
    spec = scaler["spec"]
    deployment = out.one("Deployment")
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    lo, hi = (
        ("minReplicaCount", "maxReplicaCount")
        if engine == "keda"
        else ("minReplicas", "maxReplicas")
    )
    assert (spec[lo], spec[hi]) == (2, 7)
    assert not crd_errors(out)
    for version in KUBE_VERSIONS:
        for doc in out.docs:
            if doc["kind"] not in crdkit.KINDS | {"ServiceMonitor", "PodMonitor", "PrometheusRule"}:
                kubernetes_validate.validate(doc, version, strict=True)


def _behavior(rendered: Rendered) -> dict[str, Any]:
    for so in rendered.of_kind("ScaledObject"):
        behavior: dict[str, Any] = so["spec"]["advanced"]["horizontalPodAutoscalerConfig"][
            "behavior"
        ]
        return behavior
    hpa: dict[str, Any] = rendered.one("HorizontalPodAutoscaler")["spec"]["behavior"]
    return hpa


def _longest_start_and_drain(rendered: Rendered) -> tuple[int, int]:
    """What the pod allows for a start (startupProbe) and a drain (preStop --timeout)."""
    c = vllm(rendered)
    probe = c["startupProbe"]
    hook = c["lifecycle"]["preStop"]["exec"]["command"]
    return probe["failureThreshold"] * probe["periodSeconds"], int(
        hook[hook.index("--timeout") + 1]
    )


@pytest.mark.parametrize("engine", ["keda", "hpa"])
@pytest.mark.parametrize(
    "values",
    [
        {},
        {"model": {"sizeGiB": 40}},
        {"probes": {"startup": {"failureThreshold": 90, "periodSeconds": 15}}},
        {"sidecar": {"drainTimeoutSeconds": 300}, "terminationGracePeriodSeconds": 400},
        {"loading": {"mode": "shardedState"}, "tensorParallelSize": 4, "model": {"sizeGiB": 70}},
    ],
    ids=["default", "big-model", "explicit-probe", "long-drain", "sharded-tp4"],
)
def test_scale_down_waits_a_cold_start_plus_a_drain(
    tmp_path: Path, engine: str, values: dict[str, Any]
) -> None:
    """The scale-down window covers the longest start the pod's startupProbe allows plus the
    drain its preStop hook may take (both read from the rendered pod), and is computed from
    them: it moves when they move."""
    keda = {"keda": KEDA} if engine == "keda" else {}
    out = render(
        BASE,
        write(tmp_path, {**values, "autoscaling": {"enabled": True, "engine": engine, **keda}}),
    )
    start, drain = _longest_start_and_drain(out)
    down = _behavior(out)["scaleDown"]
    assert down["stabilizationWindowSeconds"] >= start + drain
    assert down["stabilizationWindowSeconds"] == start + drain  # computed, not a constant
    assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 60}]
    up = _behavior(out)["scaleUp"]
    assert up["policies"] == [{"type": "Pods", "value": 2, "periodSeconds": 60}]
    for so in out.of_kind("ScaledObject"):  # going to zero waits as long
        assert so["spec"]["cooldownPeriod"] == down["stabilizationWindowSeconds"]


def test_scale_down_window_may_be_raised(tmp_path: Path) -> None:
    out = autoscaled(tmp_path, "keda", scaleDown={"stabilizationWindowSeconds": 1800})
    assert _behavior(out)["scaleDown"]["stabilizationWindowSeconds"] == 1800


def test_keda_trigger_is_the_generated_queue_query(tmp_path: Path) -> None:
    """One definition: the trigger's query is the generated per-replica load query (the
    dashboards' queue panel builds the same one), scoped to this release as the chart's rules
    are."""
    so = autoscaled(tmp_path, "keda").one("ScaledObject")
    (trigger,) = so["spec"]["triggers"]
    selector = release_selector()
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "Value"
    meta = trigger["metadata"]
    assert meta["query"] == autoscaling.REQUESTS.per_replica(selector)
    assert (
        meta["query"].replace(selector, ALL_NAMESPACES)
        == yaml.safe_load((ROOT / autoscaling.SIGNALS_FILE).read_text())["requestsPerReplica"][
            "query"
        ]
    )
    assert meta["threshold"] == "16" and meta["serverAddress"] == KEDA["serverAddress"]
    # An empty result is lost data, not an idle fleet: KEDA must not read it as 0.
    assert meta["ignoreNullValues"] == "false"
    serving = json.loads((CHART / "dashboards" / "ministream-serving.json").read_text())
    exprs = [t["expr"] for p in serving["panels"] for t in p.get("targets", [])]
    assert autoscaling.REQUESTS.per_replica(VLLM) in exprs


def test_kv_cache_signal_and_extra_triggers(tmp_path: Path) -> None:
    out = autoscaled(
        tmp_path,
        "keda",
        minReplicas=0,
        target={"requestsPerReplica": 8, "kvCacheUsage": 0.75},
        keda={**KEDA, "extraTriggers": [WAKE], "authenticationRef": "prometheus-auth"},
    )
    so = out.one("ScaledObject")
    names = [t.get("name") for t in so["spec"]["triggers"]]
    assert names == ["requests-per-replica", "kv-cache-usage", None]
    requests, kv, extra = so["spec"]["triggers"]
    assert requests["metadata"]["threshold"] == "8" and kv["metadata"]["threshold"] == "0.75"
    assert kv["metadata"]["query"] == autoscaling.SIGNALS[1].per_replica(release_selector())
    assert requests["authenticationRef"] == {"name": "prometheus-auth"}
    assert extra == WAKE and so["spec"]["minReplicaCount"] == 0
    assert not crd_errors(out)


def test_a_release_scaled_to_zero_reads_no_series_as_idle(tmp_path: Path) -> None:
    """At zero pods vLLM's series are gone by design: with ignoreNullValues "false" KEDA's
    trigger would error (the ScaledObject Ready=False the whole idle time)."""
    out = autoscaled(tmp_path, "keda", minReplicas=0, keda={**KEDA, "extraTriggers": [WAKE]})
    triggers = out.one("ScaledObject")["spec"]["triggers"]
    vllm = [t for t in triggers if t["type"] == "prometheus"]
    assert vllm and all(t["metadata"]["ignoreNullValues"] == "true" for t in vllm)
    assert WAKE in triggers and not crd_errors(out)


def test_hpa_reads_the_generated_adapter_metrics(tmp_path: Path) -> None:
    """The HPA's Pods metrics are the ones the shipped prometheus-adapter rules serve, and
    those rules are the per-pod form of the same definition."""
    hpa = autoscaled(tmp_path, "hpa", target={"requestsPerReplica": 12, "kvCacheUsage": 0.8})
    spec = hpa.one("HorizontalPodAutoscaler")["spec"]
    rules = yaml.safe_load((CHART / "autoscaling" / "prometheus-adapter-rules.yaml").read_text())
    served = {r["name"]["as"]: r for r in rules["rules"]}
    targets = {}
    for metric in spec["metrics"]:
        assert metric["type"] == "Pods"
        name = metric["pods"]["metric"]["name"]
        assert metric["pods"]["target"]["type"] == "AverageValue"
        targets[name] = metric["pods"]["target"]["averageValue"]
    assert targets == {
        "ministream_requests_per_pod": "12",
        "ministream_kv_cache_usage_per_pod": "0.8",
    }
    for signal in autoscaling.SIGNALS:
        rule = served[signal.adapter_metric]
        assert rule["metricsQuery"] == signal.per_pod(autoscaling.ADAPTER_MATCHERS)
        assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}


def test_scale_to_zero_notes_cite_a_cold_start_measured_here(tmp_path: Path) -> None:
    from chartkit import render_notes

    over = write(
        tmp_path,
        {
            "autoscaling": {
                "enabled": True,
                "minReplicas": 0,
                "keda": {**KEDA, "extraTriggers": [WAKE]},
            }
        },
    )
    notes = " ".join(render_notes(BASE, over).split())
    assert "Scale to zero" in notes
    figures = re.findall(r"(\d+\.\d)-(\d+\.\d) s \(", notes)
    bench = (DOCS / "benchmarks.md").read_text()
    run = bench[bench.index("#### Run 9") :]
    run = run[: run.index("\n#")]
    assert len(figures) == 2 and all(f"{lo}–{hi}" in run for lo, hi in figures), figures
    assert "scripts/gpu/h200.sh coldstart" in notes and "h200.sh coldstart" in run


# ---------------------------------------------------------------- inference gateway


def test_inference_pool_selects_exactly_the_serving_pods() -> None:
    out = render(FLEET)
    pool = out.one("InferencePool")["spec"]
    deployment = out.one("Deployment")
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert pool["selector"] == {"matchLabels": selector}
    assert out.one("Service")["spec"]["selector"] == selector
    # Not the shard Job nor the test pod.
    for pod in out.of_kind("Pod"):
        assert not selector.items() <= pod["metadata"]["labels"].items()
    ports = {p["name"]: p["containerPort"] for p in vllm(out)["ports"]}
    assert pool["targetPorts"] == [{"number": ports["http"]}] == [{"number": 8000}]
    assert pool["endpointPickerRef"] == {
        "kind": "Service",
        "name": "ministream-epp",
        "port": {"number": 9002},
        "failureMode": "FailClose",
    }


def test_readiness_still_gates_gateway_traffic() -> None:
    """The endpoint picker only routes to Ready pods, and every selected pod carries the
    sidecar-backed readiness probe (ready = vLLM healthy, warmed up, not draining)."""
    out = render(FLEET)
    probe = vllm(out)["readinessProbe"]["httpGet"]
    assert probe == {"path": "/readyz", "port": 8081}
    assert not out.one("Service")["spec"].get("publishNotReadyAddresses")


def test_http_route_sends_the_api_to_the_pool() -> None:
    out = render(FLEET)
    route = out.one("HTTPRoute")["spec"]
    assert route["parentRefs"] == [{"name": "inference-gateway", "namespace": "gateway"}]
    (rule,) = route["rules"]
    assert rule["backendRefs"] == [
        {
            "group": "inference.networking.k8s.io",
            "kind": "InferencePool",
            "name": out.one("InferencePool")["metadata"]["name"],
        }
    ]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/v1"}}]


def test_http_route_hosts_and_annotations(tmp_path: Path) -> None:
    route = {
        "hostnames": ["llm.example.com"],
        "annotations": {"example.com/owner": "llm"},
        "parentRefs": [{"name": "gw", "namespace": "gateway", "sectionName": "https"}],
    }
    out = render(FLEET, write(tmp_path, {"gateway": {"httpRoute": route}}))
    doc = out.one("HTTPRoute")
    assert doc["spec"]["hostnames"] == ["llm.example.com"]
    assert doc["metadata"]["annotations"] == {"example.com/owner": "llm"}
    assert doc["spec"]["parentRefs"] == route["parentRefs"]
    assert not crd_errors(out)


def test_http_route_gives_generations_time(tmp_path: Path) -> None:
    """Envoy-based gateways end a route at 15 s unless it says otherwise: the route carries
    the chart's request timeout, and a user's own passes the upstream schema."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    default = values["gateway"]["httpRoute"]["timeouts"]
    (rule,) = render(FLEET).one("HTTPRoute")["spec"]["rules"]
    assert rule["timeouts"] == {"request": default["request"]}
    own = {"timeouts": {"request": "20m", "backendRequest": "15m"}}
    out = render(FLEET, write(tmp_path, {"gateway": {"httpRoute": own}}))
    (rule,) = out.one("HTTPRoute")["spec"]["rules"]
    assert rule["timeouts"] == own["timeouts"] and not crd_errors(out)
    longer = {"timeouts": {"request": "10m", "backendRequest": "1h"}}
    out = render(FLEET, write(tmp_path, {"gateway": {"httpRoute": longer}}, "longer.yaml"))
    assert any("backendRequest timeout cannot be longer" in e for e in crd_errors(out))
    bad = {"timeouts": {"request": "10 minutes"}}
    with pytest.raises(HelmError, match="timeouts"):
        render(FLEET, write(tmp_path, {"gateway": {"httpRoute": bad}}, "bad.yaml"))


def test_minimum_versions_are_stated_where_users_look() -> None:
    """Chart.yaml's ministream.io/min-* annotations and the chart README's table agree, and
    the fields that need them are the ones rendered."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    minimum = {
        k.removeprefix("ministream.io/min-"): v
        for k, v in chart["annotations"].items()
        if k.startswith("ministream.io/min-")
    }
    readme = (CHART / "README.md").read_text()
    table = readme[readme.index("## Minimum versions") :].split("\n## ", 1)[0]
    rows = {
        line.split("|")[1].strip(): line.split("|")[2].strip()
        for line in table.splitlines()
        if line.startswith("| ") and not line.startswith("| add-on")
    }
    names = {
        "prometheus-operator": "prometheus-operator",
        "gateway-api": "Gateway API CRDs",
        "inference-extension": "Gateway API Inference Extension",
    }
    assert set(minimum) == set(names)
    for key, row in names.items():
        assert minimum[key].startswith(rows[row]), (key, minimum[key], rows[row])
    fleet = render(
        FLEET, monitoring__podMonitor__enabled=True, monitoring__serviceMonitor__enabled=False
    )
    endpoints = fleet.one("PodMonitor")["spec"]["podMetricsEndpoints"]
    assert any("portNumber" in e for e in endpoints)
    assert fleet.one("InferencePool")["apiVersion"] == "inference.networking.k8s.io/v1"
    assert "timeouts" in fleet.one("HTTPRoute")["spec"]["rules"][0]


def test_gateway_objects_are_optional(tmp_path: Path) -> None:
    assert not {"InferencePool", "HTTPRoute"} & render(BASE).kinds()
    pool_only = render(FLEET, write(tmp_path, {"gateway": {"httpRoute": {"enabled": False}}}))
    assert pool_only.of_kind("InferencePool") and not pool_only.of_kind("HTTPRoute")


# ---------------------------------------------------------------- rollout, PDB, spreading


@pytest.mark.parametrize(
    ("rollout", "expected"),
    [
        ({"mode": "surge", "maxSurge": "25%"}, {"maxSurge": "25%", "maxUnavailable": 0}),
        ({"mode": "surge", "maxUnavailable": 1}, {"maxSurge": 1, "maxUnavailable": 1}),
        ({"mode": "inPlace", "maxUnavailable": "50%"}, {"maxSurge": 0, "maxUnavailable": "50%"}),
        (
            {"mode": "inPlace", "maxSurge": 2, "maxUnavailable": 0},
            {"maxSurge": 2, "maxUnavailable": 0},
        ),
    ],
)
def test_explicit_rollout_values_override_the_preset(
    tmp_path: Path, rollout: dict[str, Any], expected: dict[str, Any]
) -> None:
    out = render(BASE, write(tmp_path, {"rollout": rollout}))
    assert out.one("Deployment")["spec"]["strategy"]["rollingUpdate"] == expected
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(out.one("Deployment"), version, strict=True)


@pytest.mark.parametrize("value", [1, 3, "1%", "25%", "100%"])
def test_pdb_takes_a_count_or_a_percent(tmp_path: Path, value: int | str) -> None:
    values = {"replicaCount": 3, "podDisruptionBudget": {"maxUnavailable": value}}
    out = render(BASE, write(tmp_path, values))
    pdb = out.one("PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == value
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(pdb, version, strict=True)


def test_a_release_of_one_replica_has_no_budget(tmp_path: Path) -> None:
    """maxUnavailable 1 at one replica protects nothing, and 0 would block node drains."""
    assert not render(BASE).of_kind("PodDisruptionBudget")  # replicaCount 1
    assert render(BASE, replicaCount=2).one("PodDisruptionBudget")
    one = autoscaled(tmp_path, "hpa", minReplicas=1, maxReplicas=1)
    assert not one.of_kind("PodDisruptionBudget")
    assert render(FLEET).one("PodDisruptionBudget")  # autoscaled up to 8


def test_default_spreading_is_soft_across_zones_then_hosts() -> None:
    out = render(BASE)
    selector = out.one("Deployment")["spec"]["selector"]["matchLabels"]
    constraints = pod_spec(out)["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in constraints] == [
        "topology.kubernetes.io/zone",
        "kubernetes.io/hostname",
    ]
    for c in constraints:
        # Soft: a pod is never left pending for the spread's sake.
        assert c["whenUnsatisfiable"] == "ScheduleAnyway" and c["maxSkew"] == 1
        assert c["labelSelector"] == {"matchLabels": selector}
        assert c["matchLabelKeys"] == ["pod-template-hash"]  # per rollout revision


def test_spreading_is_overridable(tmp_path: Path) -> None:
    assert "topologySpreadConstraints" not in pod_spec(
        render(BASE, write(tmp_path, {"topologySpreadConstraints": []}))
    )
    mine = {
        "maxSkew": 2,
        "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"team": "llm"}},
    }
    out = render(BASE, write(tmp_path, {"topologySpreadConstraints": [mine]}, "mine.yaml"))
    assert pod_spec(out)["topologySpreadConstraints"] == [mine]


# ---------------------------------------------------------------- NetworkPolicy and scraping


@dataclass(frozen=True)
class Peer:
    """A pod that opens connections: its namespace, the namespace's labels, its own labels."""

    namespace: str
    namespace_labels: dict[str, str]
    labels: dict[str, str]


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions", []):
        key, op, vals = e["key"], e["operator"], e.get("values", [])
        ok = {
            "In": key in labels and labels[key] in vals,
            "NotIn": key not in labels or labels[key] not in vals,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def allowed(policy: dict[str, Any], peer: Peer, port: int) -> bool:
    """NetworkPolicy ingress semantics for one peer and one numeric port."""
    spec = policy["spec"]
    if "Ingress" not in spec.get("policyTypes", ["Ingress"]):
        return True
    for rule in spec.get("ingress", []):
        if rule.get("ports") and not any(p.get("port") == port for p in rule["ports"]):
            continue
        if not rule.get("from"):
            return True
        for source in rule["from"]:
            ns_sel, pod_sel = source.get("namespaceSelector"), source.get("podSelector")
            if ns_sel is None and pod_sel is None:
                continue  # ipBlock: not a pod peer
            ns_ok = (
                peer.namespace == policy["metadata"].get("namespace", NAMESPACE)
                if ns_sel is None
                else _matches(ns_sel, peer.namespace_labels)
            )
            if ns_ok and (pod_sel is None or _matches(pod_sel, peer.labels)):
                return True
    return False


def scraped_ports(rendered: Rendered) -> set[int]:
    """Container ports the ServiceMonitor/PodMonitor scrape, resolved through the Service."""
    spec = pod_spec(rendered)
    named = {
        p["name"]: p["containerPort"]
        for c in spec["containers"] + spec["initContainers"]
        for p in c.get("ports", [])
    }
    service = {p["name"]: p["targetPort"] for p in rendered.one("Service")["spec"]["ports"]}
    out: set[int] = set()
    for sm in rendered.serving("ServiceMonitor"):
        for e in sm["spec"]["endpoints"]:
            target = service[e["port"]]
            out.add(named[target] if isinstance(target, str) else target)
    for pm in rendered.of_kind("PodMonitor"):
        for e in pm["spec"]["podMetricsEndpoints"]:
            out.add(e["portNumber"] if "portNumber" in e else named[e["port"]])
    return out


def scraper(values: dict[str, Any]) -> Peer:
    """A Prometheus pod matching the first peer of networkPolicy.metricsFrom."""
    source = values["networkPolicy"]["metricsFrom"][0]
    ns_labels = dict(source.get("namespaceSelector", {}).get("matchLabels", {}))
    namespace = ns_labels.get("kubernetes.io/metadata.name", NAMESPACE)
    ns_labels.setdefault("kubernetes.io/metadata.name", namespace)
    pod_labels = {"app.kubernetes.io/name": "prometheus"}
    pod_labels.update(source.get("podSelector", {}).get("matchLabels", {}))
    return Peer(namespace, ns_labels, pod_labels)


def test_scraper_reaches_every_scraped_port(rendered: Rendered, values: dict[str, Any]) -> None:
    """Every values file: where a NetworkPolicy and a monitor are both on, the scraper named
    in networkPolicy.metricsFrom may open every port the monitors scrape."""
    policies = rendered.serving("NetworkPolicy")
    ports = scraped_ports(rendered)
    if not policies or not ports:
        return
    peer = scraper(values)
    for port in sorted(ports):
        assert allowed(policies[0], peer, port), f"{peer.namespace} cannot scrape port {port}"


def test_scrape_check_catches_the_old_runai_streamer_values(tmp_path: Path) -> None:
    """Mutation: the NetworkPolicy the runai-streamer scenario used to render (monitoring let
    onto the sidecar port only, schema check skipped) blocks vLLM's own /metrics on 8000 —
    the scrape-down alert."""
    old = write(
        tmp_path,
        {
            "networkPolicy": {
                "metricsFrom": [],
                "sidecarFrom": [
                    {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}
                        }
                    }
                ],
            }
        },
    )
    scenario = CHART / "ci" / "runai-streamer-tp2-values.yaml"
    out = render(scenario, old, extra=("--skip-schema-validation",))
    prometheus = Peer("monitoring", {"kubernetes.io/metadata.name": "monitoring"}, {})
    (policy,) = out.of_kind("NetworkPolicy")
    assert allowed(policy, prometheus, 8081)
    assert not allowed(policy, prometheus, 8000)
    assert 8000 in scraped_ports(out)


def test_fleet_policy_lets_in_the_gateway_and_the_endpoint_picker() -> None:
    out = render(FLEET)
    (policy,) = out.of_kind("NetworkPolicy")
    gateway_proxy = Peer("gateway", {"kubernetes.io/metadata.name": "gateway"}, {"app": "envoy"})
    picker = Peer(NAMESPACE, {"kubernetes.io/metadata.name": NAMESPACE}, {"epp": "ministream-epp"})
    stranger = Peer("other", {"kubernetes.io/metadata.name": "other"}, {})
    assert allowed(policy, gateway_proxy, 8000) and allowed(policy, picker, 8000)
    assert not allowed(policy, stranger, 8000) and not allowed(policy, gateway_proxy, 9999)


def _namespace_peer(name: str, labels: dict[str, str] | None = None) -> Peer:
    return Peer(name, {"kubernetes.io/metadata.name": name}, labels or {})


def test_a_shared_gateway_in_another_namespace_is_let_in(tmp_path: Path) -> None:
    """With the gateway on and no apiFrom/apiNamespaces, the API port still admits the
    namespace of every Gateway the HTTPRoute attaches to (read from the rendered route), and
    nothing else from outside; without a route the chart cannot know that namespace and
    refuses, naming the values to set."""
    fleet = yaml.safe_load(FLEET.read_text())
    values = {
        "gateway": fleet["gateway"],
        "networkPolicy": {"apiFrom": [], "apiNamespaces": []},
    }
    out = render(BASE, write(tmp_path, values))
    (policy,) = out.of_kind("NetworkPolicy")
    route_namespaces = {
        ref.get("namespace", NAMESPACE) for ref in out.one("HTTPRoute")["spec"]["parentRefs"]
    }
    assert route_namespaces - {NAMESPACE}, "the fleet example's Gateway is in another namespace"
    for name in route_namespaces:
        assert allowed(policy, _namespace_peer(name, {"app": "envoy"}), 8000), name
        assert not allowed(policy, _namespace_peer(name), 8081), name
    assert allowed(policy, _namespace_peer(NAMESPACE), 8000)
    assert not allowed(policy, _namespace_peer("other"), 8000)
    no_route = {**values, "gateway": {**fleet["gateway"], "httpRoute": {"enabled": False}}}
    with pytest.raises(HelmError, match=r"networkPolicy\.apiNamespaces.*networkPolicy\.apiFrom"):
        render(BASE, write(tmp_path, no_route, "no-route.yaml"))
    own = {**no_route, "networkPolicy": {"apiNamespaces": ["gateway"]}}
    (policy,) = render(BASE, write(tmp_path, own, "own.yaml")).of_kind("NetworkPolicy")
    assert allowed(policy, _namespace_peer("gateway"), 8000)


def test_the_chart_test_pod_reaches_the_api(tmp_path: Path) -> None:
    """`helm test` passes the NetworkPolicy whatever apiFrom names (the fleet example names
    only the gateway and the picker): its pod may open the port its Service call lands on,
    that port only beyond what the namespace already gets, and no other pod borrows it."""
    out = render(FLEET, networkPolicy__sidecarFrom=[{"podSelector": {"matchLabels": {"x": "y"}}}])
    (policy,) = out.of_kind("NetworkPolicy")
    (test_pod,) = out.of_kind("Pod")
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    env = [e for c in test_pod["spec"]["containers"] for e in c["env"]]
    (base_url,) = [e["value"] for e in env if e["name"] == "BASE_URL"]
    service_port = int(base_url.rsplit(":", 1)[1])
    (target,) = [
        p["targetPort"] for p in out.one("Service")["spec"]["ports"] if p["port"] == service_port
    ]
    named = {p["name"]: p["containerPort"] for p in vllm(out)["ports"]}
    api_port = named[target] if isinstance(target, str) else target
    tester = _namespace_peer(test_pod["metadata"].get("namespace", NAMESPACE))
    tester = Peer(tester.namespace, tester.namespace_labels, test_pod["metadata"]["labels"])
    assert allowed(policy, tester, api_port)
    assert not allowed(policy, tester, 8081)
    neighbour = _namespace_peer(NAMESPACE, {"app": "client"})
    assert not allowed(policy, neighbour, api_port)
    elsewhere = Peer("other", {"kubernetes.io/metadata.name": "other"}, tester.labels)
    assert not allowed(policy, elsewhere, api_port)
    off = render(FLEET, helmTest__enabled=False)
    (policy,) = off.of_kind("NetworkPolicy")
    assert not off.of_kind("Pod") and not allowed(policy, tester, api_port)


def _sidecar_env(rendered: Rendered) -> dict[str, Any]:
    (sidecar,) = [c for c in pod_spec(rendered)["initContainers"] if c["name"] == "sidecar"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in sidecar["env"]}


def test_closed_by_default() -> None:
    """With no networkPolicy or control values at all, the NetworkPolicy is on, the
    API and the sidecar are open to the namespace only, both scraped ports to `monitoring`,
    /warmup and /drain answer loopback only, and an empty API key stops the pod."""
    out = render(BASE)
    (policy,) = out.of_kind("NetworkPolicy")
    neighbour = Peer(NAMESPACE, {"kubernetes.io/metadata.name": NAMESPACE}, {"app": "client"})
    prometheus = Peer("monitoring", {"kubernetes.io/metadata.name": "monitoring"}, {})
    stranger = Peer("other", {"kubernetes.io/metadata.name": "other"}, {})
    assert allowed(policy, neighbour, 8000) and allowed(policy, neighbour, 8081)
    assert allowed(policy, prometheus, 8000) and allowed(policy, prometheus, 8081)
    assert not allowed(policy, stranger, 8000) and not allowed(policy, stranger, 8081)
    assert not allowed(policy, neighbour, 9999)
    env = _sidecar_env(out)
    assert env["MINISTREAM_SIDECAR_CONTROL_FROM_NETWORK"] == "false"
    assert env["MINISTREAM_SIDECAR_API_KEY_REQUIRED"] == "true"


def test_api_namespaces_open_the_api_port_only(tmp_path: Path) -> None:
    values = {"networkPolicy": {"apiNamespaces": ["apps", "batch"]}}
    (policy,) = render(BASE, write(tmp_path, values)).of_kind("NetworkPolicy")
    for name in ("apps", "batch"):
        peer = Peer(name, {"kubernetes.io/metadata.name": name}, {})
        assert allowed(policy, peer, 8000)
        assert not allowed(policy, peer, 8081)
    local = Peer(NAMESPACE, {"kubernetes.io/metadata.name": NAMESPACE}, {})
    assert allowed(policy, local, 8000)
    other = Peer("other", {"kubernetes.io/metadata.name": "other"}, {})
    assert not allowed(policy, other, 8000)


def test_control_from_network_is_an_explicit_value(tmp_path: Path) -> None:
    values = {
        "sidecar": {"control": {"fromNetwork": True}, "token": {"existingSecret": "tok"}},
    }
    env = _sidecar_env(render(BASE, write(tmp_path, values)))
    assert env["MINISTREAM_SIDECAR_CONTROL_FROM_NETWORK"] == "true"
    assert env["MINISTREAM_SIDECAR_TOKEN_REQUIRED"] == "true"
    with pytest.raises(HelmError, match="fromNetwork"):
        render(BASE, write(tmp_path, {"sidecar": {"control": {"fromNetwork": "yes"}}}, "b.yaml"))


# ---------------------------------------------------------------- the documented example


def _contained(part: Any, whole: Any, path: str = "$") -> list[str]:
    """Where `part` is not a sub-document of `whole` (maps may omit keys, the rest is equal)."""
    if isinstance(part, dict) and isinstance(whole, dict):
        out = []
        for key, value in part.items():
            if key not in whole:
                out.append(f"{path}.{key}: not rendered")
            else:
                out += _contained(value, whole[key], f"{path}.{key}")
        return out
    if isinstance(part, list) and isinstance(whole, list) and len(part) == len(whole):
        return [
            e
            for i, (a, b) in enumerate(zip(part, whole, strict=True))
            for e in _contained(a, b, f"{path}[{i}]")
        ]
    return [] if part == whole else [f"{path}: documented {part!r}, rendered {whole!r}"]


@pytest.mark.parametrize("doc", ["charts/ministream/README.md", "docs/fleet.md"])
def test_documented_fleet_example_is_the_rendered_one(doc: str) -> None:
    text = (ROOT / doc).read_text()
    block = text.split("<!-- fleet-example:start -->")[1].split("<!-- fleet-example:end -->")[0]
    documented = [d for d in yaml.safe_load_all(block.strip().strip("`").removeprefix("yaml")) if d]
    assert {d["kind"] for d in documented} >= {"ScaledObject", "InferencePool", "HTTPRoute"}
    rendered = render(FLEET)
    for d in documented:
        (match,) = [
            r for r in rendered.of_kind(d["kind"]) if r["metadata"]["name"] == d["metadata"]["name"]
        ]
        assert not _contained(d, match), _contained(d, match)


# ---------------------------------------------------------------- vendored CRDs


def test_vendored_crds_are_the_upstream_files() -> None:
    readme = (crdkit.CRDS / "README.md").read_text()
    for name in set(crdkit.FILES.values()):
        digest = hashlib.sha256((crdkit.CRDS / name).read_bytes()).hexdigest()
        row = next(line for line in readme.splitlines() if line.startswith(f"| `{name}`"))
        assert digest in row, f"{name}: sha256 {digest} is not the one in crds/README.md"


@pytest.mark.parametrize(
    ("kind", "mutate", "expected"),
    [
        ("ScaledObject", lambda d: d["spec"].update(pollingIntervall=5), "pollingIntervall"),
        ("ScaledObject", lambda d: d["spec"].update(minReplicaCount=99), "minReplicaCount must"),
        ("ScaledObject", lambda d: d["spec"]["triggers"][0]["metadata"].update(threshold=16), "16"),
        ("InferencePool", lambda d: d["spec"]["targetPorts"].append({"number": 8000}), "unique"),
        ("InferencePool", lambda d: d["spec"]["endpointPickerRef"].pop("port"), "port is required"),
        ("InferencePool", lambda d: d["spec"]["selector"].update(matchExpressions=[]), "matchExpr"),
        ("HTTPRoute", lambda d: d["spec"]["rules"][0]["backendRefs"][0].update(weigth=1), "weigth"),
        (
            "HTTPRoute",
            lambda d: d["spec"]["rules"][0]["matches"][0]["path"].update(value="v1"),
            "'/'",
        ),
    ],
)
def test_crd_check_catches_bad_objects(kind: str, mutate: Any, expected: str) -> None:
    """The strictness is ours (unknown fields, CEL twins), so prove it bites."""
    doc = json.loads(json.dumps(render(FLEET).one(kind)))
    assert crdkit.validate(doc) == []
    mutate(doc)
    errors = crdkit.validate(doc)
    assert any(expected in e for e in errors), errors


def test_a_cel_rule_without_a_twin_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    doc = render(FLEET).one("ScaledObject")
    monkeypatch.delitem(
        crdkit.CEL_TWINS, "minReplicaCount must be less than or equal to maxReplicaCount"
    )
    (error,) = crdkit.validate(doc)
    assert "without a Python twin" in error
