"""vLLM's batch limit and CUDA-graph capture sizes as the chart renders them on GPU targets:
`--max-num-seqs` from vllm.maxNumSeqs and `--cudagraph-capture-sizes` from the chart's rule
(vllm.cudaGraphs.captureSizes `sparse`), vLLM's own sizes (`vllm`) or a list. CPU targets keep
the CPU build's own defaults."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from chartkit import CHART, HelmError, render, scenario_values

GPU = CHART / "ci" / "local-tp1-values.yaml"
CPU = CHART / "ci" / "cpu-local-tp1-values.yaml"
MULTI = CHART / "ci" / "multinode-2x8-values.yaml"
SEQS = "--max-num-seqs"
SIZES = "--cudagraph-capture-sizes"


def vllm_args(*files: Path, **sets: Any) -> list[str]:
    args: list[str] = next(
        c
        for c in render(*files, **sets).pod_template()["spec"]["containers"]
        if c["name"] == "vllm"
    )["args"]
    return args


def flag_values(args: list[str], flag: str) -> list[str] | None:
    """The values after `flag` up to the next flag; None when the flag is absent."""
    if flag not in args:
        return None
    assert args.count(flag) == 1
    rest = args[args.index(flag) + 1 :]
    end = next((i for i, a in enumerate(rest) if a.startswith("-")), len(rest))
    return rest[:end]


def sparse_rule(n: int) -> list[int]:
    """The documented rule: powers of two up to n, 1.5x each power from 16 on (when <= n), n."""
    sizes: set[int] = {n}
    power = 1
    while power <= n:
        sizes.add(power)
        if power >= 16 and power * 3 // 2 <= n:
            sizes.add(power * 3 // 2)
        power *= 2
    return sorted(sizes)


@pytest.mark.parametrize("seqs", [None, 1, 3, 16, 24, 100, 255, 512, 1000, 4096])
def test_sparse_sizes_follow_max_num_seqs(seqs: int | None) -> None:
    sets = {} if seqs is None else {"vllm__maxNumSeqs": seqs}
    n = seqs if seqs is not None else scenario_values(GPU)["vllm"]["maxNumSeqs"]
    args = vllm_args(GPU, **sets)
    assert flag_values(args, SEQS) == [str(n)]
    assert flag_values(args, SIZES) == [str(s) for s in sparse_rule(n)]


@pytest.mark.parametrize("seqs", [2, 17, 100, 256, 1000])
def test_every_batch_has_a_graph_and_pads_by_less_than_half_above_16(seqs: int) -> None:
    """What the rule is for, checked on the rendered sizes: every decode batch up to
    max-num-seqs replays a graph, and above 16 requests its padding stays under half of it."""
    sizes = [int(s) for s in flag_values(vllm_args(GPU, vllm__maxNumSeqs=seqs), SIZES) or []]
    assert sizes == sorted(set(sizes)) and max(sizes) == seqs
    for batch in range(1, seqs + 1):
        graph = min(s for s in sizes if s >= batch)
        if batch > 16:
            assert graph - batch < batch / 2, (batch, graph)


def test_the_default_is_sparse_and_far_below_vllms_own_count() -> None:
    values = scenario_values(GPU)["vllm"]
    assert values["cudaGraphs"]["captureSizes"] == "sparse"
    n = values["maxNumSeqs"]
    sizes = flag_values(vllm_args(GPU), SIZES) or []
    # vLLM's own sizes here: 1, 2, 4, multiples of 8 below 256, of 16 up to 2n (at most 512).
    top = min(2 * n, 512)
    vllm_own = {1, 2, 4, *range(8, min(top + 1, 256), 8), *range(256, top + 1, 16)}
    assert len(sizes) * 3 < len(vllm_own)


def test_vllm_keeps_its_own_sizes() -> None:
    args = vllm_args(GPU, vllm__cudaGraphs__captureSizes="vllm")
    assert flag_values(args, SIZES) is None
    assert flag_values(args, SEQS) == [str(scenario_values(GPU)["vllm"]["maxNumSeqs"])]


def test_a_list_is_rendered_as_given() -> None:
    args = vllm_args(GPU, vllm__cudaGraphs__captureSizes=[64, 8, 1])
    assert flag_values(args, SIZES) == ["64", "8", "1"]


def test_cpu_target_keeps_the_cpu_builds_defaults() -> None:
    # vLLM's CPU build captures no graphs (it accepts the sizes and empties the list), and its
    # own max-num-seqs default stays; extraArgs may still set one there.
    args = vllm_args(CPU, vllm__maxNumSeqs=64, vllm__cudaGraphs__captureSizes=[8])
    assert flag_values(args, SEQS) is None
    assert flag_values(args, SIZES) is None
    assert f"{SEQS}=64" in vllm_args(CPU, vllm__extraArgs=[f"{SEQS}=64"])


def test_multinode_leader_gets_the_same_sizes() -> None:
    args = vllm_args(MULTI, vllm__maxNumSeqs=48)
    assert flag_values(args, SIZES) == [str(s) for s in sparse_rule(48)]


def test_the_installed_vllm_knows_both_flags() -> None:
    """The flags as vLLM's engine arguments spell them (read from source: importing vLLM takes
    seconds). vLLM 0.25.1, on the GPU host, parses the same flags (docs/benchmarks.md)."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    source = (Path(spec.origin).parent / "engine" / "arg_utils.py").read_text()
    assert f'"{SIZES}"' in source and "max_num_seqs" in source


@pytest.mark.parametrize(
    ("sets", "words"),
    [
        ({"vllm__extraArgs": [f"{SEQS}=64"]}, ["extraArgs"]),
        ({"vllm__extraArgs": [SIZES, "1", "2"]}, ["extraArgs"]),
        ({"vllm__maxNumSeqs": 0}, ["maxNumSeqs"]),
        ({"vllm__cudaGraphs__captureSizes": "dense"}, ["captureSizes"]),
        ({"vllm__cudaGraphs__captureSizes": []}, ["captureSizes"]),
        ({"vllm__cudaGraphs__captureSizes": [0, 8]}, ["captureSizes"]),
        ({"vllm__cudaGraphs__captureSizes": [8, 8]}, ["captureSizes"]),
    ],
    ids=[
        "seqs-in-extra-args",
        "sizes-in-extra-args",
        "zero-seqs",
        "unknown-word",
        "empty-list",
        "zero-size",
        "repeated-size",
    ],
)
def test_bad_values_are_refused(sets: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(HelmError) as err:
        render(GPU, **sets)
    for word in words:
        assert word in str(err.value)
