"""Ship vLLM's compile artifacts with the model, and use them only where they fit.

A pod that starts with an empty `VLLM_CACHE_ROOT` (the chart's emptyDir) compiles the model
with torch.compile and JIT-compiles Triton kernels: on the H200 a forked start of gpu-1b
took 61 s to Ready with an empty cache and 29 s seeded with the cache of an earlier start
(docs/benchmarks.md, run 9). This packs that directory once, and unpacks it where the
versions, the accelerator and the model all match, so a node that never ran the model
starts warm without a shared PVC:

    ministream compile-cache pack --cache-root /var/cache/vllm --model DIR_OR_S3_URL \
        --out cache.tar                           # after a start, where vLLM wrote the cache
    ministream compile-cache unpack --archive PATH_OR_S3_URL --cache-root /var/cache/vllm \
        --model DIR_OR_S3_URL                     # before vLLM starts (the chart's init
                                                  # container: compileCache.seedArchive)

The archive holds the whole cache root and a manifest. `unpack` checks the manifest against
this machine first: vLLM version, torch version, accelerator (name and compute capability,
from nvidia-smi: no CUDA context, no torch import) and the model's hash (its
`ministream_manifest.json`, local or on S3). On any mismatch, or when the cache root already
holds something (a kept PVC), it extracts nothing and says why; vLLM then compiles as usual.
It exits 0 either way, so a pod never fails over a cache; an unreadable archive location is
reported the same way.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from ministream.errors import CheckpointError, MiniStreamError, StorageError
from ministream.s3 import download, is_s3, make_client, parse_url
from ministream.versions import installed_vllm

MANIFEST = "ministream-compile-cache.json"
FORMAT_VERSION = 1
# The whole VLLM_CACHE_ROOT travels: besides torch.compile's artifacts
# (torch_compile_cache/) it holds what vLLM 0.25's V2 runner compiles at its kernel
# warmup (Triton's cache, which the chart points inside it; deep_gemm/, FlashInfer
# autotune results). On the H200 a warm root cut torch.compile from 18-21 s to 3.1-3.6 s
# and that warmup from 14-18 s to 0.6 s (docs/benchmarks.md, H200).


def _torch_version() -> str:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _vllm_version() -> str:
    """The installed vLLM's version without the build's name: packed archives record it so,
    and unpacking compares it."""
    found = installed_vllm()
    return found[1] if found else "absent"


def accelerator() -> str:
    """`NVIDIA H200 sm_90` from nvidia-smi (no CUDA context needed), else `cpu`."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            ).stdout.splitlines()[0]
            name, cap = (s.strip() for s in out.split(","))
            return f"{name} sm_{cap.replace('.', '')}"
        except (OSError, subprocess.SubprocessError, IndexError, ValueError):
            pass
    return "cpu"


def model_hash(model: str | Path) -> str:
    """The converter's model hash (its manifest, local or on S3); for a local directory
    without one, a hash of its config and weight index."""
    from ministream.load_guard import Location
    from ministream.manifest import MANIFEST_NAME

    text = Location(str(model)).read_text(MANIFEST_NAME)
    if text is not None:
        return str(json.loads(text)["model_hash"])
    root = Path(model)
    digest = hashlib.sha256()
    for name in ("config.json", "model.safetensors.index.json"):
        if (root / name).exists():
            digest.update((root / name).read_bytes())
    return digest.hexdigest()


def identity(model: str | Path) -> dict[str, str]:
    return {
        "vllm": _vllm_version(),
        "torch": _torch_version(),
        "accelerator": accelerator(),
        "model_hash": model_hash(model),
    }


def pack(cache_root: Path, model: str, out: Path) -> dict[str, Any]:
    members = sorted(p for p in cache_root.iterdir() if p.resolve() != out.resolve())
    if not members:
        raise CheckpointError(
            f"nothing to pack: {cache_root} is empty. Pack the VLLM_CACHE_ROOT of a server "
            "that has started with this model"
        )
    manifest = {"format_version": FORMAT_VERSION, "created": time.time()} | identity(model)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w") as tar:
        data = json.dumps(manifest, indent=2).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size, info.mtime = len(data), int(time.time())
        tar.addfile(info, io.BytesIO(data))
        for path in members:
            tar.add(path, arcname=path.name)
    tmp.replace(out)
    return manifest | {"bytes": out.stat().st_size}


