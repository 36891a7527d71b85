"""Demo checkpoints and converted model directories, built once per test session."""

from __future__ import annotations

from pathlib import Path

from ministream.convert import convert
from ministream.demo import write_demo_adapter, write_demo_checkpoint
from ministream.lora_convert import convert_lora

# Small enough that the tiny preset in float32 takes three safetensors files: the loading
# tests delete the one "in the middle" of an upload.
SPLIT_SHARD_SIZE = "600KB"


class ModelFactory:
    """Caches raw demo checkpoints and their conversions under one session directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def raw(self, preset: str, seed: int = 0) -> Path:
        path = self.root / "raw" / f"{preset}-seed{seed}"
        if not path.exists():
            write_demo_checkpoint(preset, path, seed=seed)
        return path

    def converted(
        self, preset: str, dtype: str = "float32", *, seed: int = 0, split: bool = False
    ) -> Path:
        """`preset` converted to `dtype`: one safetensors file, or several with `split`."""
        name = f"{preset}-seed{seed}-{dtype}" + ("-split" if split else "")
        path = self.root / "converted" / name
        if not path.exists():
            raw = self.raw(preset, seed)
            convert(
                raw / "model.pt",
                raw / "train_config.json",
                raw / "tokenizer",
                path,
                dtype=dtype,
                max_shard_size=SPLIT_SHARD_SIZE if split else "2GB",
                progress=False,
            )
        return path

    def adapter(
        self, base: Path, *, rank: int, targets: tuple[str, ...], seed: int = 0
    ) -> tuple[Path, Path]:
        """A random adapter for the converted model `base`: (adapter.pt, converted dir)."""
        name = f"{base.name}-lora-r{rank}-{'-'.join(targets)}-seed{seed}"
        raw = self.root / "adapters" / f"{name}.pt"
        converted = self.root / "adapters" / name
        if not converted.exists():
            write_demo_adapter(base, raw, rank=rank, targets=targets, seed=seed)
            convert_lora(raw, base, converted, progress=False)
        return raw, converted
