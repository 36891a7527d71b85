"""`ministream convert`: layout, accounting, atomicity and bad input (no vLLM needed)."""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from ministream.checkpoint import load_raw_state_dict
from ministream.convert import convert, parse_size
from ministream.demo import convert_argv
from ministream.errors import CheckpointError
from ministream.manifest import MANIFEST_NAME, verify_dir
from ministream.names import hf_shapes
from ministream.train_config import TrainConfig
from tests.support.models import ModelFactory


def _tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    out: dict[str, torch.Tensor] = {}
    for name in sorted(set(index["weight_map"].values())):
        with safe_open(str(model_dir / name), "pt") as fh:
            for key in fh.keys():  # noqa: SIM118 - safe_open is not a mapping
                assert index["weight_map"][key] == name
                out[key] = fh.get_tensor(key)
    return out


@pytest.mark.parametrize("preset", ["tiny", "tiny-mha-untied", "tiny-headdim"])
def test_every_tensor_lands_with_split_rows(models: ModelFactory, preset: str) -> None:
    raw_dir = models.raw(preset)
    cfg = TrainConfig.load(raw_dir / "train_config.json")
    raw = load_raw_state_dict(raw_dir / "model.pt")
    out = _tensors(models.converted(preset, "float32"))

    assert {k: tuple(v.shape) for k, v in out.items()} == hf_shapes(cfg)
    q = cfg.n_heads * cfg.head_dim
    kv = cfg.n_kv_heads * cfg.head_dim
    wqkv = raw["blocks.1.attn.Wqkv.weight"]
    assert torch.equal(out["model.layers.1.self_attn.q_proj.weight"], wqkv[:q])
    assert torch.equal(out["model.layers.1.self_attn.k_proj.weight"], wqkv[q : q + kv])
    assert torch.equal(out["model.layers.1.self_attn.v_proj.weight"], wqkv[q + kv :])
    w12 = raw["blocks.0.mlp.w12.weight"]
    assert torch.equal(out["model.layers.0.mlp.gate_proj.weight"], w12[: cfg.d_ff])
    assert torch.equal(out["model.layers.0.mlp.up_proj.weight"], w12[cfg.d_ff :])
    assert torch.equal(out["model.norm.weight"], raw["norm_f.weight"])
    assert ("lm_head.weight" in out) == (not cfg.tie_embeddings)


def test_directory_contract(models: ModelFactory) -> None:
    model_dir = models.converted("tiny", "float32")
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["MiniStreamForCausalLM"]
    assert config["model_type"] == "ministream"
    assert config["torch_dtype"] == "float32"
    for field in (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
        "rms_norm_eps",
        "rope_theta",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
    ):
        assert field in config, field
    for name in (
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        MANIFEST_NAME,
    ):
        assert (model_dir / name).is_file(), name
    manifest = verify_dir(model_dir)
    assert set(manifest.files) == {p.name for p in model_dir.iterdir()} - {MANIFEST_NAME}
    raw = models.raw("tiny")
    from ministream.manifest import sha256_file

    assert manifest.source["checkpoint_sha256"] == sha256_file(raw / "model.pt")


def test_sharding_bf16_and_reconversion_is_deterministic(
    models: ModelFactory, tmp_path: Path
) -> None:
    raw = models.raw("tiny")
    args = (raw / "model.pt", raw / "train_config.json", raw / "tokenizer")
    a = convert(*args, tmp_path / "a", dtype="bfloat16", max_shard_size="200KB", progress=False)
    b = convert(*args, tmp_path / "b", dtype="bfloat16", max_shard_size="200KB", progress=False)
    assert a.num_shards > 1
    assert a.manifest.model_hash == b.manifest.model_hash
    sizes = [
        (tmp_path / "a" / f).stat().st_size for f in a.manifest.files if f.endswith(".safetensors")
    ]
    assert max(sizes) < 200_000 + 100_000  # one tensor may overflow a shard by itself
    assert all(t.dtype == torch.bfloat16 for t in _tensors(tmp_path / "a").values())


def test_parse_size() -> None:
    assert parse_size("2GB") == 2_000_000_000
    assert parse_size("500MiB") == 500 * 2**20
    assert parse_size("1024") == 1024
    with pytest.raises(ValueError, match="cannot parse size"):
        parse_size("lots")


# --- bad input: a clear error naming the problem, and nothing left behind --------------


def _mutated_checkpoint(models: ModelFactory, tmp_path: Path, mutate) -> Path:
    src = models.raw("tiny")
    dst = tmp_path / "raw"
    shutil.copytree(src, dst)
    state = load_raw_state_dict(src / "model.pt")
    state = {k: v.clone() for k, v in state.items()}
    mutate(state, dst)
    torch.save({"model": state}, dst / "model.pt")
    return dst


def _assert_fails_clean(raw: Path, out: Path, match: str) -> None:
    before = set(out.parent.iterdir())
    with pytest.raises(CheckpointError, match=match):
        convert(raw / "model.pt", raw / "train_config.json", raw / "tokenizer", out, progress=False)
    assert not out.exists()
    assert set(out.parent.iterdir()) == before, "temp files left behind"