def mismatches(manifest: dict[str, Any], here: dict[str, str]) -> list[str]:
    if manifest.get("format_version") != FORMAT_VERSION:
        return [f"format_version {manifest.get('format_version')} != {FORMAT_VERSION}"]
    return [
        f"{key}: archive {manifest.get(key)!r}, here {value!r}"
        for key, value in here.items()
        if manifest.get(key) != value
    ]


def unpack(archive: str | Path, cache_root: Path, model: str) -> dict[str, Any]:
    """Extract `archive` into an empty `cache_root` when it was made for this machine and
    model; `{"seeded": False, "reason": ...}` otherwise, with nothing left behind. Never
    raises for a bad, missing or unreadable archive: a pod must not fail over its cache."""
    if cache_root.exists() and any(cache_root.iterdir()):
        return {"seeded": False, "reason": f"{cache_root} is not empty (kept from a run)"}
    try:
        if not is_s3(str(archive)):
            return _unpack_local(Path(archive), cache_root, model)
        with tempfile.TemporaryDirectory(prefix="compile-cache-") as tmp:
            url, name = str(archive).rsplit("/", 1)
            try:
                download(make_client(), parse_url(url), [name], Path(tmp))
            except StorageError as exc:
                return {"seeded": False, "reason": f"cannot read {archive}: {exc}"}
            return _unpack_local(Path(tmp) / name, cache_root, model)
    except (MiniStreamError, OSError, tarfile.TarError, ValueError, KeyError) as exc:
        return {"seeded": False, "reason": f"{archive}: {type(exc).__name__}: {exc}"}


def _unpack_local(archive: Path, cache_root: Path, model: str) -> dict[str, Any]:
    if not archive.exists():
        return {"seeded": False, "reason": f"no archive at {archive}"}
    with tarfile.open(archive) as tar:
        if MANIFEST not in tar.getnames():
            return {"seeded": False, "reason": "archive has no manifest"}
        member = tar.extractfile(MANIFEST)
        manifest = json.loads(member.read()) if member is not None else {}
        wrong = mismatches(manifest, identity(model))
        if wrong:
            return {"seeded": False, "reason": "; ".join(wrong)}
        names = [m for m in tar.getmembers() if m.name != MANIFEST]
        # The "data" filter refuses absolute paths, `..` and links leaving the folder;
        # checked for every member before anything is written.
        try:
            for info in names:
                tarfile.data_filter(info, str(cache_root))
        except tarfile.FilterError as exc:
            return {"seeded": False, "reason": f"archive holds an unsafe path: {exc}"}
        # Into a folder beside the entries first, then each top-level entry renamed into
        # place: a full disk or a broken archive leaves the cache root as it was (empty).
        cache_root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".seeding-", dir=cache_root))
        try:
            tar.extractall(staging, members=names, filter="data")
            for entry in sorted(staging.iterdir()):
                entry.replace(cache_root / entry.name)
        except BaseException:
            for entry in cache_root.iterdir():
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return {"seeded": True, "manifest": manifest}


def add_parser(sub: Any) -> None:
    """`ministream compile-cache pack|unpack` (cli.py)."""
    parser = sub.add_parser(
        "compile-cache",
        help="pack vLLM's compile cache with the model, or seed an empty one from it",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="action", required=True)
    p = actions.add_parser("pack", help="archive VLLM_CACHE_ROOT's compile artifacts + manifest")
    p.add_argument("--cache-root", required=True, type=Path)
    p.add_argument("--model", required=True, help="the served model: directory or s3:// URL")
    p.add_argument("--out", required=True, type=Path)
    u = actions.add_parser(
        "unpack", help="check the manifest, then extract into an empty VLLM_CACHE_ROOT"
    )
    u.add_argument("--archive", required=True, help="a path or an s3:// URL")
    u.add_argument("--cache-root", required=True, type=Path)
    u.add_argument("--model", required=True, help="the served model: directory or s3:// URL")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    if args.action == "pack":
        result = pack(args.cache_root, args.model, args.out)
    else:
        result = unpack(args.archive, args.cache_root, args.model)
    result["seconds"] = round(time.perf_counter() - t0, 3)
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
