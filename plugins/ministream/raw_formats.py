"""Raw checkpoints on disk, read as one tree whose tensors stay on disk until loaded.

Besides `torch.save` files (checkpoint.py), two sharded formats are read here:
- safetensors: one `*.safetensors` file, or shards listed by a `*.safetensors.index.json`;
- a `torch.distributed.checkpoint` (DCP) directory, as FSDP2 and others write it
  (`.metadata` + `__<rank>_<n>.distcp`), read without a process group: each tensor is
  assembled from its shards into one pre-allocated tensor when the converter asks for it.

Every reader returns a `Source`: a tree of dicts (the nesting the checkpoint was saved
with) whose leaves are `TensorRef`s (shape known, tensor read on `load()`) or `Other`
entries (training state such as step counters, never read), and the files it consists of.
"""

from __future__ import annotations

import json
import pickle
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import torch

from ministream.errors import CheckpointError

if TYPE_CHECKING:
    from torch.distributed.checkpoint import FileSystemReader

DCP_METADATA = ".metadata"


@dataclass(frozen=True)
class TensorRef:
    """A tensor of the checkpoint: its shape now, its values from `load()`."""

    shape: tuple[int, ...]
    load: Callable[[], torch.Tensor]

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorRef:
        return cls(tuple(tensor.shape), lambda: tensor)


@dataclass(frozen=True)
class Other:
    """A non-tensor entry (step counter, optimizer settings, ...): described, never read."""

    kind: str


Node: TypeAlias = "TensorRef | Other | Tree"
Tree: TypeAlias = dict[str, Node]


@dataclass(frozen=True)
class Source:
    format: str  # "torch", "safetensors" or "dcp"
    tree: Tree
    root: Path  # `files` are relative to it
    files: tuple[str, ...]


def tree_of(obj: dict[Any, Any]) -> Tree:
    """The tree of a loaded object: tensors as `TensorRef`s, keys as strings."""
    out: Tree = {}
    for key, value in obj.items():
        if isinstance(value, dict):
            out[str(key)] = tree_of(value)
        elif isinstance(value, torch.Tensor):
            out[str(key)] = TensorRef.of(value)
        else:
            out[str(key)] = Other(type(value).__name__)
    return out


# --- safetensors --------------------------------------------------------------------


def read_safetensors(path: Path) -> Source:
    """One `*.safetensors` file."""
    return _safetensors_source(dict.fromkeys(_safetensors_names(path), path.name), path.parent, ())


def read_safetensors_index(index: Path) -> Source:
    """Shards listed by `index` (`{"weight_map": {name: file}}`, as Hugging Face writes it)."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        valid = all(isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items())
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{index}: not a safetensors index ({exc})") from None
    if not valid or not weight_map:
        raise CheckpointError(f"{index}: weight_map must map tensor names to shard files")
    return _safetensors_source(weight_map, index.parent, (index.name,))


def _safetensors_source(weight_map: dict[str, str], root: Path, extra: tuple[str, ...]) -> Source:
    tree: Tree = {}
    for file in sorted(set(weight_map.values())):
        path = root / file
        held = _safetensors_names(path)
        for name in (n for n, f in weight_map.items() if f == file):
            if name not in held:
                raise CheckpointError(f"{path} does not hold {name}, which its index lists there")
            tree[name] = TensorRef(held[name], partial(_safetensors_tensor, path, name))
    files = tuple(sorted({*extra, *weight_map.values()}))
    return Source("safetensors", tree, root, files)


def _safetensors_names(path: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        raise CheckpointError(f"safetensors file not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as fh:
            return {name: tuple(fh.get_slice(name).get_shape()) for name in fh.keys()}  # noqa: SIM118
    except SafetensorError as exc:
        raise CheckpointError(f"{path} is not a readable safetensors file: {exc}") from None


def _safetensors_tensor(path: Path, name: str) -> torch.Tensor:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        return fh.get_tensor(name)


# --- torch.distributed.checkpoint ----------------------------------------------------

# `.metadata` is a plain pickle: only DCP's own metadata classes may be built from it, so a
# tampered file cannot run code (tensor data is read with torch.load(weights_only=True)).
_DCP_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_SAFE_GLOBALS = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (
            (module, name) in _SAFE_GLOBALS
            or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))
            or (module == _DCP_METADATA_MODULE and _defined_in(module, name))
        ):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP metadata")


def _defined_in(module: str, name: str) -> bool:
    """A class of DCP's metadata module itself (its dataclasses and enums)."""
    import importlib

    value = getattr(importlib.import_module(module), name, None)
    return isinstance(value, type) and value.__module__ == module


def read_dcp(directory: Path) -> Source:
    """A DCP directory: the tree from `.metadata`, each tensor loaded on its own."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = _dcp_reader(directory)
    metadata = reader.read_metadata()
    paths = metadata.planner_data if isinstance(metadata.planner_data, dict) else {}
    tree: Tree = {}
    for fqn, item in metadata.state_dict_metadata.items():
        leaf: TensorRef | Other = Other("bytes")
        if isinstance(item, TensorStorageMetadata):
            shape = tuple(item.size)
            leaf = TensorRef(shape, partial(_dcp_tensor, reader, fqn, shape, item.properties.dtype))
        _insert(tree, paths.get(fqn, (fqn,)), leaf, directory)
    files = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())
    return Source("dcp", tree, directory, tuple(files))


def _dcp_reader(directory: Path) -> FileSystemReader:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

    try:
        with open(directory / DCP_METADATA, "rb") as fh:
            metadata = _MetadataUnpickler(fh).load()
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{directory / DCP_METADATA} needs arbitrary code to unpickle ({exc}), which "
            "MiniStream refuses for safety: it was not written by torch.distributed.checkpoint"
        ) from None
    except (EOFError, OSError, ValueError, AttributeError, ImportError) as exc:
        raise CheckpointError(
            f"{directory / DCP_METADATA} is not readable DCP metadata (truncated?): {exc}"
        ) from None
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{directory / DCP_METADATA} holds {type(metadata).__name__}")

    class Reader(FileSystemReader):
        """Serves the metadata read above instead of unpickling `.metadata` for each load."""

        def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
            if metadata.storage_meta is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return Reader(directory)


def _dcp_tensor(
    reader: FileSystemReader, fqn: str, shape: tuple[int, ...], dtype: torch.dtype
) -> torch.Tensor:
    import torch.distributed.checkpoint as dcp

    target = {fqn: torch.empty(shape, dtype=dtype)}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(target, storage_reader=reader, no_dist=True)
    return target[fqn]


def _insert(tree: Tree, path: Iterable[object], leaf: TensorRef | Other, origin: Path) -> None:
    *parents, name = (str(part) for part in path)
    node = tree
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise CheckpointError(f"{origin}: {part!r} is both a value and a dict in the metadata")
        node = child
    node[name] = leaf
