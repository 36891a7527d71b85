"""Reading a raw training checkpoint safely, one tensor at a time.

`open_raw_checkpoint` accepts a `torch.save` file (`model.pt`), a safetensors file or a
sharded set with its index, or a torch.distributed.checkpoint directory (raw_formats.py),
finds the model's state dict inside it (raw_layouts.py) and returns `RawTensors`: the
names and shapes, each tensor read from disk only when it is popped.

`torch.load(..., weights_only=True)` refuses pickles that need arbitrary code; `mmap=True`
keeps tensors on disk until touched (torch's zipfile format is required for that).
"""

from __future__ import annotations

import hashlib
import math
import pickle
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ministream.errors import CheckpointError
from ministream.manifest import sha256_file
from ministream.raw_formats import (
    DCP_METADATA,
    Source,
    TensorRef,
    read_dcp,
    read_safetensors,
    read_safetensors_index,
    tree_of,
)
from ministream.raw_layouts import Layout, select_state_dict

ACCEPTED = (
    "a torch.save file (model.pt), a .safetensors file, a *.safetensors.index.json (or a "
    "directory holding one, or a single .safetensors file), or a "
    "torch.distributed.checkpoint directory (with .metadata)"
)


class RawTensors:
    """The selected state dict: every name's shape now, its tensor when it is popped."""

    def __init__(self, tensors: dict[str, TensorRef]) -> None:
        self._tensors = dict(tensors)
        self.shapes = {name: ref.shape for name, ref in tensors.items()}

    def pop(self, name: str) -> torch.Tensor:
        """Read `name` and forget it: the converter holds one raw tensor at a time."""
        return self._tensors.pop(name).load()

    def numel(self, name: str) -> int:
        return math.prod(self.shapes[name])

    def load_all(self) -> dict[str, torch.Tensor]:
        return {name: self.pop(name) for name in list(self._tensors)}

    def __len__(self) -> int:
        return len(self._tensors)

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)


@dataclass
class RawCheckpoint:
    tensors: RawTensors
    format: str  # "torch", "safetensors" or "dcp"
    prefix: str  # removed in front of the stored names to reach the model's own names
    root: Path
    files: tuple[str, ...]

    def sha256(self) -> str:
        """The file's sha256; for a checkpoint of several files, see `sha256_files`."""
        if len(self.files) == 1:
            return sha256_file(self.root / self.files[0])
        return sha256_files(self.root, self.files)


def open_raw_checkpoint(path: str | Path, layout: Layout | None = None) -> RawCheckpoint:
    path = Path(path)
    source = _read(path)
    selection = select_state_dict(source.tree, layout or Layout(), str(path))
    return RawCheckpoint(
        RawTensors(selection.tensors), source.format, selection.prefix, source.root, source.files
    )


def load_raw_state_dict(path: str | Path, layout: Layout | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of the raw checkpoint's state dict (memory-mapped where the format allows)."""
    return open_raw_checkpoint(path, layout).tensors.load_all()


def _read(path: Path) -> Source:
    if path.is_dir():
        if (path / DCP_METADATA).is_file():
            return read_dcp(path)
        indexes = sorted(path.glob("*.safetensors.index.json"))
        if len(indexes) == 1:
            return read_safetensors_index(indexes[0])
        files = sorted(path.glob("*.safetensors"))
        if not indexes and len(files) == 1:
            return read_safetensors(files[0])
        raise CheckpointError(
            f"{path} is a directory without {DCP_METADATA}, with {len(indexes)} "
            f"*.safetensors.index.json and {len(files)} *.safetensors files; --checkpoint "
            f"takes {ACCEPTED}"
        )
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    if path.name.endswith(".safetensors.index.json"):
        return read_safetensors_index(path)
    if path.suffix == ".safetensors":
        return read_safetensors(path)
    return _read_torch(path)


def _read_torch(path: Path) -> Source:
    obj = load_torch_file(
        path,
        what="torch checkpoint",
        expected=f"--checkpoint takes {ACCEPTED}",
        mmap=zipfile.is_zipfile(path),
    )
    if not isinstance(obj, dict) or not obj:
        raise CheckpointError(
            f"{path} holds {type(obj).__name__}, not a state dict (a dict of tensors, or a "
            "dict with the state dict under a key such as 'model')"
        )
    return Source("torch", tree_of(obj), path.parent, (path.name,))


def sha256_files(root: Path, names: Sequence[str]) -> str:
    """The sha256 of `sha256sum`'s listing of `names` (paths relative to `root`, sorted):

        cd ROOT && find . -type f -printf '%P\\n' | LC_ALL=C sort | xargs -d '\\n' sha256sum \\
            | sha256sum

    (for a DCP directory every file in it; for sharded safetensors the index and its shards).
    """
    listing = "".join(f"{sha256_file(root / name)}  {name}\n" for name in sorted(names))
    return hashlib.sha256(listing.encode()).hexdigest()


# torch.save writes a zip archive with `<name>/data.pkl` (since torch 1.6), or before that a
# pickle stream, which opens with PROTO and its protocol number (2 to 5).
_PICKLE_STARTS = tuple(bytes([0x80, protocol]) for protocol in range(2, 6))
# The paragraphs of torch's weights_only error that are its own advice, not the reason.
_TORCH_BOILERPLATE = ("Weights only load failed", "Please file an issue", "Check the documentation")


def torch_file_kind(path: Path) -> str | None:
    """ "zip" or "pickle" for what torch.save writes; None for anything else."""
    with open(path, "rb") as fh:
        head = fh.read(4)
    if head == b"PK\x03\x04" and not zipfile.is_zipfile(path):
        return "zip"  # the archive's end is missing: a truncated torch.save zip, most likely
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError):
            return None
        return "zip" if any(n.endswith("/data.pkl") or n == "data.pkl" for n in names) else None
    return "pickle" if head[:2] in _PICKLE_STARTS else None


def _unpickler_reason(exc: BaseException) -> str:
    """torch's reason for refusing a weights_only load, without its advice around it (to
    re-run with weights_only=False, which runs the file's code, or to file an issue)."""
    paragraphs = [p.strip() for p in str(exc).split("\n\n") if p.strip()]
    reasons = [p for p in paragraphs if not p.startswith(_TORCH_BOILERPLATE)]
    return " ".join(" ".join(reasons).split()) if reasons else _first_line(exc)


def load_torch_file(path: Path, *, what: str, expected: str, mmap: bool = False) -> object:
    """`torch.load(path, weights_only=True)`, with an error that says which of three things
    is wrong: the file is not a torch.save file at all (`expected` says what to pass), it is
    one whose unpickling needs arbitrary code (refused), or it is damaged."""
    kind = torch_file_kind(path)
    if kind is None:
        with open(path, "rb") as fh:
            head = fh.read(8)
        raise CheckpointError(
            f"{path} is not a {what}: torch.save writes a zip archive holding data.pkl (or, "
            f"before torch 1.6, a pickle), and this file starts with {head!r}. {expected}."
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        # torch's safe unpickler refuses what is not plain tensors and containers: a class or
        # function to call, or an opcode it does not know (a frame of protocol 4 and up).
        raise CheckpointError(
            f"{path} cannot be loaded with weights_only=True: it needs arbitrary code to "
            f"unpickle, which MiniStream refuses for safety ({_unpickler_reason(exc)}). Re-save "
            "it from the training framework as plain tensors (torch.save(model.state_dict(), "
            "path))."
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise CheckpointError(
            f"{path} is not a readable {what} (a torch.save {kind}, truncated or corrupt?): "
            f"{_first_line(exc)}"
        ) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