@pytest.mark.parametrize(
    ("mutation", "match"),
    [
        (lambda s, d: s.pop("blocks.1.mlp.w3.weight"), r"missing tensors: blocks\.1\.mlp\.w3"),
        (
            lambda s, d: s.__setitem__("blocks.0.extra.weight", torch.zeros(3)),
            r"unexpected tensors: blocks\.0\.extra\.weight",
        ),
        (
            lambda s, d: s.__setitem__("blocks.0.attn.Wqkv.weight", torch.zeros(10, 128)),
            r"blocks\.0\.attn\.Wqkv\.weight has shape \(10, 128\), config implies \(256, 128\)",
        ),
        (
            lambda s, d: s.__setitem__("lm_head.weight", torch.zeros(512, 128)),
            r"lm_head\.weight with tie_embeddings=true",
        ),
    ],
)
def test_bad_tensors(models: ModelFactory, tmp_path: Path, mutation, match: str) -> None:
    raw = _mutated_checkpoint(models, tmp_path, mutation)
    _assert_fails_clean(raw, tmp_path / "out", match)


def test_config_contradicting_weights(models: ModelFactory, tmp_path: Path) -> None:
    def mutate(state: dict, raw_dir: Path) -> None:
        cfg = json.loads((raw_dir / "train_config.json").read_text())
        cfg["n_kv_heads"] = 4  # the checkpoint was trained with 2
        (raw_dir / "train_config.json").write_text(json.dumps(cfg))

    raw = _mutated_checkpoint(models, tmp_path, mutate)
    _assert_fails_clean(
        raw,
        tmp_path / "out",
        r"Wqkv\.weight has shape \(256, 128\), "
        r"config implies \(384, 128\)",
    )


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        ({"n_kv_heads": 3}, r"n_kv_heads \(3\) must divide n_heads \(4\)"),
        ({"d_model": -1}, "d_model must be a positive integer"),
        ({"eos_id": 99999}, r"eos_id must be a token id in \[0, vocab_size\)"),
        ({"dropout": 0.1}, "unknown fields: dropout"),
    ],
)
def test_invalid_train_config(models: ModelFactory, tmp_path: Path, edit: dict, match: str) -> None:
    def mutate(state: dict, raw_dir: Path) -> None:
        cfg = json.loads((raw_dir / "train_config.json").read_text())
        cfg.update(edit)
        (raw_dir / "train_config.json").write_text(json.dumps(cfg))

    raw = _mutated_checkpoint(models, tmp_path, mutate)
    _assert_fails_clean(raw, tmp_path / "out", match)


def test_truncated_checkpoint(models: ModelFactory, tmp_path: Path) -> None:
    raw = _mutated_checkpoint(models, tmp_path, lambda s, d: None)
    data = (raw / "model.pt").read_bytes()
    (raw / "model.pt").write_bytes(data[: len(data) // 2])
    _assert_fails_clean(raw, tmp_path / "out", "not a readable torch checkpoint")


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_pickle_needing_code_is_refused(models: ModelFactory, tmp_path: Path) -> None:
    raw = _mutated_checkpoint(models, tmp_path, lambda s, d: None)
    # clone: the loaded tensors are memory-mapped from the file we are about to overwrite
    state = {k: v.clone() for k, v in load_raw_state_dict(raw / "model.pt").items()}
    torch.save(
        {"model": state, "hook": _Evil()}, raw / "model.pt", pickle_protocol=pickle.DEFAULT_PROTOCOL
    )
    _assert_fails_clean(raw, tmp_path / "out", "needs arbitrary code to unpickle")


def _zip_of(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "content",
    [os.urandom(4096), b"hello, I am a text file\n", _zip_of({"notes.txt": b"not a model"})],
    ids=["random-bytes", "text", "other-zip"],
)
def test_a_file_that_is_not_a_torch_checkpoint_says_so(
    models: ModelFactory, tmp_path: Path, content: bytes
) -> None:
    raw = _mutated_checkpoint(models, tmp_path, lambda s, d: None)
    # A first byte of 0x80 would read as a pickle: keep the random case what it means to be.
    (raw / "model.pt").write_bytes(content if content[:1] != b"\x80" else b"x" + content)
    with pytest.raises(CheckpointError) as err:
        convert(raw / "model.pt", raw / "train_config.json", raw / "tokenizer", tmp_path / "o")
    message = str(err.value)
    assert "model.pt is not a torch checkpoint: torch.save writes a zip archive" in message
    assert "--checkpoint takes a torch.save file" in message
    assert "arbitrary code" not in message and "weights_only=False" not in message


def test_existing_output_is_kept_without_force(models: ModelFactory, tmp_path: Path) -> None:
    raw = models.raw("tiny")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    with pytest.raises(FileExistsError, match="--force"):
        convert(raw / "model.pt", raw / "train_config.json", raw / "tokenizer", out, progress=False)
    assert (out / "keep.txt").read_text() == "precious"


def test_interrupted_conversion_leaves_nothing(models: ModelFactory, tmp_path: Path) -> None:
    raw = models.raw("tiny")
    out = tmp_path / "out"
    seen = []

    def boom(_slice) -> None:
        seen.append(_slice)
        if len(seen) == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert(
            raw / "model.pt",
            raw / "train_config.json",
            raw / "tokenizer",
            out,
            progress=False,
            on_tensor=boom,
        )
    assert list(tmp_path.iterdir()) == []


def test_cli_reports_errors_without_traceback(models: ModelFactory, tmp_path: Path) -> None:
    raw = _mutated_checkpoint(models, tmp_path, lambda s, d: s.pop("blocks.0.norm1.weight"))
    proc = subprocess.run(
        [sys.executable, "-m", "ministream.cli", *convert_argv(raw, tmp_path / "out")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert (
        "error: checkpoint does not match train_config.json: missing tensors: "
        "blocks.0.norm1.weight" in proc.stderr
    )
    assert "Traceback" not in proc.stderr
