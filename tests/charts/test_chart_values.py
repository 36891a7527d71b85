"""Bad values are refused, by the schema (values.schema.json, the chart's one validation:
`--skip-schema-validation` skips it) or by one of the few template `fail`s, with a message
that names the value. (The README's values table, generated from values.yaml:
tests/scripts/test_chart_docs.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from chartkit import CHART, HelmError, render, run_helm

BASE = CHART / "ci" / "local-tp1-values.yaml"
S3: dict[str, Any] = {
    "loading": {
        "mode": "runaiStreamer",
        "s3": {"bucket": "models", "credentials": {"existingSecret": "s3"}},
    }
}


def _write(tmp_path: Path, overrides: dict[str, Any]) -> Path:
    path = tmp_path / "override.yaml"
    path.write_text(json.dumps(overrides))  # JSON is YAML
    return path


def _refused(
    tmp_path: Path, overrides: dict[str, Any], major: int = 4, extra: tuple[str, ...] = ()
) -> str:
    with pytest.raises(HelmError) as err:
        render(BASE, _write(tmp_path, overrides), major=major, extra=extra)
    return str(err.value)


KEDA: dict[str, Any] = {"keda": {"serverAddress": "http://prometheus.monitoring.svc:9090"}}
MONITORING_NS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}}

# (overrides on top of the baseline scenario, words the error must contain)
BAD_VALUES: dict[str, tuple[dict[str, Any], list[str]]] = {
    "tp-zero": ({"tensorParallelSize": 0}, ["tensorParallelSize"]),
    "tp-negative": ({"tensorParallelSize": -2}, ["tensorParallelSize"]),
    "tp-not-integer": ({"tensorParallelSize": 1.5}, ["tensorParallelSize"]),
    "tp-string": ({"tensorParallelSize": "two"}, ["tensorParallelSize"]),
    # The TP under either name: parallelism.tensor or its older name tensorParallelSize (helm 4
    # names both, helm 3 the branch it matched best).
    "sharded-without-tp": (
        {"tensorParallelSize": None, "loading": {"mode": "shardedState"}},
        ["set parallelism.tensor: the sharded loading modes"],
    ),
    "s3-sharded-without-tp": (
        {"tensorParallelSize": None, "loading": {**S3["loading"], "mode": "runaiStreamerSharded"}},
        ["set parallelism.tensor"],
    ),
    "s3-without-bucket": (
        {"loading": {"mode": "runaiStreamer", "s3": {"credentials": {"existingSecret": "s3"}}}},
        ["set loading.s3.bucket"],
    ),
    "unknown-loading-mode": ({"loading": {"mode": "nfs"}}, ["mode"]),
    "unknown-rollout-mode": ({"rollout": {"mode": "blueGreen"}}, ["mode"]),
    "seed-archive-s3-in-a-local-mode": (
        {"persistence": {"compileCache": {"seedArchive": "s3://models/cc.tar"}}},
        ["seedArchive"],
    ),
    "seed-archive-path-in-an-s3-mode": (
        {**S3, "persistence": {"compileCache": {"seedArchive": "/models/cc.tar"}}},
        ["seedArchive"],
    ),
    "seed-archive-relative-path": (
        {"persistence": {"compileCache": {"seedArchive": "cc.tar"}}},
        ["seedArchive"],
    ),
    "unknown-multiproc-method": (
        {"vllm": {"workerMultiprocMethod": "forkserver"}},
        ["workerMultiprocMethod"],
    ),
    "unknown-accelerator": ({"accelerator": {"type": "tpu"}}, ["type"]),
    "typo-top-level-key": ({"tensorParalelSize": 2}, ["tensorParalelSize"]),
    "typo-nested-key": ({"loading": {"s3": {"buckett": "x"}}}, ["buckett"]),
    "zero-model-size": ({"model": {"sizeGiB": 0}}, ["sizeGiB"]),
    "empty-model-name": ({"model": {"name": ""}}, ["name"]),
    "model-hash-too-short": ({"model": {"hash": "fc5ee47"}}, ["hash"]),
    "model-hash-not-hex": ({"model": {"hash": "FC5EE47005FCD675"}}, ["hash"]),
    "zero-startup-period": ({"probes": {"startup": {"periodSeconds": 0}}}, ["periodSeconds"]),
    "bad-endpoint": (
        {
            **S3,
            "loading": {**S3["loading"], "s3": {**S3["loading"]["s3"], "endpoint": "minio:9000"}},
        },
        ["endpoint"],
    ),
    # Fleet scale.
    "rollout-both-zero": ({"rollout": {"maxSurge": 0, "maxUnavailable": 0}}, ["maxUnavailable"]),
    "rollout-surge-zero-with-surge-preset": ({"rollout": {"maxSurge": "0%"}}, ["maxSurge"]),
    "rollout-unavailable-zero-with-inplace-preset": (
        {"rollout": {"mode": "inPlace", "maxUnavailable": 0}},
        ["maxUnavailable"],
    ),
    "rollout-percent-above-100": ({"rollout": {"maxSurge": "150%"}}, ["maxSurge"]),
    "rollout-not-a-percent": ({"rollout": {"maxUnavailable": "one"}}, ["maxUnavailable"]),
    "rollout-negative": ({"rollout": {"maxUnavailable": -1}}, ["maxUnavailable"]),
    "pdb-percent-zero": ({"podDisruptionBudget": {"maxUnavailable": "0%"}}, ["maxUnavailable"]),
    "pdb-percent-above-100": (
        {"podDisruptionBudget": {"maxUnavailable": "101%"}},
        ["maxUnavailable"],
    ),
    "digest-not-sha256": ({"image": {"digest": "md5:" + "a" * 32}}, ["digest"]),
    "digest-too-short": ({"image": {"digest": "sha256:" + "a" * 63}}, ["digest"]),
    "digest-upper-case": ({"image": {"digest": "sha256:" + "A" * 64}}, ["digest"]),
    "sidecar-digest-with-tag": (
        {"sidecar": {"image": {"digest": "v1@sha256:" + "a" * 64}}},
        ["digest"],
    ),
    "autoscaling-min-above-max": (
        {"autoscaling": {"minReplicas": 5, "maxReplicas": 2}},
        ["autoscaling.minReplicas (5) must not exceed autoscaling.maxReplicas (2)"],
    ),
    "autoscaling-unknown-engine": (
        {"autoscaling": {"enabled": True, "engine": "vpa", **KEDA}},
        ["engine"],
    ),
    "keda-without-prometheus": ({"autoscaling": {"enabled": True}}, ["serverAddress"]),
    "scale-to-zero-without-wake-trigger": (
        {"autoscaling": {"enabled": True, "minReplicas": 0, **KEDA}},
        ["extraTriggers"],
    ),
    "scale-to-zero-with-hpa": (
        {"autoscaling": {"enabled": True, "engine": "hpa", "minReplicas": 0}},
        ["engine"],
    ),
    "kv-cache-target-above-1": (
        {"autoscaling": {"target": {"kvCacheUsage": 90}}},
        ["kvCacheUsage"],
    ),
    "scale-down-window-shorter-than-a-cold-start": (
        {"autoscaling": {"enabled": True, "scaleDown": {"stabilizationWindowSeconds": 60}, **KEDA}},
        ["autoscaling.scaleDown.stabilizationWindowSeconds=60 is too short", ">= 400"],
    ),
    "scale-down-window-above-hpa-limit": (
        {"autoscaling": {"enabled": True, **KEDA}, "model": {"sizeGiB": 200}},
        ["exceeds the HPA's limit of 3600 s"],
    ),
    "gateway-without-endpoint-picker": ({"gateway": {"enabled": True}}, ["serviceName"]),
    "http-route-without-gateway": (
        {
            "gateway": {
                "endpointPicker": {"serviceName": "epp"},
                "httpRoute": {"enabled": True, "parentRefs": [{"name": "gw"}]},
            }
        },
        ["gateway", "enabled"],
    ),
    "http-route-without-parent": (
        {
            "gateway": {
                "enabled": True,
                "endpointPicker": {"serviceName": "epp"},
                "httpRoute": {"enabled": True},
            }
        },
        ["parentRefs"],
    ),
    "network-policy-hiding-the-scraped-ports": (
        {
            # The default metricsFrom (namespace `monitoring`) emptied by hand.
            "networkPolicy": {"enabled": True, "sidecarFrom": [MONITORING_NS], "metricsFrom": []},
            "monitoring": {"serviceMonitor": {"enabled": True}},
        },
        ["metricsFrom"],
    ),
    "extra-container-without-image": ({"extraContainers": [{"name": "proxy"}]}, ["image"]),
    "extra-volume-without-name": ({"extraVolumes": [{"emptyDir": {}}]}, ["name"]),
    "workload-identity-shard-job-without-account": (
        {
            "tensorParallelSize": 2,
            "loading": {**S3["loading"], "mode": "runaiStreamerSharded", "s3": {"bucket": "m"}},
        },
        ["serviceAccountName"],
    ),
    # Template `fail`s (templates/_budgets.tpl): rules JSON Schema cannot state, with what to set.
    "grace-too-short": (
        {"terminationGracePeriodSeconds": 30},
        ["terminationGracePeriodSeconds=30 is too short", ">= 105"],
    ),
    "grace-too-short-for-longer-drain": (
        {"terminationGracePeriodSeconds": 105, "sidecar": {"drainTimeoutSeconds": 120}},
        ["terminationGracePeriodSeconds >= 165"],
    ),
    "drain-minimum-above-timeout": (
        {"sidecar": {"drainMinSeconds": 90}},
        ["sidecar.drainMinSeconds (90) must not exceed"],
    ),
    "zero-drain-timeout": ({"sidecar": {"drainTimeoutSeconds": 0}}, ["drainTimeoutSeconds"]),
    # Values without a default and flags the chart sets: the message names what to set (helm
    # prints no schema description, so each rule's text is the name of a required property).
    "api-key-without-secret": (
        {"apiKey": {"existingSecret": ""}},
        ["set apiKey.existingSecret: the name of the Secret holding the API key"],
    ),
    "local-without-volume": (
        {"loading": {"local": {"existingClaim": ""}}},
        ["set loading.local.existingClaim", "or loading.local.hostPath"],
    ),
    "managed-flag-in-extra-args": (
        {"vllm": {"extraArgs": ["--tensor-parallel-size=2"]}},
        ["remove --tensor-parallel-size / -tp from vllm.extraArgs and set parallelism.tensor"],
    ),
    "managed-short-flag-in-extra-args": (
        {"vllm": {"extraArgs": ["-tp", "2"]}},
        ["and set parallelism.tensor instead"],
    ),
    "managed-load-format-in-extra-args": (
        {"vllm": {"extraArgs": ["--load-format", "dummy"]}},
        ["remove --load-format from vllm.extraArgs and set loading.mode instead"],
    ),
    "managed-port-in-extra-args": (
        {"vllm": {"extraArgs": ["--port=9000"]}},
        ["remove --host / --port from vllm.extraArgs", "0.0.0.0:8000"],
    ),
    "tp-not-dividing-the-heads": (
        {"tensorParallelSize": None, "parallelism": {"tensor": 3}, "model": {"attentionHeads": 16}},
        ["parallelism.tensor=3 does not divide model.attentionHeads=16", "one of 1, 2, 4, 8, 16"],
    ),
    "gpu-limit-set-by-hand": (
        {"vllm": {"resources": {"limits": {"nvidia.com/gpu": 2}}}},
        ["do not set vllm.resources.limits.nvidia.com/gpu"],
    ),
    "both-monitors": (
        {"monitoring": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}},
        ["monitoring", "podMonitor", "enabled"],
    ),
    "both-ca-sources": (
        {
            **S3,
            "loading": {
                **S3["loading"],
                "s3": {
                    **S3["loading"]["s3"],
                    "caBundle": {"configMapName": "a", "secretName": "b"},
                },
            },
        },
        ["caBundle", "secretName"],
    ),
}


@pytest.mark.parametrize("major", [4, 3], ids=["helm4", "helm3"])
@pytest.mark.parametrize(("overrides", "words"), BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_bad_values_are_refused(
    tmp_path: Path, overrides: dict, words: list[str], major: int
) -> None:
    message = _refused(tmp_path, overrides, major)
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("major", [4, 3], ids=["helm4", "helm3"])
def test_first_lint_names_the_values_to_set(major: int) -> None:
    """The bare chart, as a newcomer lints it first: both values without a default named,
    with what they are, in helm's own output."""
    proc = run_helm(["lint", str(CHART)], major)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "set apiKey.existingSecret: the name of the Secret holding the API key" in out, out
    assert "set loading.local.existingClaim (the PersistentVolumeClaim holding the model)" in out


