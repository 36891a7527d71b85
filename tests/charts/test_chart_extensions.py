"""Extension points users would otherwise fork the chart for: extra volumes, mounts,
init and extra containers, envFrom, pod annotations on every workload, an image pinned by
digest, and S3 through the pod's workload identity instead of a key Secret. Each renders where
it must and passes kubernetes-validate's strict schemas on every supported version."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from chartkit import CHART, KUBE_VERSIONS, Rendered, render

BASE = CHART / "ci" / "local-tp1-values.yaml"
SHARDED_JOB = CHART / "ci" / "sharded-state-tp2-job-values.yaml"
DIGEST = "sha256:" + "0123456789abcdef" * 4
ROLE = {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/models-read"}
EXTENSIONS: dict[str, Any] = {
    "extraVolumes": [{"name": "lora", "persistentVolumeClaim": {"claimName": "adapters"}}],
    "extraVolumeMounts": [{"name": "lora", "mountPath": "/adapters", "readOnly": True}],
    "initContainers": [
        {
            "name": "fetch-adapters",
            "image": "registry.example/fetch:1",
            "args": ["--to", "/adapters"],
            "volumeMounts": [{"name": "lora", "mountPath": "/adapters"}],
        }
    ],
    "extraContainers": [
        {
            "name": "log-shipper",
            "image": "registry.example/shipper:2",
            "resources": {"requests": {"cpu": "10m"}},
        }
    ],
    "envFrom": [{"configMapRef": {"name": "vllm-tuning"}}, {"secretRef": {"name": "hf-token"}}],
    "podAnnotations": {"example.com/team": "llm"},
}


def write(tmp_path: Path, overrides: dict[str, Any], name: str = "o.yaml") -> Path:
    """A values file; one name per content (chartkit caches renders by file name)."""
    path = tmp_path / name
    assert not path.exists(), f"{path} written twice: the render cache would return the first"
    path.write_text(json.dumps(overrides))  # JSON is YAML
    return path


def validate_all(rendered: Rendered) -> None:
    """Built-in kinds (the monitors are checked against their CRDs in test_chart_scenarios)."""
    for version in KUBE_VERSIONS:
        for doc in rendered.docs:
            if doc["apiVersion"] != "monitoring.coreos.com/v1":
                kubernetes_validate.validate(doc, version, strict=True)


def env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def test_extension_points_land_where_they_belong(tmp_path: Path) -> None:
    out = render(SHARDED_JOB, write(tmp_path, EXTENSIONS))
    validate_all(out)
    spec = out.one("Deployment")["spec"]["template"]["spec"]
    assert spec["volumes"][-1] == EXTENSIONS["extraVolumes"][0]
    init = [c["name"] for c in spec["initContainers"]]
    # User init containers run before the sidecar starts (it is a native sidecar).
    assert init.index("fetch-adapters") < init.index("sidecar")
    main = spec["containers"]
    assert [c["name"] for c in main] == ["vllm", "log-shipper"]
    assert main[0]["volumeMounts"][-1] == EXTENSIONS["extraVolumeMounts"][0]
    assert main[0]["envFrom"] == EXTENSIONS["envFrom"]
    assert main[1] == EXTENSIONS["extraContainers"][0]


def test_pod_annotations_on_every_workload(tmp_path: Path) -> None:
    out = render(SHARDED_JOB, write(tmp_path, {"podAnnotations": {"example.com/team": "llm"}}))
    templates = [
        out.one("Deployment")["spec"]["template"]["metadata"],
        out.one("Job")["spec"]["template"]["metadata"],
        out.one("Pod")["metadata"],
    ]
    for metadata in templates:
        assert metadata["annotations"]["example.com/team"] == "llm", metadata
    # The test pod keeps its hook annotations.
    assert out.one("Pod")["metadata"]["annotations"]["helm.sh/hook"] == "test"


def test_image_digest_pins_every_image(tmp_path: Path) -> None:
    over = {"image": {"digest": DIGEST, "tag": "ignored"}, "sidecar": {"image": {"digest": DIGEST}}}
    out = render(SHARDED_JOB, write(tmp_path, over))
    validate_all(out)
    spec = out.one("Deployment")["spec"]["template"]["spec"]
    images = {c["name"]: c["image"] for c in spec["containers"] + spec["initContainers"]}
    assert images["vllm"] == f"ghcr.io/ministream/ministream-serving@{DIGEST}"
    assert images["sidecar"] == f"ghcr.io/ministream/ministream-sidecar@{DIGEST}"
    job_image = out.one("Job")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert job_image == images["vllm"]
    assert out.one("Pod")["spec"]["containers"][0]["image"] == images["sidecar"]
    cpu = render(SHARDED_JOB, write(tmp_path, {**over, "accelerator": {"type": "cpu"}}, "c.yaml"))
    cpu_vllm = cpu.one("Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert cpu_vllm == f"ghcr.io/ministream/ministream-serving-cpu@{DIGEST}"


def test_no_digest_means_the_tag() -> None:
    spec = render(BASE).one("Deployment")["spec"]["template"]["spec"]
    assert spec["containers"][0]["image"] == "ghcr.io/ministream/ministream-serving:0.1.0"


S3_IDENTITY: dict[str, Any] = {
    "loading": {"mode": "runaiStreamer", "s3": {"bucket": "models", "region": "eu-west-1"}},
    "serviceAccount": {"annotations": ROLE},
}


@pytest.mark.parametrize("major", [4, 3], ids=["helm4", "helm3"])
def test_s3_without_secret_uses_the_workload_identity(tmp_path: Path, major: int) -> None:
    out = render(BASE, write(tmp_path, S3_IDENTITY), major=major)
    validate_all(out)
    assert out.one("ServiceAccount")["metadata"]["annotations"] == ROLE
    spec = out.one("Deployment")["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == out.one("ServiceAccount")["metadata"]["name"]
    e = env(spec["containers"][0])
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} & set(e)
    # Instance metadata stays reachable: GKE Workload Identity and EC2 roles answer there.
    assert "AWS_EC2_METADATA_DISABLED" not in e
    assert e["RUNAI_STREAMER_NO_BOTO3_SESSION"]["value"] == "0"
    assert e["AWS_REGION"]["value"] == "eu-west-1"


def test_static_keys_still_work_and_disable_metadata(tmp_path: Path) -> None:
    keys = {
        "loading": {
            **S3_IDENTITY["loading"],
            "s3": {"bucket": "m", "credentials": {"existingSecret": "s3-keys"}},
        }
    }
    e = env(
        render(BASE, write(tmp_path, keys)).one("Deployment")["spec"]["template"]["spec"][
            "containers"
        ][0]
    )
    assert e["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"] == "s3-keys"
    assert e["AWS_EC2_METADATA_DISABLED"]["value"] == "true"
    assert "RUNAI_STREAMER_NO_BOTO3_SESSION" not in e


def test_shard_job_runs_as_the_named_account_for_workload_identity(tmp_path: Path) -> None:
    over = {
        "tensorParallelSize": 2,
        "loading": {
            "mode": "runaiStreamerSharded",
            "s3": {"bucket": "models"},
            "sharded": {"prepare": {"mode": "job", "serviceAccountName": "model-shard"}},
        },
    }
    out = render(BASE, write(tmp_path, over))
    validate_all(out)
    job = out.one("Job")["spec"]["template"]["spec"]
    assert job["serviceAccountName"] == "model-shard"
    assert "AWS_ACCESS_KEY_ID" not in env(job["containers"][0])
