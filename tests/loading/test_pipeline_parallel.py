"""Pipeline parallelism in the real vLLM engine (CPU build): the plugin's stages, and shard
sets made and served for tensor x pipeline layouts, against the reference model.

vLLM 0.32's CPU runner serves pipeline stages only on the compiled path: with enforce_eager
(or compilation mode NONE, or vLLM's own CPU-CI eager backend) the warm-up run that allocates
the stages' intermediate-tensor buffers is skipped and the second stage's worker dies on
`assert self.intermediate_tensors is not None` (built-in Llama too). So these runs compile
(inductor, ~25 s per start here); the float32 logprobs match the reference like eager ones.

What two cores permit: PP=2 (one rank per core) and TP=2 x PP=2 (four ranks, two per core,
`VLLM_CPU_OMP_THREADS_BIND=0|1|0|1`), both here; nothing larger.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open

from ministream.manifest import Manifest
from ministream.shardset import SHARDS_META_NAME
from ministream_reference.golden import Completion, compare, load, reference_completions
from ministream_testkit.s3_server import S3Server
from tests.loading.conftest import shard, upload_to
from tests.loading.helpers import ATOL, PROMPTS
from tests.support.golden_runs import MAX_TOKENS, run_golden

pytestmark = [pytest.mark.engine, pytest.mark.network, pytest.mark.timeout(3600)]


@pytest.fixture(scope="module")
def expected(model_dir: Path) -> list[Completion]:
    return reference_completions(model_dir, PROMPTS, MAX_TOKENS)


@pytest.fixture(scope="module")
def shards_tp2_pp2(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shards") / "tiny-tp2-pp2"
    return Path(shard(str(model_dir), str(out), tp=2, pp=2))


def test_pp2_matches_the_reference(
    model_dir: Path, expected: list[Completion], tmp_path: Path
) -> None:
    run_golden(model_dir, tmp_path / "pp2.json", pp=2)
    assert compare(expected, load(tmp_path / "pp2.json"), atol=ATOL) == []


def test_a_tp2_pp2_shard_set_holds_each_stage_once(shards_tp2_pp2: Path, model_dir: Path) -> None:
    meta = json.loads((shards_tp2_pp2 / SHARDS_META_NAME).read_text())
    assert (meta["tensor_parallel_size"], meta["pipeline_parallel_size"]) == (2, 2)
    assert meta["source_model_hash"] == Manifest.load(model_dir).model_hash
    names = {(s, r): f"model-pp-{s}-tp-{r}-part-0.safetensors" for s in (0, 1) for r in (0, 1)}
    assert sorted(meta["files"]) == sorted(names.values())
    keys: dict[tuple[int, int], set[str]] = {}
    for (stage, rank), name in names.items():
        assert (meta["files"][name]["pp_rank"], meta["files"][name]["rank"]) == (stage, rank)
        with safe_open(str(shards_tp2_pp2 / name), "pt") as f:
            header = f.metadata()
            assert header["ministream_pp_size"] == header["ministream_tp_size"] == "2"
            assert (header["ministream_pp_rank"], header["ministream_rank"]) == (
                str(stage),
                str(rank),
            )
            keys[stage, rank] = set(f.keys())
    # Both ranks of a stage hold the same tensors (their own slices of them).
    assert keys[0, 0] == keys[0, 1] and keys[1, 0] == keys[1, 1]
    layers = [
        {int(n.split(".")[2]) for n in keys[s, 0] if n.startswith("model.layers.")} for s in (0, 1)
    ]
    # vLLM's make_layers splits the layers between the stages: each layer in exactly one.
    n_layers = json.loads((model_dir / "config.json").read_text())["num_hidden_layers"]
    assert layers[0] and layers[1] and max(layers[0]) < min(layers[1])
    assert layers[0] | layers[1] == set(range(n_layers))
    # The embedding on the first stage, the final norm on the last.
    assert "model.embed_tokens.weight" in keys[0, 0] and "model.norm.weight" not in keys[0, 0]
    assert "model.norm.weight" in keys[1, 0]


def test_a_tp2_pp2_shard_set_serves_the_same_from_s3(
    shards_tp2_pp2: Path,
    expected: list[Completion],
    s3: S3Server,
    s3_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """Uploaded with `ministream upload`, streamed by `runai_streamer_sharded` (the S3 glob of
    each rank's `*model-pp-{s}-tp-{r}-part-*` names). The local `sharded_state` read of the
    same names ran in `ministream shard` itself: each rank reads its files back through vLLM's
    ShardedStateLoader and compares every tensor."""
    url = upload_to(s3, shards_tp2_pp2, "tiny-tp2-pp2")
    out = tmp_path / "sharded-tp2-pp2.json"
    run_golden(url, out, tp=2, pp=2, load_format="runai_streamer_sharded", env=s3_env)
    assert compare(expected, load(out), atol=ATOL) == []


def test_a_tp2_set_at_pp2_is_refused_before_the_engine_starts(
    shards_tp2: Path, tmp_path: Path
) -> None:
    out = tmp_path / "refused.json"
    proc = run_golden(shards_tp2, out, pp=2, load_format="sharded_state", check=False)
    assert proc.returncode != 0
    log = proc.stdout + proc.stderr
    assert (
        f"shard set {shards_tp2} was made for tensor-parallel size 2, but vLLM is starting with "
        "tensor-parallel size 1 x pipeline-parallel size 2. Serve it with "
        "--tensor-parallel-size 2 --pipeline-parallel-size 1, or re-shard"
    ) in log, log[-4000:]
    assert "Worker_PP" not in log  # refused in the config check, before any rank started
    assert not out.exists()
