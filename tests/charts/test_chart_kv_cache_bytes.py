"""vLLM's KV-cache size given by the chart (`--kv-cache-memory-bytes`, which skips vLLM's memory
profiling at start): computed from accelerator.memoryGiB, given as vllm.kvCacheMemoryGiB, or left
to vLLM; and what is refused."""

from __future__ import annotations

import ast
import importlib.util
import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from chartkit import CHART, HelmError, render, scenario_values

GPU = CHART / "ci" / "local-tp1-values.yaml"
CPU = CHART / "ci" / "cpu-local-tp1-values.yaml"
FLAG = "--kv-cache-memory-bytes"


def vllm_default_utilization() -> float:
    """`gpu_memory_utilization`'s default in the installed vLLM, read from its source (importing
    vLLM takes seconds)."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    tree = ast.parse((Path(spec.origin).parent / "config" / "cache.py").read_text())
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == "gpu_memory_utilization"
            and isinstance(node.value, ast.Call)
        ):
            for kw in node.value.keywords:
                if kw.arg == "default":
                    value = ast.literal_eval(kw.value)
                    assert isinstance(value, float)
                    return value
    raise AssertionError("no gpu_memory_utilization default in vllm/config/cache.py")


def kv_flag(**sets: Any) -> str | None:
    """The value of --kv-cache-memory-bytes rendered for the vLLM container, None when absent."""
    files = sets.pop("files", GPU)
    out = render(files, **sets)
    args = next(c for c in out.pod_template()["spec"]["containers"] if c["name"] == "vllm")["args"]
    assert args.count(FLAG) <= 1
    return args[args.index(FLAG) + 1] if FLAG in args else None


def expected_bytes(memory: float, size: float, world: int, reserve: float, util: float) -> int:
    """The documented formula, exact: floor((memoryGiB x U - sizeGiB / world - reserve) x 2^30)."""
    gib = Fraction(str(memory)) * Fraction(str(util))
    gib -= Fraction(str(size)) / world + Fraction(str(reserve))
    return math.floor(gib * 2**30)


@pytest.mark.parametrize(
    ("tensor", "pipeline", "util"),
    [(1, 1, None), (2, 2, None), (4, 1, 0.85)],
    ids=["tp1-vllm-default", "tp2-pp2", "tp4-own-utilization"],
)
def test_bytes_follow_memory_weights_per_rank_and_the_reserve(
    tensor: int, pipeline: int, util: float | None
) -> None:
    memory, size = 139.8, 7.3
    reserve = scenario_values(GPU)["vllm"]["kvCacheReserveGiB"]
    got = kv_flag(
        accelerator__memoryGiB=memory,
        model__sizeGiB=size,
        tensorParallelSize=tensor,
        parallelism__pipeline=pipeline,
        vllm__gpuMemoryUtilization=util,
    )
    u = vllm_default_utilization() if util is None else util
    assert got == str(expected_bytes(memory, size, tensor * pipeline, reserve, u))


def test_the_reserve_is_a_value() -> None:
    memory, size = 80, 3
    got = kv_flag(accelerator__memoryGiB=memory, model__sizeGiB=size, vllm__kvCacheReserveGiB=5.5)
    assert got == str(expected_bytes(memory, size, 1, 5.5, vllm_default_utilization()))


def test_an_explicit_size_wins() -> None:
    got = kv_flag(accelerator__memoryGiB=141, model__sizeGiB=2, vllm__kvCacheMemoryGiB=10.25)
    assert got == str(math.floor(Fraction("10.25") * 2**30))


def test_nothing_by_default_so_vllm_profiles() -> None:
    values = scenario_values(GPU)
    assert values["accelerator"]["memoryGiB"] is None
    assert values["vllm"]["kvCacheMemoryGiB"] is None
    assert kv_flag() is None


def test_cpu_build_ignores_the_device_memory_but_takes_an_explicit_size() -> None:
    # The sidecar sizes the CPU build's KV cache itself (cpu_memory.SIZING_FLAGS).
    assert kv_flag(files=CPU, accelerator__memoryGiB=141) is None
    assert kv_flag(files=CPU, vllm__kvCacheMemoryGiB=2) == str(2 * 2**30)


@pytest.mark.parametrize(
    ("sets", "words"),
    [
        (
            {"accelerator__memoryGiB": 8, "model__sizeGiB": 7},
            ["no room for a KV cache", "accelerator.memoryGiB", "vllm.kvCacheMemoryGiB"],
        ),
        ({"vllm__extraArgs": [f"{FLAG}=1000"]}, ["extraArgs"]),
        ({"vllm__extraArgs": [FLAG, "1000"]}, ["extraArgs"]),
        ({"vllm__kvCacheMemoryGiB": -1}, ["kvCacheMemoryGiB"]),
        ({"vllm__kvCacheMemoryGiB": 0}, ["kvCacheMemoryGiB"]),
        ({"accelerator__memoryGiB": -141}, ["memoryGiB"]),
        ({"vllm__kvCacheReserveGiB": -1}, ["kvCacheReserveGiB"]),
    ],
    ids=[
        "no-room",
        "flag-in-extra-args",
        "flag-in-extra-args-split",
        "negative-size",
        "zero-size",
        "negative-memory",
        "negative-reserve",
    ],
)
def test_bad_values_are_refused(sets: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(HelmError) as err:
        render(GPU, **sets)
    for word in words:
        assert word in str(err.value)
