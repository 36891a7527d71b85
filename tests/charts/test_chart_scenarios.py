"""Every CI scenario: helm lint, helm template, strict validation of every rendered object.

Core kinds are validated by kubernetes-validate (strict: unknown fields fail) for each
supported Kubernetes version. The prometheus-operator kinds have no schema there; they are
parsed by the models generated from the operator's CRDs (cloudcoil), and any field those
models do not know fails too. KEDA's ScaledObject, the InferencePool and the HTTPRoute are
validated against their upstream CRDs, vendored in tests/charts/crds (crdkit.py).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import crdkit
import kubernetes_validate
import pytest
from chartkit import (
    CHART,
    KUBE_VERSIONS,
    SCENARIOS,
    Rendered,
    render,
    render_notes,
    run_helm,
    scenario_id,
    scenario_values,
)

MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def test_every_required_configuration_has_a_scenario() -> None:
    values = [scenario_values_text(p) for p in SCENARIOS]
    for mode in ("local", "runaiStreamer", "shardedState", "runaiStreamerSharded"):
        assert any(f"mode: {mode}\n" in v for v in values), f"no scenario for loading.mode={mode}"
    for tp in (1, 2, 4):
        assert any(
            f"tensorParallelSize: {tp}\n" in v or (tp == 1 and "tensorParallelSize" not in v)
            for v in values
        ), f"no scenario for TP {tp}"
    assert any("mode: inPlace" in v for v in values)
    assert any("mode: inPlace" not in v for v in values)  # surge is the default
    assert any("type: cpu" in v for v in values)
    assert any("serviceMonitor:\n    enabled: true" in v for v in values)
    assert any("monitoring:" not in v for v in values)
    # Fleet scale: autoscaled, gateway-routed, zone-spread (the chart's default).
    assert any("autoscaling:\n  enabled: true" in v for v in values)
    assert any("gateway:\n  enabled: true" in v for v in values)
    assert any("autoscaling:" not in v for v in values)


def scenario_values_text(path: Path) -> str:
    return path.read_text()


@pytest.mark.parametrize("major", [4, 3], ids=["helm4", "helm3"])
@pytest.mark.parametrize("scenario_file", SCENARIOS, ids=scenario_id)
def test_helm_lint(scenario_file: Path, major: int) -> None:
    proc = run_helm(["lint", "--strict", str(CHART), "-f", str(scenario_file)], major)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("scenario_file", SCENARIOS, ids=scenario_id)
def test_helm3_and_helm4_render_the_same(scenario_file: Path) -> None:
    assert render(scenario_file, major=3).docs == render(scenario_file, major=4).docs


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_rendered_objects_validate_against_kubernetes(
    rendered: Rendered, kube_version: str
) -> None:
    errors = []
    for doc in rendered.docs:
        if doc["kind"] in MONITORING_KINDS | crdkit.KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, kube_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            errors.append(f"{doc['kind']}/{doc['metadata']['name']}: {path}: {exc.message}")
    assert not errors, "\n".join(errors)


def test_monitoring_objects_validate_against_operator_crds(rendered: Rendered) -> None:
    for doc in rendered.docs:
        if doc["kind"] in MONITORING_KINDS:
            assert doc["apiVersion"] == "monitoring.coreos.com/v1"
            unknown = validate_monitoring(doc)
            assert not unknown, f"{doc['kind']}: fields the CRD does not define: {unknown}"


def test_only_known_kinds_are_rendered(rendered: Rendered) -> None:
    known = {
        "Deployment",
        "Service",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "Job",
        "Pod",
        "ConfigMap",
        "PersistentVolumeClaim",
        "HorizontalPodAutoscaler",
        *MONITORING_KINDS,
        *crdkit.KINDS,
    }
    assert rendered.kinds() <= known


def test_custom_resources_validate_against_upstream_crds(rendered: Rendered) -> None:
    errors = [
        f"{doc['kind']}/{doc['metadata']['name']}: {e}"
        for doc in rendered.docs
        if doc["kind"] in crdkit.KINDS
        for e in crdkit.validate(doc)
    ]
    assert not errors, "\n".join(errors)


def validate_monitoring(doc: dict[str, Any]) -> list[str]:
    """Parse with the CRD-generated model (types, enums, required fields), then report every
    input field the model dropped: those are fields the CRD does not define."""
    model = _operator_models()[doc["kind"]]
    parsed = model.model_validate(doc)
    dumped = parsed.model_dump(by_alias=True, exclude_unset=True, mode="json")
    return _dropped(doc, dumped)


@functools.cache
def _operator_models() -> dict[str, Any]:
    from cloudcoil.models.prometheus_operator import v1  # slow import: once per session

    return {
        "ServiceMonitor": v1.ServiceMonitor,
        "PodMonitor": v1.PodMonitor,
        "PrometheusRule": v1.PrometheusRule,
    }


def _dropped(src: Any, dumped: Any, path: str = "$") -> list[str]:
    out: list[str] = []
    if isinstance(src, dict) and isinstance(dumped, dict):
        for key, value in src.items():
            if key not in dumped:
                out.append(f"{path}.{key}")
            else:
                out += _dropped(value, dumped[key], f"{path}.{key}")
    elif isinstance(src, list) and isinstance(dumped, list):
        for i, (a, b) in enumerate(zip(src, dumped, strict=True)):
            out += _dropped(a, b, f"{path}[{i}]")
    return out


def test_crd_check_catches_an_unknown_field() -> None:
    """The strictness above is ours, so prove it bites."""
    sm = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "x"},
        "spec": {"selector": {}, "endpoints": [{"port": "http", "intervall": "30s"}]},
    }
    assert validate_monitoring(sm) == ["$.spec.endpoints[0].intervall"]


@pytest.mark.parametrize("scenario_file", SCENARIOS, ids=scenario_id)
def test_notes_render(scenario_file: Path) -> None:
    """NOTES.txt (shown by `helm install`) renders and states the derived facts. Helm 4's
    client-side dry run needs no cluster."""
    notes = render_notes(scenario_file)
    values = scenario_values(scenario_file)
    tp = values["parallelism"]["tensor"] or values["tensorParallelSize"] or 1
    assert f"tensor-parallel size {tp}" in notes
    assert f"Rollout:   {values['rollout']['mode']}" in notes
    pd = values["disaggregation"]
    if values["autoscaling"]["enabled"]:
        assert f"Scaling:   {values['autoscaling']['engine']}" in notes
    elif pd["enabled"]:
        assert f"{pd['prefill']['replicas']} prefill pod(s)" in notes
        assert f"{pd['decode']['replicas']} decode pod(s)" in notes
        assert "port-forward svc/ms-ministream-router " in notes
    else:
        assert f"Replicas:  {values['replicaCount']} (fixed" in notes
    assert "helm test ms -n serving" in notes
