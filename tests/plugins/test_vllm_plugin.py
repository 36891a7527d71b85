"""The plugin inside the real vLLM engine (CPU build): registration, numerics, TP, coverage.

Each engine run is a subprocess (`tests/support/golden_runs.py`), because `vllm.LLM`
needs a `__main__` guard and a fresh process per configuration; a configuration that two
tests need runs once (`GoldenRuns`). Numerics are compared with `compare` (vLLM's
check_logprobs_close semantics) against the reference model run in float32 on the same
converted weights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from safetensors.torch import load_file, save_file

from ministream.manifest import MANIFEST_NAME
from ministream_reference.golden import (
    DEFAULT_PROMPTS,
    Completion,
    as_llama,
    compare,
    load,
    reference_completions,
)
from ministream_testkit.vllm_server import VLLMServer
from tests.conftest import TINY_SERVED_NAME
from tests.support.golden_runs import MAX_TOKENS, run_golden
from tests.support.models import ModelFactory

PROMPTS = [list(p) for p in DEFAULT_PROMPTS]
# float32: vLLM's CPU kernels and the reference agree to ~1e-5 here; bfloat16 activations
# round at every layer (~3 significant digits), so logprobs drift by a few hundredths.
ATOL = {"float32": 2e-3, "bfloat16": 0.15}
# In bfloat16 two candidates can tie exactly (seen: tokens 479 and 136 both at -1.898 for
# tiny-mha-untied, 0.024 apart in float32), so bfloat16 uses check_logprobs_close's rule:
# a divergence is allowed where each token is in the other's top-5, and comparison stops.
IDENTICAL = {"float32": True, "bfloat16": False}


class GoldenRuns:
    """`run_golden` results, one run per configuration and module.

    The float32 TP=1 run of `tiny` serves the golden test and the TP=2 comparison, that of
    `tiny-headdim` the golden test and the Llama oracle: the same engine run, made once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.outputs: dict[tuple[Path, int, str], Path] = {}

    def __call__(self, model: Path, *, tp: int = 1, dtype: str = "float32") -> list[Completion]:
        key = (model, tp, dtype)
        if key not in self.outputs:
            out = self.root / f"run-{len(self.outputs)}.json"
            run_golden(model, out, tp=tp, dtype=dtype)
            self.outputs[key] = out
        return load(self.outputs[key])


@pytest.fixture(scope="module")
def golden_runs(tmp_path_factory: pytest.TempPathFactory) -> GoldenRuns:
    return GoldenRuns(tmp_path_factory.mktemp("golden-runs"))


def test_registered_in_a_fresh_process(tmp_path: Path) -> None:  # imports vLLM; no engine
    """Registered once per process, and inspected without a subprocess.

    A lazily registered class is inspected in a new Python process (vLLM's registry,
    `_run_in_subprocess`) whenever VLLM_CACHE_ROOT holds no model info for it: seconds of
    every start with an empty cache volume. Here that function raises, on an empty cache.
    """
    code = (
        "from vllm.plugins import load_general_plugins\n"
        "load_general_plugins(); load_general_plugins()\n"
        "from vllm import ModelRegistry\n"
        "from vllm.model_executor.models import registry\n"
        "from transformers import AutoConfig\n"
        "def no_subprocess(fn): raise AssertionError('inspected in a subprocess')\n"
        "registry._run_in_subprocess = no_subprocess\n"
        "assert 'MiniStreamForCausalLM' in ModelRegistry.get_supported_archs()\n"
        "info = ModelRegistry.models['MiniStreamForCausalLM'].inspect_model_cls()\n"
        "assert info.is_text_generation_model and info.supports_pp, info\n"
        "print(type(AutoConfig.for_model('ministream')).__name__)\n"
    )
    env = os.environ | {"VLLM_CACHE_ROOT": str(tmp_path / "empty-cache")}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("MiniStreamConfig")


def test_quantized_load_maps_kv_cache_scale_names() -> None:
    """The plugin's quantized-load path on this vLLM: the quant config's mapper renames
    checkpoint KV-scale names (the old per-name `get_cache_scale` call failed
    every `--quantization fp8` load on vLLM 0.25 and 0.32)."""
    from types import SimpleNamespace

    import torch
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    from ministream.model import MiniStreamForCausalLM

    owner = SimpleNamespace(quant_config=Fp8Config())
    weights = [
        ("model.layers.0.self_attn.k_proj.k_scale", torch.ones(1)),
        ("model.layers.0.mlp.down_proj.weight", torch.zeros(2, 2)),
    ]
    names = [n for n, _ in MiniStreamForCausalLM._map_cache_scales(owner, iter(weights))]  # type: ignore[arg-type]
    assert names == ["model.layers.0.self_attn.attn.k_scale", "model.layers.0.mlp.down_proj.weight"]

    # A vLLM with only the old per-name method still works.
    legacy = SimpleNamespace(
        quant_config=SimpleNamespace(
            get_cache_scale=lambda n: n + ".renamed" if "scale" in n else None
        )
    )
    names = [n for n, _ in MiniStreamForCausalLM._map_cache_scales(legacy, iter(weights))]  # type: ignore[arg-type]
    assert names[0].endswith(".renamed") and names[1] == weights[1][0]


