"""`ministream convert-lora`: a training-framework LoRA adapter → a directory vLLM serves.

Input (docs/plugin.md, "LoRA adapters"): `adapter.pt`, read with `weights_only=True`:
`{"lora_config": {"r", "alpha", "targets"}, "lora": {"blocks.{i}.{target}.lora_A": [r, in],
"blocks.{i}.{target}.lora_B": [out, r], ...}, "base_model_hash"?}`, meaning
`W_eff = W + (alpha / r) · lora_B @ lora_A` on the raw fused matrix.

Output: PEFT's layout, which vLLM's LoRA loader reads (`adapter_config.json` +
`adapter_model.safetensors`), and the model manifest (`ministream_manifest.json`, one format
for models and adapters). vLLM fuses q/k/v into `qkv_proj` and gate/up into `gate_up_proj`
and packs an adapter's `q_proj`/`k_proj`/`v_proj` (`gate_proj`/`up_proj`) LoRAs into them
(`packed_modules_mapping`), each with its own A. A fused raw LoRA shares one A between its
row blocks, so each HF module gets a copy of that A and its row block of B: for every slice,
`B[rows] @ A` is exactly the fused delta's rows.

Checks, all reported in one error: the structure, rank, alpha and targets of `lora_config`;
every tensor's name, layer, target and shape against the base model; finite values of a
sane size; the base model hash. Written into a temp directory and renamed into place.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from ministream.adapter_rules import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    alpha_problem,
    is_alpha,
    is_rank,
    rank_problem,
    reported,
    scale_problem,
    values_problem,
)
from ministream.checkpoint import load_torch_file
from ministream.convert import DTYPES
from ministream.errors import CheckpointError
from ministream.manifest import MANIFEST_NAME, Manifest, sha256_file
from ministream.names import DEFAULT_MAX_LORA_RANK, LORA_TARGETS, LoraTarget, lora_targets
from ministream.output_dir import check_replaceable, make_world_readable, replace_dir
from ministream.train_config import TrainConfig

# vLLM's loader strips this prefix from PEFT tensor names (vllm/lora/utils.py).
PEFT_PREFIX = "base_model.model."
MANIFEST_KIND = "lora_adapter"
_KEY = re.compile(r"^blocks\.(\d+)\.(.+)\.(lora_A|lora_B)$")


@dataclass(frozen=True)
class LoraConvertResult:
    output: Path
    manifest: Manifest
    name: str
    rank: int
    modules: tuple[str, ...]  # the PEFT target modules (q_proj, ...)
    num_tensors: int


def read_base(model_dir: str | Path) -> tuple[TrainConfig, str]:
    """A converted model directory's shape (from config.json) and model hash (manifest)."""
    from ministream.config import MiniStreamConfig

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise CheckpointError(
            f"--base {model_dir} has no config.json: pass the converted model directory "
            "(`ministream convert --output`) the adapter was trained on"
        )
    manifest = Manifest.load(model_dir)
    hf = MiniStreamConfig.from_json_file(str(model_dir / "config.json"))
    return TrainConfig.from_hf(hf), manifest.model_hash


