"""`ministream convert` on checkpoints saved the ways training code saves them.

Each layout is written by its producer (tests/plugins/layout_producers.py: torch.compile,
DDP on a one-process gloo group, a Lightning checkpoint dict, FSDP2 + torch.distributed.
checkpoint on two ranks, safetensors) from the tiny demo weights, then converted. The output
must be byte-identical to the plain `model.pt` conversion (the manifest hashes config,
tokenizer and every shard), so it serves the same greedy tokens by construction; the DCP
conversion is also served by a real vLLM engine and compared with the shared server.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from huggingface_hub import save_torch_state_dict
from safetensors.torch import save_file

from ministream.checkpoint import load_raw_state_dict
from ministream.cli import build_parser
from ministream.convert import convert
from ministream.errors import CheckpointError
from ministream.manifest import Manifest
from ministream.raw_layouts import Layout
from ministream_testkit.vllm_server import VLLMServer
from tests.loading.helpers import PROMPTS, assert_same_tokens, complete, serve
from tests.plugins import layout_producers as produce
from tests.plugins.test_convert import _tensors
from tests.support.models import ModelFactory

REPO = Path(__file__).resolve().parents[2]
State = dict[str, torch.Tensor]


@pytest.fixture(scope="module")
def weights(models: ModelFactory) -> State:
    """The tiny demo's weights (cloned: the loaded ones are memory-mapped)."""
    state = load_raw_state_dict(models.raw("tiny") / "model.pt")
    return {name: tensor.clone() for name, tensor in state.items()}


@pytest.fixture(scope="module")
def plain(models: ModelFactory) -> Path:
    """The plain `model.pt` conversion of the same weights (float32)."""
    return models.converted("tiny", "float32")


def _convert(
    models: ModelFactory, checkpoint: Path, out: Path, layout: Layout | None = None
) -> Path:
    raw = models.raw("tiny")
    convert(
        checkpoint,
        raw / "train_config.json",
        raw / "tokenizer",
        out,
        dtype="float32",
        progress=False,
        layout=layout,
    )
    return out


def _assert_same_model(out: Path, plain: Path) -> None:
    assert Manifest.load(out).files == Manifest.load(plain).files


def _assert_halved(out: Path, plain: Path) -> None:
    """The other weights of the producers' checkpoints (EMA or live) are exactly half."""
    got, want = _tensors(out), _tensors(plain)
    assert got.keys() == want.keys()
    assert all(torch.equal(got[name], want[name] * 0.5) for name in want)