def test_extra_args_that_the_chart_does_not_manage_pass(tmp_path: Path) -> None:
    """The schema's managed-flag patterns match whole flags only."""
    args = ["--model-impl", "vllm", "--port-range=1", "--enable-prefix-caching", "-tpx"]
    out = render(BASE, _write(tmp_path, {"vllm": {"extraArgs": args}}))
    container = out.one("Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][-len(args) :] == args


def test_good_overrides_render(tmp_path: Path) -> None:
    """The negative cases above fail for their own reason, not because the base is broken."""
    ok = render(
        BASE,
        _write(
            tmp_path,
            {
                "terminationGracePeriodSeconds": 105,
                "vllm": {"extraArgs": ["--enable-prefix-caching"]},
                "model": {"attentionHeads": 16},  # TP 1 divides it
            },
        ),
    )
    assert ok.one("Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 105


@pytest.mark.parametrize("method", ["fork", "spawn", None], ids=["fork", "spawn", "default"])
def test_worker_multiproc_method_reaches_vllm_and_its_workers(
    tmp_path: Path, method: str | None
) -> None:
    """`vllm.workerMultiprocMethod` is vLLM's `VLLM_WORKER_MULTIPROC_METHOD`, fork by default
    (docs/benchmarks.md, run 9), in the vLLM container of a one-node pod and in every
    engine container of a multi-node group."""
    overrides: dict[str, Any] = {"vllm": {"workerMultiprocMethod": method}} if method else {}
    for scenario in (BASE, CHART / "ci" / "multinode-2x8-values.yaml"):
        out = render(scenario, _write(tmp_path, overrides))
        roles = ["leader", "worker"] if out.workload()["kind"] == "LeaderWorkerSet" else ["leader"]
        engines = [
            c
            for role in roles
            for c in out.pod_template(role)["spec"]["containers"]
            if c["name"] != "sidecar"
        ]
        assert len(engines) == len(roles), scenario
        for container in engines:
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            assert env["VLLM_WORKER_MULTIPROC_METHOD"] == (method or "fork"), container["name"]


def test_new_dashboard_and_rule_files_are_picked_up(tmp_path: Path) -> None:
    """Dashboards and rule groups are globbed: dropping a file in is enough."""
    chart = tmp_path / "ministream"
    shutil.copytree(CHART, chart)
    (chart / "dashboards" / "ministream-extra.json").write_text(json.dumps({"title": "Extra"}))
    (chart / "rules" / "extra.yaml").write_text(
        "- name: extra\n  rules:\n    - record: ministream:extra\n"
        '      expr: sum(up{ {{- include "ministream.promSelector" . -}} })\n'
    )
    out = render(
        BASE,
        _write(
            tmp_path,
            {"monitoring": {"dashboards": {"enabled": True}, "prometheusRule": {"enabled": True}}},
        ),
        chart=chart,
    )
    data = out.one("ConfigMap")["data"]
    shipped = {p.name for p in (CHART / "dashboards").glob("*.json")}
    # ... but the router's, which only a release with router.enabled ships.
    assert set(data) == shipped - {"ministream-router.json"} | {"ministream-extra.json"}
    groups = {g["name"]: g for g in out.one("PrometheusRule")["spec"]["groups"]}
    assert "extra" in groups and 'namespace="serving"' in groups["extra"]["rules"][0]["expr"]
