"""Hostile LoRA adapters: a good `convert-lora` directory rewritten the way a hostile producer
would, with a fresh manifest over the changed files, so only content checks can catch it."""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from pathlib import Path

from safetensors.torch import load_file, save_file

from ministream.manifest import MANIFEST_NAME, Manifest, verify_dir


def resealed(src: Path, dest: Path, edit: Callable[[Path], None]) -> Path:
    """A copy of `src` changed by `edit(dir)`, with a manifest that matches the change."""
    shutil.copytree(src, dest)
    edit(dest)
    old = Manifest.load(dest)
    fresh = Manifest.build(dest, source=old.source, dtype=old.dtype)
    (dest / MANIFEST_NAME).write_text(fresh.to_json())
    verify_dir(dest)
    return dest


def weights_file(d: Path) -> Path:
    return next(d.glob("*.safetensors"))


def with_nan(d: Path) -> None:
    tensors = load_file(str(weights_file(d)))
    key = sorted(tensors)[0]
    tensors[key][0, 0] = math.nan
    save_file(tensors, str(weights_file(d)), metadata={"format": "pt"})