def _load_adapter(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise CheckpointError(f"adapter not found: {path}")
    raw = load_torch_file(
        path,
        what="LoRA adapter",
        expected="--adapter takes the adapter.pt the training framework saved with torch.save",
    )
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a dict with lora_config and lora, got {type(raw)}")
    return raw


def _config_problems(raw: dict[str, Any], max_rank: int) -> tuple[list[str], int, float, list[str]]:
    """(problems, r, alpha, targets) of `lora_config`."""
    problems: list[str] = []
    unknown_keys = sorted(set(raw) - {"lora_config", "lora", "base_model_hash"})
    if unknown_keys:
        problems.append(f"unknown top-level keys {unknown_keys}")
    cfg = raw.get("lora_config")
    if not isinstance(cfg, dict):
        return [*problems, "lora_config is missing or not a dict"], 0, 0.0, []
    r, alpha, targets = cfg.get("r"), cfg.get("alpha"), cfg.get("targets")
    problems += reported(
        rank_problem(r, max_rank, field="lora_config.r", maximum="--max-rank"),
        alpha_problem(alpha, field="lora_config.alpha"),
    )
    r = r if is_rank(r) else 0
    alpha = float(alpha) if is_alpha(alpha) else 0.0
    if r and alpha:
        problems += reported(scale_problem(alpha, r, field="alpha"))
    if not isinstance(targets, list | tuple) or not targets:
        problems.append(f"lora_config.targets must be a non-empty list, got {targets!r}")
        targets = []
    else:
        unknown = [t for t in targets if t not in LORA_TARGETS]
        if unknown:
            problems.append(
                f"unknown targets {unknown} in lora_config.targets (MiniStream adapts "
                f"{', '.join(LORA_TARGETS)})"
            )
        targets = [t for t in targets if t in LORA_TARGETS]
    return problems, r, float(alpha), list(targets)


def _tensor_problems(
    lora: dict[str, Any], cfg: TrainConfig, r: int, targets: list[str]
) -> tuple[list[str], dict[tuple[int, str], dict[str, torch.Tensor]], list[str]]:
    """Every tensor of `lora` checked, each named once; returns (problems, {(layer, target):
    {A, B}}, the keys whose layer or feature sizes are another model's)."""
    problems: list[str] = []
    other_base: list[str] = []
    known = lora_targets(cfg)
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    named: set[tuple[int, str, str]] = set()  # every (layer, target, half) the adapter holds
    for key, tensor in sorted(lora.items()):
        match = _KEY.match(key) if isinstance(key, str) else None
        if match is None:
            problems.append(f"{key!r}: not a name blocks.{{i}}.{{target}}.lora_A|lora_B")
            continue
        layer, target, half = int(match[1]), match[2], match[3]
        named.add((layer, target, half))
        if target not in LORA_TARGETS:
            problems.append(f"{key}: unknown target {target!r}")
            continue
        if target not in targets:
            problems.append(f"{key}: target {target!r} is not in lora_config.targets")
            continue
        if layer >= cfg.n_layers:
            problems.append(f"{key}: layer {layer} does not exist (the base has {cfg.n_layers})")
            other_base.append(key)
            continue
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            problems.append(f"{key}: not a floating-point tensor ({type(tensor).__name__})")
            continue
        out_features, in_features = known[(layer, target)].shape
        want = (r, in_features) if half == "lora_A" else (out_features, r)
        if tuple(tensor.shape) != want:
            problems.append(f"{key}: shape {list(tensor.shape)}, expected {list(want)}")
            feature = 1 if half == "lora_A" else 0  # the dimension the base model fixes
            if tensor.dim() != 2 or tensor.shape[feature] != want[feature]:
                other_base.append(key)
            continue
        if bad_values := values_problem(key, tensor):
            problems.append(bad_values)
            continue
        pairs.setdefault((layer, target), {})[half] = tensor
    for (layer, target), halves in sorted(pairs.items()):
        for half in ("lora_A", "lora_B"):
            # A half the adapter holds but that was refused above is named there, once.
            if half not in halves and (layer, target, half) not in named:
                problems.append(f"blocks.{layer}.{target}.{half}: missing (its pair is present)")
    if not lora:
        problems.append("the adapter holds no LoRA tensors")
    return problems, pairs, other_base


def check_training_adapter(
    raw: dict[str, Any], cfg: TrainConfig, base_hash: str, max_rank: int = DEFAULT_MAX_LORA_RANK
) -> tuple[int, float, list[str], dict[tuple[int, str], dict[str, torch.Tensor]]]:
    """Validate the training framework's adapter dict against a base (the rules of
    ministream.adapter_rules, and the tensors against the base's shapes); raise one
    CheckpointError naming all problems. Returns (r, alpha, targets, complete A/B pairs by
    (layer, target))."""
    problems, r, alpha, targets = _config_problems(raw, max_rank)
    wanted_hash = raw.get("base_model_hash")
    if wanted_hash is not None and wanted_hash != base_hash:
        problems.append(
            f"the adapter was trained on base model {str(wanted_hash)[:16]}, but --base is model "
            f"{base_hash[:16]}: convert it against the base it was trained on"
        )
    lora = raw.get("lora")
    if not isinstance(lora, dict):
        problems.append("lora is missing or not a dict of tensors")
        lora = {}
    tensor_problems, pairs, other_base = (
        _tensor_problems(lora, cfg, r, targets) if r else ([], {}, [])
    )
    if other_base and (wanted_hash is None or wanted_hash == base_hash):
        # Said first: it explains the shape problems that follow.
        problems.insert(
            0,
            f"the adapter was made for another base model: {len(other_base)} of its tensors "
            f"have the layers or sizes of a different model than --base (model "
            f"{base_hash[:16]}, {cfg.n_layers} layers, d_model {cfg.d_model}), e.g. "
            f"{other_base[0]}; convert it against the base it was trained on",
        )
    problems += tensor_problems
    if problems:
        raise CheckpointError(
            f"refusing the adapter ({len(problems)} problem(s)): " + "; ".join(problems)
        )
    return r, alpha, targets, pairs


def peft_tensors(
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]],
    known: dict[tuple[int, str], LoraTarget],
    dtype: torch.dtype,
) -> dict[str, torch.Tensor]:
    """PEFT-named tensors: per HF module, a copy of A and its row block of B."""
    out: dict[str, torch.Tensor] = {}
    for key, halves in sorted(pairs.items()):
        a, b = halves["lora_A"], halves["lora_B"]
        for s, module in zip(known[key].slices, known[key].modules, strict=True):
            prefix = PEFT_PREFIX + module
            assert prefix + ".lora_A.weight" not in out, prefix
            out[prefix + ".lora_A.weight"] = a.to(dtype).contiguous().clone()
            out[prefix + ".lora_B.weight"] = b[s.start : s.stop].to(dtype).contiguous()
    return out


