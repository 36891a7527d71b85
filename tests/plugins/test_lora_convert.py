"""`ministream convert-lora` and `demo-lora` (no engine): what a converted adapter holds, and
every kind of bad adapter refused with one error that names each problem.

The expected deltas are computed from the raw fused matrices (`W + alpha/r · B @ A`, the
input contract), then split with the base's own row layout, so the converter's per-module
split is checked against the contract rather than against itself.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from ministream.adapter_rules import ADAPTER_CONFIG, ADAPTER_WEIGHTS, MAX_ABS_VALUE
from ministream.cli import main as cli_main
from ministream.demo import random_adapter
from ministream.errors import CheckpointError
from ministream.lora_convert import PEFT_PREFIX, convert_lora, read_base
from ministream.manifest import MANIFEST_NAME, Manifest, verify_dir
from ministream.names import lora_targets
from tests.support.models import ModelFactory


@pytest.fixture(scope="module")
def base(models: ModelFactory) -> Path:
    return models.converted("tiny", "float32")


def _save(adapter: dict[str, Any], path: Path) -> Path:
    torch.save(adapter, path)
    return path


def _adapter(base: Path, **kwargs: Any) -> dict[str, Any]:
    cfg, model_hash = read_base(base)
    kwargs.setdefault("rank", 4)
    kwargs.setdefault("targets", ["attn.Wqkv", "mlp.w3"])
    return random_adapter(cfg, base_model_hash=model_hash, **kwargs)


def test_converted_modules_reproduce_the_fused_delta(base: Path, tmp_path: Path) -> None:
    adapter = _adapter(base, rank=8, alpha=16.0, targets=["attn.Wqkv", "mlp.w12", "mlp.w3"])
    out = convert_lora(_save(adapter, tmp_path / "a.pt"), base, tmp_path / "out", progress=False)
    tensors = load_file(str(out.output / ADAPTER_WEIGHTS))
    config = json.loads((out.output / ADAPTER_CONFIG).read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (8, 16.0, "LORA")
    assert config["target_modules"] == sorted(
        ["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]
    )
    cfg, _ = read_base(base)
    scale = 16.0 / 8
    seen = set()
    for (layer, target), info in lora_targets(cfg).items():
        prefix = f"blocks.{layer}.{target}"
        if f"{prefix}.lora_A" not in adapter["lora"]:
            assert not any(f"{m}.lora_A" in k for m in info.modules for k in tensors)
            continue
        fused = scale * adapter["lora"][f"{prefix}.lora_B"] @ adapter["lora"][f"{prefix}.lora_A"]
        for s, module in zip(info.slices, info.modules, strict=True):
            a = tensors[f"{PEFT_PREFIX}{module}.lora_A.weight"]
            b = tensors[f"{PEFT_PREFIX}{module}.lora_B.weight"]
            torch.testing.assert_close(scale * b @ a, fused[s.start : s.stop])
            seen |= {f"{PEFT_PREFIX}{module}.lora_A.weight", f"{PEFT_PREFIX}{module}.lora_B.weight"}
    assert seen == tensors.keys()  # nothing else in the file
    assert out.num_tensors == len(tensors)


def test_manifest_ties_the_adapter_to_its_base(base: Path, tmp_path: Path) -> None:
    src = _save(_adapter(base), tmp_path / "a.pt")
    out = convert_lora(src, base, tmp_path / "out", name="support-bot", progress=False)
    manifest = verify_dir(out.output)
    assert sorted(manifest.files) == [ADAPTER_CONFIG, ADAPTER_WEIGHTS]
    assert manifest.source["base_model_hash"] == Manifest.load(base).model_hash
    assert manifest.source["name"] == "support-bot" and manifest.source["kind"] == "lora_adapter"
    with pytest.raises(FileExistsError, match="--force"):
        convert_lora(src, base, tmp_path / "out", progress=False)


def test_an_adapter_for_another_base_names_each_tensor_once_and_says_so(
    base: Path, tmp_path: Path
) -> None:
    from ministream.presets import PRESETS

    other = PRESETS["tiny-headdim"]  # head_dim 64 where the base has 32: Wqkv and out_proj differ
    adapter = random_adapter(other, rank=2, targets=["attn.Wqkv", "attn.out_proj"])
    with pytest.raises(CheckpointError) as err:
        convert_lora(_save(adapter, tmp_path / "a.pt"), base, tmp_path / "out", progress=False)
    message = str(err.value)
    assert "the adapter was made for another base model" in message
    bad = [
        f"blocks.{i}.{t}" for i in range(2) for t in ("attn.Wqkv.lora_B", "attn.out_proj.lora_A")
    ]
    for key in bad:
        assert message.count(f"{key}: shape") == 1, message
    assert "missing (its pair is present)" not in message
    assert message.startswith("refusing the adapter (5 problem(s)): the adapter was made for")


# torch's own advice around a refused weights_only load (torch 2.6+ wording): to re-run with
# weights_only set to False, which runs the file's code, and to file an issue.
TORCH_ADVICE = (
    "weights_only=False",
    "set to `False`",
    "will likely succeed",
    "file an issue",
    "Weights only load failed",
)


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_an_adapter_that_is_not_a_torch_file_says_so_in_our_words(
    base: Path, tmp_path: Path
) -> None:
    garbage = tmp_path / "adapter.pt"
    garbage.write_bytes(b"x" + os.urandom(4096))
    with pytest.raises(CheckpointError) as err:
        convert_lora(garbage, base, tmp_path / "out", progress=False)
    message = str(err.value)
    assert "adapter.pt is not a LoRA adapter: torch.save writes a zip archive" in message
    assert "--adapter takes the adapter.pt" in message
    assert not [t for t in TORCH_ADVICE if t in message], message
    evil = _save({"lora_config": {"r": 1}, "hook": _Evil()}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match="needs arbitrary code to unpickle") as err:
        convert_lora(evil, base, tmp_path / "out", progress=False)
    message = str(err.value)
    assert "posix.system" in message  # torch's reason is kept, its advice around it is not
    assert not [t for t in TORCH_ADVICE if t in message], message


def test_cli_demo_lora_then_convert_lora(base: Path, tmp_path: Path) -> None:
    adapter = tmp_path / "a.pt"
    assert cli_main(["demo-lora", "--base", str(base), "--output", str(adapter), "--rank", "2",
                     "--targets", "attn.out_proj"]) == 0  # fmt: skip
    raw = torch.load(adapter, weights_only=True)
    assert raw["lora_config"] == {"r": 2, "alpha": 2.0, "targets": ["attn.out_proj"]}
    assert raw["base_model_hash"] == Manifest.load(base).model_hash
    args = ["convert-lora", "--adapter", str(adapter), "--base", str(base), "--quiet"]
    assert cli_main([*args, "--output", str(tmp_path / "out")]) == 0
    assert cli_main(["verify", str(tmp_path / "out")]) == 0


def _break_rank(a: dict[str, Any]) -> None:
    a["lora_config"]["r"] = 128  # and tensors of that rank: only the maximum is wrong
    for key, t in list(a["lora"].items()):
        a["lora"][key] = (
            torch.zeros(128, t.shape[1]) if key.endswith("A") else torch.zeros(t.shape[0], 128)
        )


# (what is broken, how, the words the error must name)
HOSTILE: list[tuple[str, Any, str]] = [
    ("nan", lambda a: a["lora"]["blocks.0.attn.Wqkv.lora_A"].__setitem__((0, 0), float("nan")),
     r"blocks\.0\.attn\.Wqkv\.lora_A: 1 NaN/Inf"),
    ("inf", lambda a: a["lora"]["blocks.1.mlp.w3.lora_B"].__setitem__((0, 0), float("inf")),
     r"blocks\.1\.mlp\.w3\.lora_B: 1 NaN/Inf"),
    ("huge", lambda a: a["lora"]["blocks.0.mlp.w3.lora_B"].__setitem__((1, 1), 1e6),
     rf"blocks\.0\.mlp\.w3\.lora_B: values up to 1e\+06, absurdly large \(> {MAX_ABS_VALUE:g}\)"),
    ("huge-alpha", lambda a: a["lora_config"].__setitem__("alpha", 1e9),
     r"alpha / r = 2\.5e\+08 is absurdly large"),
    ("rank", _break_rank, r"rank 128 is above the maximum rank 64"),
    ("unknown-target-config", lambda a: a["lora_config"]["targets"].append("attn.rotary"),
     r"unknown targets \['attn\.rotary'\]"),
    ("unknown-target-tensor",
     lambda a: a["lora"].__setitem__("blocks.0.norm1.lora_A", torch.zeros(4, 128)),
     r"blocks\.0\.norm1\.lora_A: unknown target 'norm1'"),
    ("undeclared-target",
     lambda a: a["lora"].__setitem__("blocks.0.mlp.w12.lora_A", torch.zeros(4, 128)),
     r"target 'mlp\.w12' is not in lora_config\.targets"),
    ("layer", lambda a: a["lora"].__setitem__("blocks.7.mlp.w3.lora_A", torch.zeros(4, 256)),
     r"blocks\.7\.mlp\.w3\.lora_A: layer 7 does not exist \(the base has 2\)"),
    ("shape", lambda a: a["lora"].__setitem__("blocks.0.mlp.w3.lora_A", torch.zeros(4, 128)),
     r"blocks\.0\.mlp\.w3\.lora_A: shape \[4, 128\], expected \[4, 256\]"),
    ("half-pair", lambda a: a["lora"].pop("blocks.1.attn.Wqkv.lora_B"),
     r"blocks\.1\.attn\.Wqkv\.lora_B: missing"),
    ("other-base", lambda a: a.__setitem__("base_model_hash", "f" * 64),
     r"trained on base model ffffffffffffffff, but --base is model"),
    ("bad-name", lambda a: a["lora"].__setitem__("layers.0.q.lora_A", torch.zeros(1)),
     r"'layers\.0\.q\.lora_A': not a name"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "edit", "message"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_adapter_is_refused_by_name(
    base: Path, tmp_path: Path, what: str, edit: Any, message: str
) -> None:
    adapter = _adapter(base)
    edit(adapter)
    out = tmp_path / "out"
    with pytest.raises(CheckpointError, match=message):
        convert_lora(_save(adapter, tmp_path / "a.pt"), base, out, progress=False)
    assert os.listdir(tmp_path) == ["a.pt"]  # nothing half-written


def test_every_problem_in_one_error(base: Path, tmp_path: Path) -> None:
    adapter = _adapter(base)
    for _, edit, _ in HOSTILE:
        if edit is not _break_rank:
            edit(adapter)
    with pytest.raises(CheckpointError) as err:
        convert_lora(_save(adapter, tmp_path / "a.pt"), base, tmp_path / "out", progress=False)
    for what, edit, message in HOSTILE:
        if edit is not _break_rank:
            assert err.match(message), what


def test_code_in_the_pickle_is_refused(base: Path, tmp_path: Path) -> None:
    class Payload:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, ("true",))

    path = tmp_path / "a.pt"
    torch.save({"lora_config": Payload(), "lora": {}}, path)
    with pytest.raises(CheckpointError, match=r"weights_only=True"):
        convert_lora(path, base, tmp_path / "out", progress=False)


def test_an_adapter_directory_linking_outside_is_refused(base: Path, tmp_path: Path) -> None:
    """verify and upload read every listed file: a link to a file elsewhere on the machine,
    with a manifest written over it, must not be hashed or sent."""
    out = convert_lora(_save(_adapter(base), tmp_path / "a.pt"), base, tmp_path / "out",
                       progress=False).output  # fmt: skip
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    (out / ADAPTER_WEIGHTS).unlink()
    (out / ADAPTER_WEIGHTS).symlink_to(secret)
    with pytest.raises(CheckpointError, match="outside the directory"):
        Manifest.build(out, source={}, dtype="float32")
    forged = json.loads((out / MANIFEST_NAME).read_text())
    forged["files"][ADAPTER_WEIGHTS] = {"sha256": "0" * 64, "size": secret.stat().st_size}
    (out / MANIFEST_NAME).write_text(
        Manifest(forged["files"], forged["source"], "x", "float32").to_json()
    )
    with pytest.raises(CheckpointError, match=rf"{ADAPTER_WEIGHTS}: a link to .*secret\.txt"):
        verify_dir(out)


def test_cli_names_the_problem_without_a_trace(
    base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    adapter = _adapter(base)
    adapter["base_model_hash"] = "0" * 64
    path = _save(adapter, tmp_path / "a.pt")
    args = ["convert-lora", "--adapter", str(path), "--base", str(base), "--quiet"]
    assert cli_main([*args, "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: refusing the adapter") and "Traceback" not in err
