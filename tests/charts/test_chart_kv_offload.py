"""KV-cache offload to host memory (vllm.kvOffload.sizeGiB): vLLM's native connector flags, the
pod's memory request and limit grown by its ranks' share of the tier, and what is refused."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from chartkit import CHART, HelmError, Rendered, render, scenario_values

GPU = CHART / "ci" / "local-tp1-values.yaml"
MULTINODE = CHART / "ci" / "multinode-2x8-values.yaml"
CPU = CHART / "ci" / "cpu-local-tp1-values.yaml"
UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9}


def mib(quantity: str) -> int:
    """A memory quantity in MiB, rounded up (an independent reading of the chart's rule)."""
    for suffix, factor in sorted(UNITS.items(), key=lambda kv: -len(kv[0])):
        if quantity.endswith(suffix):
            return math.ceil(float(quantity.removesuffix(suffix)) * factor / 2**20)
    return math.ceil(float(quantity) / 2**20)


def engine_containers(out: Rendered) -> list[dict[str, Any]]:
    """The vLLM container, and a multi-node group's Ray worker container."""
    found = [
        c
        for role in ("leader", "worker")
        if role == "leader" or out.of_kind("LeaderWorkerSet")
        for c in out.pod_template(role)["spec"]["containers"]
        if c["name"] in ("vllm", "ray-worker")
    ]
    assert found
    return found


def test_offload_adds_the_native_connector_flags_and_the_tier_to_the_pod_memory() -> None:
    values = scenario_values(GPU)
    out = render(GPU, vllm__kvOffload__sizeGiB=24)
    (vllm,) = engine_containers(out)
    args = vllm["args"]
    i = args.index("--kv-offloading-size")
    assert args[i + 1] == "24"
    assert args[args.index("--kv-offloading-backend") + 1] == "native"
    resources = values["vllm"]["resources"]
    for side in ("requests", "limits"):
        want = mib(resources[side]["memory"]) + 24 * 1024
        assert vllm["resources"][side]["memory"] == f"{want}Mi", side


def test_off_by_default_leaves_flags_and_memory_alone() -> None:
    values = scenario_values(GPU)
    assert values["vllm"]["kvOffload"]["sizeGiB"] is None
    (vllm,) = engine_containers(render(GPU))
    assert not any(a.startswith("--kv-offloading") for a in vllm["args"])
    for side in ("requests", "limits"):
        assert vllm["resources"][side]["memory"] == values["vllm"]["resources"][side]["memory"]


def test_a_multi_node_pod_holds_its_ranks_share_of_the_tier() -> None:
    values = scenario_values(MULTINODE)
    par = values["parallelism"]
    world = par["tensor"] * par.get("pipeline", 1)
    per_pod = values["accelerator"]["perNode"]
    assert world > per_pod  # the scenario spans nodes
    out = render(MULTINODE, vllm__kvOffload__sizeGiB=20, vllm__resources__requests__memory="1.5G")
    share = math.ceil(20 * 1024 * per_pod / world)
    for container in engine_containers(out):
        assert container["resources"]["requests"]["memory"] == f"{mib('1.5G') + share}Mi"
        limit = values["vllm"]["resources"]["limits"]["memory"]
        assert container["resources"]["limits"]["memory"] == f"{mib(limit) + share}Mi"


def test_an_unset_memory_limit_stays_unset() -> None:
    out = render(GPU, vllm__kvOffload__sizeGiB=8, vllm__resources__limits=None)
    (vllm,) = engine_containers(out)
    assert "memory" not in vllm["resources"].get("limits", {})
    assert vllm["resources"]["requests"]["memory"].endswith("Mi")


@pytest.mark.parametrize(
    ("files", "sets", "words"),
    [
        (CPU, {"vllm__kvOffload__sizeGiB": 8}, ["CPU build has no KV offloading"]),
        (
            GPU,
            {"vllm__kvOffload__sizeGiB": 8, "vllm__resources__limits__memory": "lots"},
            ["vllm.resources.limits.memory", "not a memory quantity"],
        ),
        (GPU, {"vllm__kvOffload__sizeGiB": 0}, ["sizeGiB"]),
        (GPU, {"vllm__extraArgs": ["--kv-offloading-size=8"]}, ["extraArgs"]),
    ],
    ids=["cpu-build", "bad-quantity", "zero-size", "flag-in-extra-args"],
)
def test_bad_offload_values_are_refused(
    files: Path, sets: dict[str, Any], words: list[str]
) -> None:
    with pytest.raises(HelmError) as err:
        render(files, **sets)
    for word in words:
        assert word in str(err.value)
