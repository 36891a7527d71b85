"""The Inference Extension's endpoint picker deployed by the chart (gateway.picker): one
source for the pool it serves, least-privilege RBAC, hardening, and the network paths it
needs (gateway -> picker ext-proc, picker -> vLLM /metrics) and no others. Rendered with
real helm and validated against the vendored upstream schemas; no cluster runs here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import crdkit
import kubernetes_validate
import pytest
from chartkit import CHART, KUBE_VERSIONS, NAMESPACE, HelmError, Rendered, render
from test_chart_fleet import Peer, allowed, write
from test_chart_scenarios import validate_monitoring

FLEET = CHART / "ci" / "fleet-values.yaml"
BASE = CHART / "ci" / "local-tp1-values.yaml"
PICKER_KINDS = {"ServiceAccount", "Role", "RoleBinding", "Service", "Deployment"}


def picker(out: Rendered, kind: str) -> dict[str, Any]:
    found = [
        d
        for d in out.of_kind(kind)
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == "endpoint-picker"
    ]
    assert len(found) == 1, f"expected one picker {kind}, got {len(found)}"
    return found[0]


def serving(out: Rendered, kind: str) -> dict[str, Any]:
    (found,) = [
        d
        for d in out.of_kind(kind)
        if d["metadata"]["labels"].get("app.kubernetes.io/component") != "endpoint-picker"
    ]
    return found


def with_picker(**sets: Any) -> Rendered:
    return render(FLEET, gateway__picker__enabled=True, **sets)


def arg(container: dict[str, Any], flag: str) -> str:
    args = container["args"]
    assert args.count(flag) == 1, f"{flag} once in {args}"
    value: str = args[args.index(flag) + 1]
    return value


def test_picker_is_off_by_default_and_a_separate_one_is_still_named() -> None:
    out = render(FLEET)
    assert not [
        d
        for d in out.docs
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == "endpoint-picker"
    ]
    pool = out.one("InferencePool")["spec"]
    assert pool["endpointPickerRef"]["name"] == "ministream-epp"


def test_gateway_without_any_picker_is_refused(tmp_path: Path) -> None:
    values = write(tmp_path, {"gateway": {"enabled": True}, "networkPolicy": {"enabled": False}})
    with pytest.raises(HelmError, match=r"gateway/endpointPicker/serviceName"):
        render(BASE, values)
    # The template's own check (for helm versions that skip the schema) names both ways out.
    with pytest.raises(HelmError, match=r"gateway\.picker\.enabled.*endpointPicker\.serviceName"):
        render(BASE, values, extra=("--skip-schema-validation",))


def test_pool_selector_is_the_pickers_pool_and_the_serving_pods() -> None:
    """The InferencePool selects exactly the serving pods, and the picker's pool flags name
    that pool in its namespace: editing either side alone fails here."""
    out = with_picker()
    pool = out.one("InferencePool")
    selector = pool["spec"]["selector"]["matchLabels"]
    pods = serving(out, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pods.items()
    assert selector == serving(out, "Deployment")["spec"]["selector"]["matchLabels"]
    epp = picker(out, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert arg(epp, "--pool-name") == pool["metadata"]["name"]
    assert arg(epp, "--pool-namespace") == NAMESPACE
    assert arg(epp, "--pool-group") == pool["apiVersion"].split("/")[0]
    # The picker's own pods are never in the pool.
    picker_pods = picker(out, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert not selector.items() <= picker_pods.items()
    route = out.one("HTTPRoute")["spec"]["rules"][0]["backendRefs"][0]
    assert route["name"] == pool["metadata"]["name"]


def test_pool_points_at_the_pickers_ext_proc_port() -> None:
    out = with_picker()
    ref = out.one("InferencePool")["spec"]["endpointPickerRef"]
    service = picker(out, "Service")
    assert ref["name"] == service["metadata"]["name"]
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"]]
    pod = picker(out, "Deployment")["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    named = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    assert named[port["targetPort"]] == 9002  # upstream's ext-proc port


def test_picker_objects_validate() -> None:
    out = with_picker(gateway__picker__replicas=2)
    assert PICKER_KINDS | {"PodDisruptionBudget", "ServiceMonitor", "NetworkPolicy"} <= {
        d["kind"]
        for d in out.docs
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == "endpoint-picker"
    }
    assert crdkit.validate(out.one("InferencePool")) == []
    for version in KUBE_VERSIONS:
        for doc in out.docs:
            if doc["apiVersion"] == "monitoring.coreos.com/v1":
                continue
            if doc["kind"] in {"InferencePool", "HTTPRoute", "ScaledObject"}:
                continue  # CRDs: crdkit above and test_chart_scenarios
            kubernetes_validate.validate(doc, version, strict=True)
    assert validate_monitoring(picker(out, "ServiceMonitor")) == []


def test_rbac_is_read_only_on_exactly_what_the_picker_watches() -> None:
    out = with_picker()
    rules = {
        (group, resource): tuple(sorted(rule["verbs"]))
        for rule in picker(out, "Role")["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    read = ("get", "list", "watch")
    assert rules == {
        ("", "pods"): read,
        ("inference.networking.k8s.io", "inferencepools"): read,
        ("inference.networking.x-k8s.io", "inferenceobjectives"): read,
        ("inference.networking.x-k8s.io", "inferencemodelrewrites"): read,
    }
    binding = picker(out, "RoleBinding")
    assert binding["roleRef"]["name"] == picker(out, "Role")["metadata"]["name"]
    account = picker(out, "ServiceAccount")["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    ]
    spec = picker(out, "Deployment")["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == account


def test_picker_is_hardened_and_probed_on_grpc_health() -> None:
    spec = picker(with_picker(), "Deployment")["spec"]["template"]["spec"]
    (epp,) = spec["containers"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = epp["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert epp["resources"]["requests"] and epp["resources"]["limits"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert epp[probe]["grpc"]["port"] == 9003
    assert epp["image"] == "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0"


def test_budget_only_above_one_replica() -> None:
    one = with_picker()
    assert [
        d
        for d in one.of_kind("PodDisruptionBudget")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "endpoint-picker"
    ] == []
    budget = picker(with_picker(gateway__picker__replicas=3), "PodDisruptionBudget")
    labels = picker(with_picker(), "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_network_paths_of_the_picker_and_nothing_more() -> None:
    out = with_picker()
    pod_labels = picker(out, "Deployment")["spec"]["template"]["metadata"]["labels"]
    epp = Peer(NAMESPACE, {"kubernetes.io/metadata.name": NAMESPACE}, pod_labels)
    gateway = Peer("gateway", {"kubernetes.io/metadata.name": "gateway"}, {"app": "envoy"})
    prometheus = Peer("monitoring", {"kubernetes.io/metadata.name": "monitoring"}, {})
    stranger = Peer("other", {"kubernetes.io/metadata.name": "other"}, {})
    pods = serving(out, "NetworkPolicy")
    neighbour = Peer(NAMESPACE, {"kubernetes.io/metadata.name": NAMESPACE}, {"app": "x"})
    # The picker scrapes vLLM's /metrics on the API port; that adds no other pod of its namespace.
    assert allowed(pods, epp, 8000) and not allowed(pods, neighbour, 8000)
    own = picker(out, "NetworkPolicy")
    assert own["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert allowed(own, gateway, 9002) and not allowed(own, stranger, 9002)
    assert allowed(own, prometheus, 9090) and not allowed(own, gateway, 9090)
    assert not allowed(own, gateway, 9003) and not allowed(own, stranger, 9090)
    # Without the chart's picker nothing of the picker is let in.
    (plain,) = render(FLEET).of_kind("NetworkPolicy")
    assert not allowed(plain, epp, 8000)


def test_one_picker_runs_without_tracing_or_metrics_auth_it_cannot_use() -> None:
    out = with_picker()
    (epp,) = picker(out, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--tracing=false" in epp["args"]
    assert "--metrics-endpoint-auth=false" in epp["args"]
    assert "--ha-enable-leader-election" not in epp["args"]
    assert not out.of_kind("ClusterRole") and not out.of_kind("ClusterRoleBinding")
    assert "authorization" not in picker(out, "ServiceMonitor")["spec"]["endpoints"][0]


def test_a_scrape_token_turns_on_the_pickers_own_metrics_auth() -> None:
    out = with_picker(gateway__picker__metricsAuthSecret="picker-scrape")
    (epp,) = picker(out, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--metrics-endpoint-auth=false" not in epp["args"]
    role = picker(out, "ClusterRole")
    assert {(r["apiGroups"][0], r["resources"][0], tuple(r["verbs"])) for r in role["rules"]} == {
        ("authentication.k8s.io", "tokenreviews", ("create",)),
        ("authorization.k8s.io", "subjectaccessreviews", ("create",)),
    }
    binding = picker(out, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["name"] == epp_account(out)
    endpoint = picker(out, "ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["authorization"]["credentials"] == {"name": "picker-scrape", "key": "token"}
    for version in KUBE_VERSIONS:
        for doc in (role, binding):
            kubernetes_validate.validate(doc, version, strict=True)


def test_several_pickers_elect_a_leader_and_only_it_is_ready() -> None:
    out = with_picker(gateway__picker__replicas=2)
    (epp,) = picker(out, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--ha-enable-leader-election" in epp["args"]
    assert epp["livenessProbe"]["grpc"]["service"] == "liveness"
    assert epp["readinessProbe"]["grpc"]["service"] == "readiness"
    rules = {
        (rule["apiGroups"][0], rule["resources"][0]): set(rule["verbs"])
        for rule in picker(out, "Role")["rules"]
    }
    assert {"create", "update", "get"} <= rules[("coordination.k8s.io", "leases")]
    assert rules[("", "events")] == {"create", "patch"}


def epp_account(out: Rendered) -> str:
    name: str = picker(out, "ServiceAccount")["metadata"]["name"]
    return name
