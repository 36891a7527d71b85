"""`ministream convert`: raw MiniStream checkpoint → HF-style directory vLLM can serve.

Streaming: the raw checkpoint (a torch.save file, safetensors or a torch.distributed.checkpoint
directory: checkpoint.py) is read one tensor at a time; at most one output shard
(`--max-shard-size`) is held in memory before it is written.
Accounting: every raw tensor is consumed exactly once, every target tensor produced once,
every shape checked against the config; a gap is an error that names the keys.
Atomic: everything is written into a temp directory beside the output and renamed into
place only when complete, so an interrupted run leaves no half-written model behind.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from ministream.checkpoint import RawCheckpoint, RawTensors, open_raw_checkpoint
from ministream.errors import CheckpointError, is_enospc
from ministream.manifest import MANIFEST_NAME, Manifest, sha256_file
from ministream.names import Slice, conversion_plan
from ministream.output_dir import check_replaceable, make_world_readable, replace_dir
from ministream.raw_layouts import Layout, explain_prefixes
from ministream.train_config import TrainConfig

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
INDEX_NAME = "model.safetensors.index.json"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)
log = logging.getLogger(__name__)
_FORMAT_NAMES = {
    "torch": "torch.save file",
    "safetensors": "safetensors",
    "dcp": "torch.distributed.checkpoint directory",
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'5GB', '500MiB', '1024' → bytes (decimal units for *B, binary for *iB)."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"cannot parse size {text!r}; use e.g. 2GB, 500MiB or 1048576")
    number, prefix, unit = match.groups()
    base = 1024 if (unit or "").lower() == "ib" else 1000
    return int(float(number) * base ** " KMGT".index(prefix.upper() or " "))


@dataclass(frozen=True)
class ConvertResult:
    output: Path
    manifest: Manifest
    num_tensors: int
    num_shards: int


def check_raw_tensors(shapes: Mapping[str, tuple[int, ...]], cfg: TrainConfig) -> None:
    """Compare the raw state dict's shapes with what `cfg` implies; name every gap in one error.

    Names that differ from the expected ones only by a prefix are reported in one line that
    names the prefix and the flag, not as two lists of every name.
    """
    expected = {name: shape for name, shape, _ in conversion_plan(cfg)}
    hint, missing, unexpected = explain_prefixes(
        expected.keys() - shapes.keys(), shapes.keys() - expected.keys()
    )
    wrong = sorted(
        f"{name} has shape {shapes[name]}, config implies {shape}"
        for name, shape in expected.items()
        if name in shapes and shapes[name] != shape
    )
    problems = [hint] if hint else []
    if missing:
        problems.append(f"missing tensors: {_names(missing)}")
    if unexpected:
        tied = (
            " (lm_head.weight with tie_embeddings=true: the config contradicts the checkpoint)"
            if "lm_head.weight" in unexpected
            else ""
        )
        problems.append(f"unexpected tensors: {_names(unexpected)}{tied}")
    if wrong:
        problems.append("shape mismatches: " + "; ".join(wrong))
    if problems:
        raise CheckpointError(
            "checkpoint does not match train_config.json: " + " | ".join(problems)
        )


def _names(names: set[str], limit: int = 20) -> str:
    shown = sorted(names)
    more = f" and {len(shown) - limit} more" if len(shown) > limit else ""
    return ", ".join(shown[:limit]) + more


def _copy_tokenizer(src: Path, dst: Path, vocab_size: int) -> None:
    if src.is_file():
        files = [src]
    elif src.is_dir():
        files = [src / name for name in TOKENIZER_FILES if (src / name).is_file()]
    else:
        raise CheckpointError(f"tokenizer not found: {src}")
    if not any(f.name in ("tokenizer.json", "tokenizer.model") for f in files):
        raise CheckpointError(
            f"{src}: no tokenizer.json or tokenizer.model found (give a tokenizer.json file "
            "or a directory of Hugging Face tokenizer files)"
        )
    _refuse_paths_outside(src if src.is_dir() else src.parent, files)
    for f in files:
        shutil.copy2(f, dst / f.name)
    if (dst / "tokenizer.json").exists():
        from tokenizers import Tokenizer

        size = Tokenizer.from_file(str(dst / "tokenizer.json")).get_vocab_size()
        if size > vocab_size:
            raise CheckpointError(
                f"tokenizer has {size} tokens but the model's vocab_size is {vocab_size}: "
                "token ids past the embedding would crash serving; pass the training tokenizer"
            )


def _refuse_paths_outside(root: Path, files: list[Path]) -> None:
    """A tokenizer must not smuggle in files from elsewhere: no file that is a
    link leading out of its directory (copy2 would copy the target), and no `*_file` entry
    of tokenizer_config.json naming a path outside the model directory."""
    from ministream.member_names import is_member_name

    problems = []
    base = root.resolve()
    for f in files:
        if f.is_symlink() and not f.resolve().is_relative_to(base):
            problems.append(f"{f.name} links outside the tokenizer directory ({f.resolve()})")
        if f.name == "tokenizer_config.json":
            try:
                raw = json.loads(f.read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise CheckpointError(f"{f}: not valid JSON ({exc})") from None
            entries = raw.items() if isinstance(raw, dict) else []
            for key, value in entries:
                if key.endswith("_file") and value is not None and not is_member_name(value):
                    problems.append(f"{f.name}: {key}={value!r} names a path outside the model")
    if problems:
        raise CheckpointError("refusing the tokenizer: " + "; ".join(problems))


class _ShardWriter:
    """Accumulates tensors and writes a safetensors file whenever the limit is reached."""

    def __init__(self, out: Path, max_bytes: int) -> None:
        self.out, self.max_bytes = out, max_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.files: list[tuple[str, list[str]]] = []

    def add(self, name: str, tensor: torch.Tensor) -> None:
        size = tensor.numel() * tensor.element_size()
        if self.pending and self.pending_bytes + size > self.max_bytes:
            self.flush()
        self.pending[name] = tensor
        self.pending_bytes += size

    def flush(self) -> None:
        if not self.pending:
            return
        tmp_name = f"shard-{len(self.files):05d}.part"
        save_file(self.pending, str(self.out / tmp_name), metadata={"format": "pt"})
        self.files.append((tmp_name, list(self.pending)))
        self.pending, self.pending_bytes = {}, 0

    def finish(self) -> dict[str, str]:
        """Name the shards model-0000i-of-0000N.safetensors; return the weight map."""
        self.flush()
        weight_map: dict[str, str] = {}
        total = len(self.files)
        for i, (tmp_name, names) in enumerate(self.files, start=1):
            final = f"model-{i:05d}-of-{total:05d}.safetensors"
            os.replace(self.out / tmp_name, self.out / final)
            weight_map.update(dict.fromkeys(names, final))
        return weight_map


def convert(
    checkpoint: str | Path,
    train_config: str | Path,
    tokenizer: str | Path,
    output: str | Path,
    dtype: str = "bfloat16",
    max_shard_size: str | int = "2GB",
    force: bool = False,
    progress: bool = True,
    on_tensor: Callable[[Slice], None] | None = None,
    layout: Layout | None = None,
) -> ConvertResult:
    """Convert `checkpoint` (any layout checkpoint.py reads; `layout` picks the weights)."""
    if dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    max_bytes = parse_size(max_shard_size) if isinstance(max_shard_size, str) else max_shard_size
    if max_bytes <= 0:
        raise ValueError("--max-shard-size must be positive")
    output = Path(output)
    check_replaceable(output, force)

    cfg = TrainConfig.load(train_config)
    opened = _open_checkpoint(checkpoint, layout, cfg)

    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-", dir=output.parent))
    try:
        n_tensors, n_files = _write_weights(
            opened.tensors, cfg, tmp, max_bytes, dtype, progress=progress, on_tensor=on_tensor
        )
        _write_configs(tmp, cfg, dtype)
        _copy_tokenizer(Path(tokenizer), tmp, cfg.vocab_size)
        manifest = _write_manifest(tmp, dtype, checkpoint, opened, train_config)
        make_world_readable(tmp)
        replace_dir(tmp, output, force=force)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if is_enospc(exc):
            raise CheckpointError(
                f"no space left on the device of {output.parent} while converting "
                f"({exc}); the partial output was "
                f"removed and {output} was left as it was. Free space or pick another --output."
            ) from exc
        raise
    return ConvertResult(output, manifest, n_tensors, n_files)


def _open_checkpoint(
    checkpoint: str | Path, layout: Layout | None, cfg: TrainConfig
) -> RawCheckpoint:
    """Open the raw checkpoint, say what was found, and check its tensors against `cfg`."""
    opened = open_raw_checkpoint(checkpoint, layout)
    log.info(
        "%s: %s, %d tensors%s",
        checkpoint,
        _FORMAT_NAMES[opened.format],
        len(opened.tensors),
        f" under {opened.prefix!r}" if opened.prefix else "",
    )
    check_raw_tensors(opened.tensors.shapes, cfg)
    return opened


def _write_weights(
    raw: RawTensors,
    cfg: TrainConfig,
    out: Path,
    max_bytes: int,
    dtype: str,
    *,
    progress: bool,
    on_tensor: Callable[[Slice], None] | None,
) -> tuple[int, int]:
    """Stream every raw tensor through the conversion plan into safetensors shards and their
    index; return how many tensors and files were written."""
    plan = list(conversion_plan(cfg))
    writer = _ShardWriter(out, max_bytes)
    consumed: set[str] = set()
    produced: set[str] = set()
    total_bytes = sum(raw.numel(name) for name, _, _ in plan) * DTYPES[dtype].itemsize
    with tqdm(
        total=total_bytes, unit="B", unit_scale=True, desc="convert", disable=not progress
    ) as bar:
        for raw_name, _, slices in plan:
            assert raw_name not in consumed, raw_name
            consumed.add(raw_name)
            source = raw.pop(raw_name)  # drop our reference: the mapping can be released
            for s in slices:
                tensor = source[s.start : s.stop].to(DTYPES[dtype]).contiguous()
                assert tuple(tensor.shape) == s.shape and s.hf not in produced, s
                writer.add(s.hf, tensor)
                produced.add(s.hf)
                if on_tensor is not None:
                    on_tensor(s)
                bar.update(tensor.numel() * tensor.element_size())
            del source
    assert not raw, f"raw tensors left unconverted: {sorted(raw)}"
    weight_map = writer.finish()
    expected = {s.hf for _, _, slices in plan for s in slices}
    assert produced == expected == weight_map.keys(), expected ^ produced
    (out / "model.safetensors.index.json").write_text(
        json.dumps(
            {
                "metadata": {"total_size": total_bytes},
                "weight_map": dict(sorted(weight_map.items())),
            },
            indent=2,
        )
        + "\n"
    )
    return len(produced), len(writer.files)


def _write_configs(out: Path, cfg: TrainConfig, dtype: str) -> None:
    """`config.json` (the HF config vLLM reads) and `generation_config.json`."""
    hf_config = cfg.to_hf(torch_dtype=dtype).to_dict()
    # docs/architecture.md §1.2 names it; transformers 5 reads "dtype"
    hf_config["torch_dtype"] = dtype
    (out / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps(
            {
                "bos_token_id": cfg.bos_id,
                "eos_token_id": cfg.eos_id,
            },
            indent=2,
        )
        + "\n"
    )


def _write_manifest(
    out: Path,
    dtype: str,
    checkpoint: str | Path,
    opened: RawCheckpoint,
    train_config: str | Path,
) -> Manifest:
    """The manifest of everything in `out`, naming the checkpoint it was converted from."""
    manifest = Manifest.build(
        out,
        dtype=dtype,
        source={
            "checkpoint": Path(checkpoint).name,
            "checkpoint_sha256": opened.sha256(),
            "checkpoint_format": opened.format,
            "checkpoint_prefix": opened.prefix,
            "train_config_sha256": sha256_file(train_config),
        },
    )
    (out / MANIFEST_NAME).write_text(manifest.to_json())
    return manifest
