"""Reading MiniStream's raw training checkpoint (`model.pt`) safely.

`torch.load(..., weights_only=True)` refuses pickles that need arbitrary code; `mmap=True`
keeps tensors on disk until touched, so the converter reads one tensor at a time instead
of holding the model twice (torch's zipfile format is required for that).
"""

from __future__ import annotations

import hashlib
import pickle
import zipfile
from pathlib import Path

import torch

from ministream.errors import CheckpointError

# Keys of a training checkpoint dict that are training state, never weights (DESIGN §3).
_STATE_DICT_KEY = "model"


def load_raw_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Return the raw checkpoint's state dict (memory-mapped where the format allows)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    mmap = zipfile.is_zipfile(path)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{path} cannot be loaded with weights_only=True: it needs arbitrary code to "
            f"unpickle, which MiniStream refuses for safety ({_first_line(exc)}). Re-save it "
            "from the training framework as a plain state dict (torch.save(model.state_dict(), "
            "path))."
        ) from None
    except (RuntimeError, EOFError, OSError, zipfile.BadZipFile) as exc:
        raise CheckpointError(
            f"{path} is not a readable torch checkpoint (truncated or corrupt?): {_first_line(exc)}"
        ) from None
    if isinstance(obj, dict) and isinstance(obj.get(_STATE_DICT_KEY), dict):
        obj = obj[_STATE_DICT_KEY]
    if not isinstance(obj, dict) or not obj:
        raise CheckpointError(
            f"{path} holds {type(obj).__name__}, not a state dict (a dict of tensors, or a "
            f"dict with the state dict under {_STATE_DICT_KEY!r})"
        )
    bad = sorted(k for k, v in obj.items() if not isinstance(v, torch.Tensor))
    if bad:
        raise CheckpointError(f"{path}: state dict entries are not tensors: {', '.join(bad)}")
    return obj


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
