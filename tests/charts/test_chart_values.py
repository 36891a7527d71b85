"""Bad values are refused, by the schema or by a template `fail`, with a message that names
what to set; the values table of the README is generated from values.yaml and up to date."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from chartkit import CHART, ROOT, HelmError, render

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


# (overrides on top of the baseline scenario, words the error must contain)
BAD_VALUES: dict[str, tuple[dict[str, Any], list[str]]] = {
    "tp-zero": ({"tensorParallelSize": 0}, ["tensorParallelSize"]),
    "tp-negative": ({"tensorParallelSize": -2}, ["tensorParallelSize"]),
    "tp-not-integer": ({"tensorParallelSize": 1.5}, ["tensorParallelSize"]),
    "tp-string": ({"tensorParallelSize": "two"}, ["tensorParallelSize"]),
    "sharded-without-tp": (
        {"tensorParallelSize": None, "loading": {"mode": "shardedState"}},
        ["tensorParallelSize"],
    ),
    "s3-sharded-without-tp": (
        {"tensorParallelSize": None, "loading": {**S3["loading"], "mode": "runaiStreamerSharded"}},
        ["tensorParallelSize"],
    ),
    "s3-without-bucket": (
        {"loading": {"mode": "runaiStreamer", "s3": {"credentials": {"existingSecret": "s3"}}}},
        ["bucket"],
    ),
    "s3-without-secret": (
        {"loading": {"mode": "runaiStreamer", "s3": {"bucket": "models"}}},
        ["existingSecret"],
    ),
    "unknown-loading-mode": ({"loading": {"mode": "nfs"}}, ["mode"]),
    "unknown-rollout-mode": ({"rollout": {"mode": "blueGreen"}}, ["mode"]),
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
    # Template `fail`s: rules the schema cannot express, with what to set.
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
    "api-key-without-secret": (
        {"apiKey": {"existingSecret": ""}},
        ["apiKey.existingSecret is required"],
    ),
    "local-without-volume": (
        {"loading": {"local": {"existingClaim": ""}}},
        ["loading.local.existingClaim", "loading.local.hostPath"],
    ),
    "managed-flag-in-extra-args": (
        {"vllm": {"extraArgs": ["--tensor-parallel-size=2"]}},
        ["must not set --tensor-parallel-size", "tensorParallelSize"],
    ),
    "managed-load-format-in-extra-args": (
        {"vllm": {"extraArgs": ["--load-format", "dummy"]}},
        ["must not set --load-format"],
    ),
    "gpu-limit-set-by-hand": (
        {"vllm": {"resources": {"limits": {"nvidia.com/gpu": 2}}}},
        ["do not set vllm.resources.limits.nvidia.com/gpu"],
    ),
    "both-monitors": (
        {"monitoring": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}},
        ["enable only one"],
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
        ["only one of loading.s3.caBundle"],
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


# The template repeats the essential checks so that they hold even when a user skips the
# schema (`--skip-schema-validation`), and says in plain words what to set.
TEMPLATE_GUARDS: dict[str, tuple[dict[str, Any], str]] = {
    "tp-zero": ({"tensorParallelSize": 0}, "tensorParallelSize must be an integer >= 1"),
    "tp-not-integer": ({"tensorParallelSize": 2.5}, "tensorParallelSize must be an integer >= 1"),
    "sharded-without-tp": (
        {"tensorParallelSize": None, "loading": {"mode": "shardedState"}},
        "set tensorParallelSize (the TP the shards are made for)",
    ),
    "s3-without-bucket": (
        {"loading": {"mode": "runaiStreamer", "s3": {"credentials": {"existingSecret": "s3"}}}},
        "set loading.s3.bucket",
    ),
    "s3-without-secret": (
        {"loading": {"mode": "runaiStreamer", "s3": {"bucket": "models"}}},
        "set loading.s3.credentials.existingSecret",
    ),
    "unknown-loading-mode": ({"loading": {"mode": "nfs"}}, "loading.mode must be one of"),
    "unknown-rollout-mode": (
        {"rollout": {"mode": "blueGreen"}},
        "rollout.mode must be surge or inPlace",
    ),
}


@pytest.mark.parametrize(
    ("overrides", "message"), TEMPLATE_GUARDS.values(), ids=TEMPLATE_GUARDS.keys()
)
def test_template_guards_without_schema(tmp_path: Path, overrides: dict, message: str) -> None:
    assert message in _refused(tmp_path, overrides, extra=("--skip-schema-validation",))


def test_good_overrides_render(tmp_path: Path) -> None:
    """The negative cases above fail for their own reason, not because the base is broken."""
    ok = render(
        BASE,
        _write(
            tmp_path,
            {
                "terminationGracePeriodSeconds": 105,
                "vllm": {"extraArgs": ["--enable-prefix-caching"]},
            },
        ),
    )
    assert ok.one("Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 105


# ---------------------------------------------------------------- docs


def test_readme_values_table_is_up_to_date() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "chart_docs.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr


def test_docs_check_catches_an_undocumented_value(tmp_path: Path) -> None:
    chart = tmp_path / "ministream"
    shutil.copytree(CHART, chart)
    values = chart / "values.yaml"
    values.write_text(values.read_text() + "\nundocumentedKnob: 3\n")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "chart_docs.py"), "--check", "--chart", str(chart)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and "undocumentedKnob" in proc.stderr


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
    assert set(data) == shipped | {"ministream-extra.json"}
    groups = {g["name"]: g for g in out.one("PrometheusRule")["spec"]["groups"]}
    assert "extra" in groups and 'namespace="serving"' in groups["extra"]["rules"][0]["expr"]
