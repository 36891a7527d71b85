"""Hostile and corrupt inputs to the plugin's parsers: each is refused with an error
that says what is wrong, before anything large is read or allocated, and leaves nothing behind.

Also here, kept where it was: a pickle checkpoint that needs code to load is refused
(tests/plugins/test_convert.py::test_pickle_needing_code_is_refused). The truncated shard set
on S3 is in tests/loading/test_hostile_shard_sets.py (it needs the moto S3 server).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ministream.config import MiniStreamConfig
from ministream.convert import convert
from ministream.errors import CheckpointError, ShardError
from ministream.manifest import MANIFEST_NAME, Manifest, model_hash, verify_dir
from ministream.shardset import ShardSetInfo, read_local_header
from ministream.train_config import TrainConfig
from tests.support.models import ModelFactory

# Peak Python allocation allowed while refusing: far below anything the hostile file claims.
ALLOC_BUDGET = 16 * 1024 * 1024


def _safetensors(path: Path, header: dict[str, Any], data: bytes, claim: int | None = None) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if claim is None else claim) + raw + data)
    return path


def _refused_within_budget(fn: Any, error: type[Exception], match: str) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(error, match=match):
            fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < ALLOC_BUDGET, f"refusing allocated {peak} bytes"


# ------------------------------------------------------------------ safetensors headers


@pytest.mark.parametrize("claim", [2**63, 2**40, 100_000_001])
def test_safetensors_header_claiming_a_huge_length(tmp_path: Path, claim: int) -> None:
    f = _safetensors(tmp_path / "x.safetensors", {}, b"", claim=claim)
    _refused_within_budget(lambda: read_local_header(f), ShardError, "header claims")


def test_safetensors_header_longer_than_the_file(tmp_path: Path) -> None:
    f = _safetensors(tmp_path / "x.safetensors", {}, b"", claim=50_000_000)
    _refused_within_budget(lambda: read_local_header(f), ShardError, "truncated")


def test_safetensors_overlapping_offsets(tmp_path: Path) -> None:
    header = {
        "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]},
    }
    f = _safetensors(tmp_path / "x.safetensors", header, bytes(24))
    with pytest.raises(ShardError, match="tensors 'a' and 'b' overlap"):
        read_local_header(f)


def test_safetensors_offsets_past_the_end(tmp_path: Path) -> None:
    header = {"a": {"dtype": "F32", "shape": [2**20], "data_offsets": [0, 4 * 2**20]}}
    f = _safetensors(tmp_path / "x.safetensors", header, bytes(16))
    with pytest.raises(ShardError, match="ends at byte 4194304 of a 16-byte data section"):
        read_local_header(f)


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        ({"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}, "needs 16 bytes"),
        ({"dtype": "F32", "shape": [4], "data_offsets": [16, 0]}, "invalid entry"),
        ({"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}, "invalid entry"),
        ({"dtype": "F32", "shape": [4]}, "invalid entry"),
        ("not a dict", "invalid entry"),
    ],
)
def test_safetensors_inconsistent_entries(tmp_path: Path, entry: Any, match: str) -> None:
    f = _safetensors(tmp_path / "x.safetensors", {"a": entry}, bytes(16))
    with pytest.raises(ShardError, match=match):
        read_local_header(f)


def test_safetensors_header_not_json(tmp_path: Path) -> None:
    f = tmp_path / "x.safetensors"
    f.write_bytes(struct.pack("<Q", 4) + b"\xff{[(" + bytes(8))
    with pytest.raises(ShardError, match="not valid JSON"):
        read_local_header(f)


def test_a_real_safetensors_file_still_passes(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(3, 5), "b": torch.ones(7, dtype=torch.bfloat16)}, tmp_path / "o")
    header = read_local_header(tmp_path / "o")
    assert set(header) >= {"a", "b"}


# ------------------------------------------------------------------ absurd config sizes


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("vocab_size", 10**12, "vocab_size=1000000000000 is above the limit"),
        ("num_hidden_layers", 10**6, "num_hidden_layers=1000000 is above the limit"),
        ("hidden_size", 2**31, "hidden_size=2147483648 is above the limit"),
        ("max_position_embeddings", 10**12, "max_position_embeddings="),
        ("intermediate_size", -1, "intermediate_size must be a positive integer"),
    ],
)
def test_config_json_with_absurd_sizes_is_refused_when_read(
    tmp_path: Path, field: str, value: int, match: str
) -> None:
    """config.json as vLLM reads it (AutoConfig → MiniStreamConfig): refused at parse time,
    long before a layer is built, and without allocating anything of that size."""
    from transformers import AutoConfig

    from ministream.config import register_auto_config

    register_auto_config()
    cfg = MiniStreamConfig(vocab_size=512, hidden_size=128, num_attention_heads=4).to_dict()
    cfg[field] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    _refused_within_budget(
        lambda: AutoConfig.from_pretrained(tmp_path), ValueError, f"invalid MiniStream.*{match}"
    )


def test_config_whose_product_is_absurd() -> None:
    with pytest.raises(ValueError, match="parameters, above the limit"):
        MiniStreamConfig(
            vocab_size=1 << 22,
            hidden_size=1 << 16,
            intermediate_size=1 << 20,
            num_hidden_layers=1 << 10,
            num_attention_heads=1 << 6,
            head_dim=1 << 10,
        )


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        ({"vocab_size": 10**12}, "vocab_size=1000000000000 is above the limit"),
        ({"n_layers": 10**6}, "n_layers=1000000 is above the limit"),
    ],
)
def test_train_config_with_absurd_sizes_fails_clean(
    models: ModelFactory, tmp_path: Path, edit: dict[str, int], match: str
) -> None:
    raw = tmp_path / "raw"
    shutil.copytree(models.raw("tiny"), raw)
    cfg = json.loads((raw / "train_config.json").read_text())
    (raw / "train_config.json").write_text(json.dumps({**cfg, **edit}))
    out = tmp_path / "out"

    def run() -> None:
        convert(raw / "model.pt", raw / "train_config.json", raw / "tokenizer", out, progress=False)

    _refused_within_budget(run, CheckpointError, match)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw"]
    with pytest.raises(CheckpointError, match=match):
        TrainConfig.load(raw / "train_config.json")


# ------------------------------------------------------------------ paths outside the model


OUTSIDE_NAMES = ["../../etc/passwd", "/etc/passwd", "a/../../x", "..\\x", "C:x", "", "a//b"]


@pytest.mark.parametrize("name", OUTSIDE_NAMES)
def test_manifest_naming_a_path_outside_is_refused(name: str) -> None:
    files = {name: {"sha256": "0" * 64, "size": 1}}
    text = json.dumps(
        {
            "files": files,
            "source": {},
            "converter_version": "x",
            "dtype": "float32",
            "model_hash": model_hash(files),
        }
    )
    with pytest.raises(CheckpointError, match="outside the model directory"):
        Manifest.parse(text, "m.json")


def test_verify_never_reads_the_outside_file(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    model = tmp_path / "model"
    model.mkdir()
    files = {"../secret.txt": {"sha256": "0" * 64, "size": secret.stat().st_size}}
    manifest = {"files": files, "source": {}, "converter_version": "x", "dtype": "float32"}
    (model / MANIFEST_NAME).write_text(json.dumps({**manifest, "model_hash": model_hash(files)}))
    atime = secret.stat().st_atime_ns
    with pytest.raises(CheckpointError, match=r"'\.\./secret\.txt'"):
        verify_dir(model)
    assert secret.stat().st_atime_ns == atime


@pytest.mark.parametrize("name", OUTSIDE_NAMES[:3])
def test_shard_set_naming_a_path_outside_is_refused(name: str) -> None:
    info = ShardSetInfo(
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        source_model_hash="a" * 64,
        source="/m",
        config_sha256="0" * 64,
        dtype="float32",
        vllm_version="x",
        ministream_version="x",
        files={name: {"rank": 0, "size": 1, "sha256": "0" * 64}},
    )
    with pytest.raises(ShardError, match="outside the shard directory"):
        ShardSetInfo.parse(info.to_json(), "shards.json")


def _tokenizer_copy(models: ModelFactory, tmp_path: Path) -> Path:
    raw = tmp_path / "raw"
    shutil.copytree(models.raw("tiny"), raw)
    return raw


def test_tokenizer_file_linking_outside_fails_clean(models: ModelFactory, tmp_path: Path) -> None:
    raw = _tokenizer_copy(models, tmp_path)
    outside = tmp_path / "host-secret.json"
    shutil.copy(raw / "tokenizer" / "tokenizer.json", outside)
    (raw / "tokenizer" / "tokenizer.json").unlink()
    (raw / "tokenizer" / "tokenizer.json").symlink_to(outside)
    out = tmp_path / "out"
    with pytest.raises(CheckpointError, match=r"tokenizer\.json links outside"):
        convert(raw / "model.pt", raw / "train_config.json", raw / "tokenizer", out, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["host-secret.json", "raw"]


@pytest.mark.parametrize("value", ["/etc/passwd", "../../tokenizer.json"])
def test_tokenizer_config_naming_a_path_outside_fails_clean(
    models: ModelFactory, tmp_path: Path, value: str
) -> None:
    raw = _tokenizer_copy(models, tmp_path)
    tok_cfg = raw / "tokenizer" / "tokenizer_config.json"
    current = json.loads(tok_cfg.read_text()) if tok_cfg.exists() else {}
    tok_cfg.write_text(json.dumps({**current, "tokenizer_file": value}))
    out = tmp_path / "out"
    with pytest.raises(CheckpointError, match=r"tokenizer_file=.* outside the model"):
        convert(raw / "model.pt", raw / "train_config.json", raw / "tokenizer", out, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw"]


# ------------------------------------------------------------------ ENOSPC


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 512 KiB tmpfs (the tiny model in float32 needs ~1.8 MB), unmounted after."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


@pytest.mark.root("mount -t tmpfs: a real small filesystem that runs out of space")
def test_enospc_while_converting_leaves_nothing(models: ModelFactory, small_tmpfs: Path) -> None:
    raw = models.raw("tiny")
    out = small_tmpfs / "model"
    with pytest.raises(CheckpointError, match="no space left on the device") as info:
        convert(
            raw / "model.pt",
            raw / "train_config.json",
            raw / "tokenizer",
            out,
            max_shard_size="200KB",
            progress=False,
        )
    assert info.value.__cause__ is not None  # the original error stays chained
    assert list(small_tmpfs.iterdir()) == [], "partial output left behind"
    assert os.statvfs(small_tmpfs).f_bfree == os.statvfs(small_tmpfs).f_blocks


@pytest.mark.engine
@pytest.mark.root("mount -t tmpfs: a real small filesystem that runs out of space")
def test_enospc_while_sharding_leaves_nothing(models: ModelFactory, small_tmpfs: Path) -> None:
    """The rank process runs out of space writing its shard: one clear error, no partial set."""
    from ministream.shard import shard

    out = small_tmpfs / "shards"
    with pytest.raises(
        ShardError, match=r"no space left on the device of .* while sharding"
    ) as info:
        shard(str(models.converted("tiny", "float32")), 1, str(out), progress=False)
    assert "was left as it was" in str(info.value)
    assert list(small_tmpfs.iterdir()) == [], "partial output left behind"
    assert os.statvfs(small_tmpfs).f_bfree == os.statvfs(small_tmpfs).f_blocks