def _run_producer(kind: str, raw: Path, out: Path) -> None:
    """Write a checkpoint as a training job would (tests/plugins/layout_producers.py).

    A failed attempt is retried once, in a fresh directory: the producer stands in for the
    training framework and is not under test: on a busy machine the two-rank gloo producer
    has exited non-zero after both ranks wrote their shards but before `.metadata`. Its
    error text goes into the failure message.
    """
    errors = []
    for _ in range(2):
        shutil.rmtree(out, ignore_errors=True)
        proc = subprocess.run(
            [sys.executable, "-m", "tests.plugins.layout_producers", kind, str(raw), str(out)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode == 0:
            return
        errors.append(f"exit {proc.returncode}: {proc.stderr[-3000:]}")
    pytest.fail(f"the {kind} producer failed twice:\n" + "\n---\n".join(errors))


def _save(obj: object, directory: Path) -> Path:
    torch.save(obj, directory / "model.pt")
    return directory / "model.pt"


def _sharded_safetensors(state: State, directory: Path) -> Path:
    directory.mkdir(exist_ok=True)
    save_torch_state_dict(state, directory, max_shard_size="200KB")
    assert len(list(directory.glob("*.safetensors"))) > 1
    return directory


def _single_safetensors(state: State, directory: Path) -> Path:
    save_file(state, str(directory / "model.safetensors"))
    return directory / "model.safetensors"


# name -> (write the checkpoint into a directory, return the --checkpoint path), format, prefix
LAYOUTS: dict[str, tuple[Callable[[State, Path], Path], str, str]] = {
    "torch.compile": (lambda s, d: _save(produce.compiled_state_dict(s), d), "torch", "_orig_mod."),
    "compiled, under model": (
        lambda s, d: _save({"model": produce.compiled_state_dict(s), "step": 3}, d),
        "torch",
        "model._orig_mod.",
    ),
    "lightning": (
        lambda s, d: _save(produce.lightning_checkpoint(s), d),
        "torch",
        "state_dict.model.",
    ),
    "safetensors file": (_single_safetensors, "safetensors", ""),
    "safetensors index": (
        lambda s, d: _sharded_safetensors(s, d) / "model.safetensors.index.json",
        "safetensors",
        "",
    ),
    "safetensors directory": (_sharded_safetensors, "safetensors", ""),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_converts_to_the_same_model(
    models: ModelFactory, weights: State, plain: Path, tmp_path: Path, layout: str
) -> None:
    write, fmt, prefix = LAYOUTS[layout]
    (tmp_path / "ckpt").mkdir()
    out = _convert(models, write(weights, tmp_path / "ckpt"), tmp_path / "out")
    _assert_same_model(out, plain)
    source = Manifest.load(out).source
    assert (source["checkpoint_format"], source["checkpoint_prefix"]) == (fmt, prefix)


def test_ddp_checkpoint(models: ModelFactory, plain: Path, tmp_path: Path) -> None:
    checkpoint = tmp_path / "ddp.pt"
    _run_producer("ddp", models.raw("tiny") / "model.pt", checkpoint)
    saved = torch.load(checkpoint, weights_only=True)
    assert all(name.startswith("module.") for name in saved["model"])
    out = _convert(models, checkpoint, tmp_path / "out")
    _assert_same_model(out, plain)
    assert Manifest.load(out).source["checkpoint_prefix"] == "model.module."
    bare = _save(saved["model"], tmp_path)  # `torch.save(ddp.state_dict(), path)`
    out = _convert(models, bare, tmp_path / "bare")
    _assert_same_model(out, plain)
    assert Manifest.load(out).source["checkpoint_prefix"] == "module."


# --- torch.distributed.checkpoint (FSDP2, two ranks) -----------------------------------


@pytest.fixture(scope="module")
def dcp_dir(models: ModelFactory, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dcp") / "step-1"
    _run_producer("fsdp2-dcp", models.raw("tiny") / "model.pt", out)
    return out


@pytest.fixture(scope="module")
def dcp_model(
    models: ModelFactory, dcp_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    return _convert(models, dcp_dir, tmp_path_factory.mktemp("dcp-model") / "model")


def test_dcp_checkpoint_is_sharded(dcp_dir: Path) -> None:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    assert sorted(p.name for p in dcp_dir.iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    chunks = {
        fqn: len(item.chunks)
        for fqn, item in FileSystemReader(dcp_dir).read_metadata().state_dict_metadata.items()
        if isinstance(item, TensorStorageMetadata)
    }
    assert chunks["model.embedding.weight"] == 2  # each rank wrote half of it
    assert any(fqn.startswith("optimizer.state.") for fqn in chunks)


def test_dcp_converts_to_the_same_model(dcp_model: Path, dcp_dir: Path, plain: Path) -> None:
    _assert_same_model(dcp_model, plain)
    source = Manifest.load(dcp_model).source
    assert (source["checkpoint_format"], source["checkpoint_prefix"]) == ("dcp", "model.")
    # The documented directory hash: sha256 of `sha256sum`'s listing of the sorted files.
    listing = subprocess.run(
        "find . -type f -printf '%P\\n' | LC_ALL=C sort | xargs -d '\\n' sha256sum | sha256sum",
        shell=True,
        cwd=dcp_dir,
        capture_output=True,
        text=True,
        check=True,
    )
    assert source["checkpoint_sha256"] == listing.stdout.split()[0]


def test_dcp_ema(models: ModelFactory, dcp_dir: Path, plain: Path, tmp_path: Path) -> None:
    out = _convert(models, dcp_dir, tmp_path / "ema", Layout(ema=True))
    _assert_halved(out, plain)
    assert Manifest.load(out).source["checkpoint_prefix"] == "ema."


def test_cli_converts_dcp_ema_and_logs_its_choices(
    models: ModelFactory, dcp_dir: Path, plain: Path, tmp_path: Path
) -> None:
    raw = models.raw("tiny")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ministream.cli",
            "convert",
            "--checkpoint",
            str(dcp_dir),
            "--ema",
            "--train-config",
            str(raw / "train_config.json"),
            "--tokenizer",
            str(raw / "tokenizer"),
            "--output",
            str(tmp_path / "out"),
            "--dtype",
            "float32",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "state dict found under 'ema'; ignoring beside it: 'model' (14 tensors)" in proc.stderr
    assert "torch.distributed.checkpoint directory, 14 tensors under 'ema.'" in proc.stderr
    _assert_halved(tmp_path / "out", plain)


def test_cli_layout_flags() -> None:
    args = build_parser().parse_args(
        [
            *("convert", "--checkpoint", "c", "--train-config", "t", "--tokenizer", "k"),
            *("--output", "o", "--ema", "--state-dict-key", "checkpoint.model"),
            *("--strip-prefix", "net."),
        ]
    )
    assert (args.ema, args.state_dict_key, args.strip_prefix) == (True, "checkpoint.model", "net.")


@pytest.mark.engine
@pytest.mark.network
def test_dcp_conversion_serves_the_same_tokens(
    dcp_model: Path, vllm_server: VLLMServer, tmp_path: Path
) -> None:
    """One engine on the DCP conversion; greedy tokens equal the shared server's (plain)."""
    served = serve(str(dcp_model), tmp_path / "vllm-dcp.log")
    assert_same_tokens([complete(vllm_server, p) for p in PROMPTS], served.completions)


# --- EMA spellings -----------------------------------------------------------------------

EMA_LAYOUTS = {
    "AveragedModel under ema": (produce.averaged_model_checkpoint, "ema.module."),
    "timm state_dict_ema": (produce.timm_checkpoint, "state_dict_ema."),
    "model_ema submodule": (produce.ema_submodule_checkpoint, "state_dict.model_ema.module."),
}


@pytest.mark.parametrize("layout", EMA_LAYOUTS)
def test_ema_layouts(
    models: ModelFactory,
    weights: State,
    plain: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    layout: str,
) -> None:
    make, prefix = EMA_LAYOUTS[layout]
    checkpoint = _save(make(weights), tmp_path)
    out = _convert(models, checkpoint, tmp_path / "ema", Layout(ema=True))
    _assert_same_model(out, plain)
    assert Manifest.load(out).source["checkpoint_prefix"] == prefix

    caplog.set_level(logging.INFO, logger="ministream")
    _assert_halved(_convert(models, checkpoint, tmp_path / "live"), plain)
    assert "pass --ema for those" in caplog.text


# --- refusals: each says what to do --------------------------------------------------


def _refused(
    models: ModelFactory, checkpoint: Path, tmp_path: Path, layout: Layout | None = None
) -> str:
    with pytest.raises(CheckpointError) as info:
        _convert(models, checkpoint, tmp_path / "out", layout)
    assert not (tmp_path / "out").exists()
    return str(info.value)


def test_unknown_prefix_is_named_with_the_flag(
    models: ModelFactory, weights: State, plain: Path, tmp_path: Path
) -> None:
    checkpoint = _save({f"net.{k}": v for k, v in weights.items()}, tmp_path)
    message = _refused(models, checkpoint, tmp_path)
    assert message == (
        "checkpoint does not match train_config.json: the checkpoint names 14 tensors of the "
        "model with the prefix 'net.' (e.g. net.blocks.0.attn.Wqkv.weight): pass "
        "--strip-prefix net."
    )
    _assert_same_model(
        _convert(models, checkpoint, tmp_path / "ok", Layout(strip_prefix="net.")), plain
    )


def test_several_prefixes_in_one_line(
    models: ModelFactory, weights: State, plain: Path, tmp_path: Path
) -> None:
    both = {f"{who}.{k}": v for who in ("student", "teacher") for k, v in weights.items()}
    checkpoint = _save(both, tmp_path)
    message = _refused(models, checkpoint, tmp_path)
    assert message.endswith(
        "the checkpoint names the model's tensors with several prefixes: 'student.' (14), "
        "'teacher.' (14); pass --strip-prefix with the one to convert (--ema for EMA weights)"
    )
    assert "missing tensors" not in message and "unexpected tensors" not in message
    out = _convert(models, checkpoint, tmp_path / "ok", Layout(strip_prefix="teacher."))
    _assert_same_model(out, plain)


def test_prefix_hint_keeps_the_unexplained_names(
    models: ModelFactory, weights: State, tmp_path: Path
) -> None:
    state = dict(weights)
    state["wrapped.norm_f.weight"] = state.pop("norm_f.weight")
    state.pop("blocks.1.mlp.w3.weight")
    message = _refused(models, _save(state, tmp_path), tmp_path)
    assert message == (
        "checkpoint does not match train_config.json: the checkpoint names 1 tensor of the "
        "model with the prefix 'wrapped.' (e.g. wrapped.norm_f.weight): pass --strip-prefix "
        "wrapped. | missing tensors: blocks.1.mlp.w3.weight"
    )


def test_long_name_lists_are_cut(models: ModelFactory, weights: State, tmp_path: Path) -> None:
    extra = {f"probe.{i:02d}.weight": torch.zeros(1) for i in range(25)}
    message = _refused(models, _save({**weights, **extra}, tmp_path), tmp_path)
    assert message.endswith(
        "unexpected tensors: probe.00.weight, "
        + ", ".join(f"probe.{i:02d}.weight" for i in range(1, 20))
        + " and 5 more"
    )


def test_ema_without_ema_weights_lists_what_there_is(models: ModelFactory, tmp_path: Path) -> None:
    message = _refused(models, models.raw("tiny") / "model.pt", tmp_path, Layout(ema=True))
    assert message.startswith("--ema: ")
    assert "has no EMA weights (looked for the keys and name prefixes ema, " in message
    assert "it holds 'model' (14 tensors), 'step' (int), 'optimizer' (no tensors)." in message
    assert "Convert the live weights without --ema" in message


def test_unknown_wrapper_names_the_flag(
    models: ModelFactory, weights: State, plain: Path, tmp_path: Path
) -> None:
    checkpoint = _save({"net": weights, "epoch": 4}, tmp_path)
    message = _refused(models, checkpoint, tmp_path)
    assert message.endswith(
        "holds no tensors at the top level: it holds 'net' (14 tensors), 'epoch' (int). Pass "
        "--state-dict-key with the dotted path to the model's state dict"
    )
    _assert_same_model(
        _convert(models, checkpoint, tmp_path / "ok", Layout(state_dict_key="net")), plain
    )


def test_state_dict_key_follows_nesting_and_names(
    models: ModelFactory, weights: State, plain: Path, tmp_path: Path
) -> None:
    nested = {"checkpoint": {"model": weights, "step": 1}, "run": {"name": "x"}}
    out = _convert(
        models, _save(nested, tmp_path), tmp_path / "a", Layout(state_dict_key="checkpoint.model")
    )
    _assert_same_model(out, plain)
    (tmp_path / "flat").mkdir()
    flat = _save(
        {"student.weights": {f"net.{k}": v for k, v in weights.items()}}, tmp_path / "flat"
    )
    out = _convert(models, flat, tmp_path / "b", Layout(state_dict_key="student.weights.net"))
    _assert_same_model(out, plain)


@pytest.mark.parametrize(
    ("layout", "match"),
    [
        (
            Layout(state_dict_key="checkpoint.model"),
            r"^--state-dict-key checkpoint\.model: .*model\.pt has no 'checkpoint\.model'; it "
            r"holds 'model' \(14 tensors\), 'step' \(int\), 'optimizer' \(no tensors\)$",
        ),
        (
            Layout(strip_prefix="net."),
            r"^--strip-prefix net\.: no tensor name in .*model\.pt starts with 'net\.'; it holds "
            r"'embedding\.\*' \(1 tensor\), 'blocks\.\*' \(12 tensors\), "
            r"'norm_f\.\*' \(1 tensor\)$",
        ),
    ],
)
def test_explicit_flags_that_match_nothing(
    models: ModelFactory, tmp_path: Path, layout: Layout, match: str
) -> None:
    message = _refused(models, models.raw("tiny") / "model.pt", tmp_path, layout)
    assert re.match(match, message), message


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_dcp_metadata_needing_code_is_refused(
    models: ModelFactory, dcp_dir: Path, tmp_path: Path
) -> None:
    tampered = tmp_path / "dcp"
    shutil.copytree(dcp_dir, tampered)
    marker = tmp_path / "pwned"
    (tampered / ".metadata").write_bytes(pickle.dumps(_Evil(marker)))
    message = _refused(models, tampered, tmp_path)
    assert "needs arbitrary code to unpickle (posix.system is not part of DCP metadata)" in message
    assert not marker.exists()


def test_directory_that_is_no_checkpoint(models: ModelFactory, tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "notes.txt").write_text("step 100")
    message = _refused(models, tmp_path / "ckpt", tmp_path)
    assert (
        "is a directory without .metadata, with 0 *.safetensors.index.json and 0 *.safetensors "
        "files" in message
    )
    assert "--checkpoint takes a torch.save file (model.pt), a .safetensors file" in message


def test_safetensors_index_naming_an_absent_tensor(
    models: ModelFactory, weights: State, tmp_path: Path
) -> None:
    directory = _sharded_safetensors(weights, tmp_path / "ckpt")
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    index["weight_map"]["blocks.9.mlp.w3.weight"] = next(iter(index["weight_map"].values()))
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    message = _refused(models, directory, tmp_path)
    assert "does not hold blocks.9.mlp.w3.weight, which its index lists there" in message
