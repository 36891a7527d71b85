"""Demo checkpoints and converted model directories, built once per test session."""

from __future__ import annotations

from pathlib import Path

from ministream.convert import convert
from ministream.demo import write_demo_checkpoint


class ModelFactory:
    """Caches raw demo checkpoints and their conversions under one session directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def raw(self, preset: str) -> Path:
        path = self.root / "raw" / preset
        if not path.exists():
            write_demo_checkpoint(preset, path)
        return path

    def converted(self, preset: str, dtype: str = "float32") -> Path:
        path = self.root / "converted" / f"{preset}-{dtype}"
        if not path.exists():
            raw = self.raw(preset)
            convert(
                raw / "model.pt",
                raw / "train_config.json",
                raw / "tokenizer",
                path,
                dtype=dtype,
                progress=False,
            )
        return path