def _peft_config(r: int, alpha: float, modules: list[str]) -> str:
    """adapter_config.json: plain LoRA, as vLLM's LoRA loader reads it."""
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": r,
        "lora_alpha": alpha,
        "target_modules": modules,
        "bias": "none",
        "lora_dropout": 0.0,
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "inference_mode": True,
        "base_model_name_or_path": None,
    }
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def convert_lora(
    adapter: str | Path,
    base: str | Path,
    output: str | Path,
    *,
    name: str | None = None,
    max_rank: int = DEFAULT_MAX_LORA_RANK,
    dtype: str = "float32",
    force: bool = False,
    progress: bool = True,
) -> LoraConvertResult:
    if dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    adapter, output = Path(adapter), Path(output)
    check_replaceable(output, force)
    cfg, base_hash = read_base(base)
    raw = _load_adapter(adapter)
    r, alpha, targets, pairs = check_training_adapter(raw, cfg, base_hash, max_rank)
    known = lora_targets(cfg)
    tensors = peft_tensors(pairs, known, DTYPES[dtype])
    # Accounting: each input pair became exactly its modules' A and B, nothing else.
    expected = {
        f"{PEFT_PREFIX}{m}.{half}.weight"
        for key in pairs
        for m in known[key].modules
        for half in ("lora_A", "lora_B")
    }
    assert expected == tensors.keys(), expected ^ tensors.keys()
    modules = sorted({k.removeprefix(PEFT_PREFIX).split(".")[-3] for k in tensors})
    name = name or output.name

    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-", dir=output.parent))
    try:
        with tqdm(total=3, desc="convert-lora", disable=not progress) as bar:
            save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
            bar.update()
            (tmp / ADAPTER_CONFIG).write_text(_peft_config(r, alpha, modules))
            bar.update()
            manifest = Manifest.build(
                tmp,
                dtype=dtype,
                source={
                    "kind": MANIFEST_KIND,
                    "name": name,
                    "adapter": adapter.name,
                    "adapter_sha256": sha256_file(adapter),
                    "base_model_hash": base_hash,
                    "r": r,
                    "alpha": alpha,
                    "targets": targets,
                },
            )
            (tmp / MANIFEST_NAME).write_text(manifest.to_json())
            bar.update()
        make_world_readable(tmp)
        replace_dir(tmp, output, force=force)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return LoraConvertResult(output, manifest, name, r, tuple(modules), len(tensors))
