"""The manifest of a converted model directory: what was written, from what, by whom.

`ministream_manifest.json` lists the sha256 and size of every other file in the directory,
the sha256 of the source checkpoint and train config, and the converter version. The
`model_hash` (a hash over the sorted file hashes) names the model: shard sets record it,
uploads verify against it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ministream.errors import CheckpointError
from ministream.member_names import outside_names

MANIFEST_NAME = "ministream_manifest.json"


def sha256_file(
    path: str | Path, chunk: int = 1 << 22, on_bytes: Callable[[int], object] | None = None
) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
            if on_bytes is not None:
                on_bytes(len(block))
    return digest.hexdigest()


FORMAT_VERSION = 1


def converter_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ministream-serving")
    except PackageNotFoundError:  # running from a source tree
        return "0+unknown"


def model_hash(files: dict[str, dict[str, Any]]) -> str:
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(f"{name}\0{files[name]['sha256']}\n".encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class Manifest:
    files: dict[str, dict[str, Any]]  # name -> {"sha256": ..., "size": ...}
    source: dict[str, Any]
    converter_version: str
    dtype: str

    @property
    def model_hash(self) -> str:
        return model_hash(self.files)

    def to_json(self) -> str:
        return (
            json.dumps(
                {
                    "format_version": FORMAT_VERSION,
                    "model_hash": self.model_hash,
                    "converter_version": self.converter_version,
                    "dtype": self.dtype,
                    "source": self.source,
                    "files": self.files,
                },
                indent=2,
                sort_keys=True,
            )
            + "\n"
        )

    @classmethod
    def build(cls, model_dir: Path, source: dict[str, Any], dtype: str) -> Manifest:
        files = {
            path.relative_to(model_dir).as_posix(): {
                "sha256": sha256_file(path),
                "size": path.stat().st_size,
            }
            for path in sorted(model_dir.rglob("*"))
            if path.is_file() and path.name != MANIFEST_NAME
        }
        outside = sorted(
            name
            for name in files
            if not (model_dir / name).resolve().is_relative_to(model_dir.resolve())
        )
        if outside:
            raise CheckpointError(
                f"{model_dir}: {', '.join(outside)} link(s) outside the directory; refusing "
                "to record a file from elsewhere in the manifest"
            )
        return cls(files=files, source=source, converter_version=converter_version(), dtype=dtype)

    @classmethod
    def parse(cls, text: str, origin: str) -> Manifest:
        try:
            raw = json.loads(text)
            manifest = cls(
                files=raw["files"],
                source=raw["source"],
                converter_version=raw["converter_version"],
                dtype=raw["dtype"],
            )
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{origin}: not a valid MiniStream manifest ({exc})") from None
        if not isinstance(manifest.files, dict):
            raise CheckpointError(f"{origin}: not a valid MiniStream manifest (files)")
        bad = outside_names(manifest.files)
        if bad:
            raise CheckpointError(
                f"{origin}: names paths outside the model directory: {', '.join(bad)}; "
                "refusing to read or write them"
            )
        if raw.get("model_hash") != manifest.model_hash:
            raise CheckpointError(f"{origin}: manifest model_hash does not match its file list")
        return manifest

    @classmethod
    def load(cls, model_dir: str | Path) -> Manifest:
        path = Path(model_dir) / MANIFEST_NAME
        if not path.is_file():
            raise CheckpointError(
                f"{model_dir} has no {MANIFEST_NAME}: it was not written by `ministream "
                "convert`, or the conversion did not finish"
            )
        return cls.parse(path.read_text(), str(path))


def verify_dir(model_dir: str | Path, *, progress: bool = False) -> Manifest:
    """Check every file listed in the manifest (size and sha256); name each problem.
    `progress` shows a bar over the bytes hashed (a large model takes minutes)."""
    model_dir = Path(model_dir)
    if not model_dir.exists():
        raise CheckpointError(
            f"{model_dir} does not exist: pass a directory written by `ministream convert` "
            "(or convert-lora, or shard)"
        )
    if not model_dir.is_dir():
        raise CheckpointError(f"{model_dir} is a file, not a directory written by ministream")
    manifest = Manifest.load(model_dir)
    problems = []
    root = model_dir.resolve()
    total = sum(int(meta.get("size") or 0) for meta in manifest.files.values())
    from tqdm import tqdm

    with tqdm(total=total, unit="B", unit_scale=True, desc="verify", disable=not progress) as bar:
        for name, meta in sorted(manifest.files.items()):
            path = model_dir / name
            if not path.resolve().is_relative_to(root):
                # A link out of the directory: verify would hash, and upload send, a file from
                # elsewhere on this machine (an adapter directory handed in by someone else).
                problems.append(f"{name}: a link to {path.resolve()}, outside the directory")
            elif not path.is_file():
                problems.append(f"{name}: missing")
            elif path.stat().st_size != meta["size"]:
                problems.append(f"{name}: size {path.stat().st_size} != {meta['size']}")
            elif sha256_file(path, on_bytes=bar.update) != meta["sha256"]:
                problems.append(f"{name}: sha256 mismatch")
    stray = sorted(
        p.relative_to(model_dir).as_posix()
        for p in model_dir.rglob("*.safetensors")
        if p.relative_to(model_dir).as_posix() not in manifest.files
    )
    problems += [f"{name}: stray weights file not in the manifest" for name in stray]
    if problems:
        raise CheckpointError(f"{model_dir} failed verification: " + "; ".join(problems))
    return manifest