@pytest.mark.engine
@pytest.mark.network
def test_served_through_the_openai_api_server(
    vllm_server: VLLMServer, tiny_model_dir: Path
) -> None:
    models = httpx.get(f"{vllm_server.url}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [TINY_SERVED_NAME]
    expected = reference_completions(tiny_model_dir, PROMPTS[:1], MAX_TOKENS)[0]
    reply = httpx.post(
        f"{vllm_server.url}/v1/completions",
        timeout=60,
        json={
            "model": TINY_SERVED_NAME,
            "prompt": PROMPTS[0],
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
        },
    ).json()
    tokens = [int(t.split(":")[1]) for t in reply["choices"][0]["logprobs"]["tokens"]]
    assert tokens == expected.tokens


@pytest.mark.engine
def test_dummy_weights_initialise(models: ModelFactory, tmp_path: Path) -> None:
    run_golden(models.converted("tiny"), tmp_path / "dummy.json", load_format="dummy")
    assert all(len(c.tokens) > 0 for c in load(tmp_path / "dummy.json"))


@pytest.mark.engine
@pytest.mark.parametrize(
    ("preset", "dtype"),
    [
        ("tiny", "float32"),
        ("tiny", "bfloat16"),
        ("tiny-mha-untied", "float32"),
        ("tiny-headdim", "float32"),
    ],
)
def test_golden_numerics_against_reference(
    models: ModelFactory, golden_runs: GoldenRuns, preset: str, dtype: str
) -> None:
    """GQA+tied, MHA+untied, head_dim != d_model/n_heads in float32, where the reference and
    vLLM agree to ~1e-5; the bfloat16 weight and activation path once, on the GQA+tied shape
    (the kernels do not depend on the shape; each engine run costs a minute of CI)."""
    model_dir = models.converted(preset, dtype)
    actual = golden_runs(model_dir, dtype=dtype)
    expected = reference_completions(model_dir, PROMPTS, MAX_TOKENS)
    assert compare(expected, actual, atol=ATOL[dtype], require_identical=IDENTICAL[dtype]) == []
    assert any(len(set(c.tokens)) > 2 for c in actual), "degenerate outputs prove little"


@pytest.mark.engine
@pytest.mark.parametrize("preset", ["tiny", "tiny-kv1"])
def test_tensor_parallel_2_matches_tp1(
    models: ModelFactory, golden_runs: GoldenRuns, preset: str
) -> None:
    """tiny: 2 KV heads split over 2 ranks; tiny-kv1: 1 KV head replicated on both.

    tiny's TP=1 run is the golden test's own; tiny-kv1 has no other TP=1 run, so its TP=2
    run is held to the reference model instead (what the TP=1 run is held to, token for
    token and within ATOL), which costs no second engine start."""
    model_dir = models.converted(preset, "float32")
    tp2 = golden_runs(model_dir, tp=2)
    if preset == "tiny":
        tp1 = golden_runs(model_dir, tp=1)
        assert [c.tokens for c in tp2] == [c.tokens for c in tp1]
    else:
        tp1 = reference_completions(model_dir, PROMPTS, MAX_TOKENS)
    assert compare(tp1, tp2, atol=ATOL["float32"]) == []


@pytest.mark.engine
def test_builtin_llama_oracle_gives_the_same_tokens(
    models: ModelFactory, golden_runs: GoldenRuns, tmp_path: Path
) -> None:
    """Independent oracle: the same weights served by vLLM's own LlamaForCausalLM."""
    model_dir = models.converted("tiny-headdim", "float32")
    llama_dir = as_llama(model_dir, tmp_path / "as-llama")
    plugin, llama = golden_runs(model_dir), golden_runs(llama_dir)
    assert [c.tokens for c in plugin] == [c.tokens for c in llama]
    assert compare(llama, plugin, atol=ATOL["float32"]) == []


def _rewrite_weights(model_dir: Path, dst: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """Copy a converted dir with its single shard's tensors edited (index kept in sync).

    The manifest is removed, as in a directory edited by hand or written by another tool:
    with it, the plugin's pre-load guard would refuse the changed file sizes before any
    weight is read, and this test is about the last line of defence, `load_weights`.
    """
    import shutil

    shutil.copytree(model_dir, dst)
    (dst / MANIFEST_NAME).unlink()
    index_path = dst / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    (shard,) = set(index["weight_map"].values())
    tensors = load_file(str(dst / shard))
    edit(tensors)
    save_file(tensors, str(dst / shard), metadata={"format": "pt"})
    index["weight_map"] = dict.fromkeys(tensors, shard)
    index_path.write_text(json.dumps(index))
    return dst


def _break(t: dict[str, Any]) -> None:
    """Two missing weights (a plain linear one and one shard of the stacked q/k/v) and one
    tensor the model does not have: the one error names both kinds."""
    t.pop("model.layers.1.mlp.down_proj.weight")
    t.pop("model.layers.0.self_attn.k_proj.weight")
    t["model.layers.0.self_attn.extra.weight"] = t["model.norm.weight"].clone()


@pytest.mark.engine
def test_incomplete_checkpoint_fails_at_load(models: ModelFactory, tmp_path: Path) -> None:
    """vLLM 0.32 alone would serve uninitialised memory for a missing linear weight."""
    broken = _rewrite_weights(models.converted("tiny", "float32"), tmp_path / "broken", _break)
    proc = run_golden(broken, tmp_path / "out.json", check=False)
    assert proc.returncode != 0
    for message in (
        "checkpoint has 1 tensor(s) that MiniStream does not have: "
        "model.layers.0.self_attn.extra.weight. Re-convert it",
        "checkpoint is missing 2 weight(s): model.layers.0.self_attn.qkv_proj.weight, "
        "model.layers.1.mlp.down_proj.weight. The model directory is incomplete",
    ):
        assert message in proc.stdout + proc.stderr
    assert not (tmp_path / "out.json").exists()
