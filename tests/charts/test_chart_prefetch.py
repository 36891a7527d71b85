"""sidecar.prefetch: the sidecar reads vLLM's compile cache and model into the page cache while
vLLM imports. The paths are read off the rendered vLLM container (its VLLM_CACHE_ROOT and
--model), never restated; so are the volumes it mounts."""

from __future__ import annotations

import math
from typing import Any

import pytest
from chartkit import CHART, Rendered, render, scenario_values

LOCAL = CHART / "ci" / "cpu-local-tp1-values.yaml"
S3 = CHART / "ci" / "runai-streamer-tp2-values.yaml"
SHARDED = CHART / "ci" / "sharded-state-tp2-job-values.yaml"
ENV = "MINISTREAM_SIDECAR_PREFETCH_PATHS"


def _containers(out: Rendered) -> dict[str, dict[str, Any]]:
    spec = out.pod_template()["spec"]
    return {c["name"]: c for c in spec["initContainers"] + spec["containers"]}


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def _mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in container["volumeMounts"]}


def _mib(quantity: str) -> int:
    assert quantity.endswith("Mi"), quantity
    return int(quantity.removesuffix("Mi"))


@pytest.mark.parametrize("scenario", [LOCAL, SHARDED, S3], ids=lambda p: p.name)
def test_prefetch_reads_what_vllm_reads_from_volumes_it_mounts(scenario: Any) -> None:
    containers = _containers(render(scenario))
    sidecar, vllm = containers["sidecar"], containers["vllm"]
    args = vllm["args"]
    model = args[args.index("--model") + 1]
    cache_root = _env(vllm)["VLLM_CACHE_ROOT"]
    assert _env(sidecar)[ENV].split(",") == [cache_root, model]
    # Every local path lies under a volume the sidecar mounts read-only at vLLM's mount path.
    vllm_mounts, sidecar_mounts = _mounts(vllm), _mounts(sidecar)
    for path in (cache_root, model):
        if "://" in path:
            continue
        [name] = [
            n
            for n, m in vllm_mounts.items()
            if path.startswith(m["mountPath"].rstrip("/") + "/") or path == m["mountPath"]
        ]
        assert sidecar_mounts[name]["mountPath"] == vllm_mounts[name]["mountPath"]
        assert sidecar_mounts[name]["readOnly"] is True
    if "://" in model:  # the Run:ai streamer reads an object store: no model volume at all
        assert "model" not in sidecar_mounts and "model" not in vllm_mounts


def test_memory_limit_makes_room_for_a_local_model() -> None:
    values = scenario_values(LOCAL)
    limit = _containers(render(LOCAL))["sidecar"]["resources"]["limits"]["memory"]
    base = values["sidecar"]["resources"]["limits"]["memory"]
    assert _mib(limit) == _mib(base) + math.ceil(values["model"]["sizeGiB"] * 1024)
    # An object-store model is not read by the sidecar: its limit stays.
    s3 = _containers(render(S3))["sidecar"]["resources"]
    assert s3 == scenario_values(S3)["sidecar"]["resources"]


@pytest.mark.parametrize("scenario", [LOCAL, S3], ids=lambda p: p.name)
def test_off_renders_none_of_it(scenario: Any) -> None:
    on = _containers(render(scenario))["sidecar"]
    off = _containers(render(scenario, sidecar__prefetch__enabled=False))["sidecar"]
    assert ENV not in _env(off)
    assert {"model", "compile-cache"}.isdisjoint(_mounts(off))
    assert off["resources"] == scenario_values(scenario)["sidecar"]["resources"]
    # Nothing else of the sidecar changes.
    strip = {ENV}
    assert [e for e in on["env"] if e["name"] not in strip] == off["env"]
    assert [m for m in on["volumeMounts"] if m["name"] not in {"model", "compile-cache"}] == off[
        "volumeMounts"
    ]
