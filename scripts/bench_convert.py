"""Peak memory of `ministream convert` against the output shard size, per checkpoint layout.

The same weights are converted from each layout (`--layouts`): `model.pt` (torch.save,
memory-mapped), `dcp` (a torch.distributed.checkpoint directory, each tensor assembled
from its chunks on its own) and `safetensors` (shards with an index). Each conversion runs
in a fresh process that samples its own /proc/self/status every 10 ms: `RssAnon` is the
memory the converter itself allocates (tensors being read and split, the shard being
assembled); `RssFile` is memory-mapped checkpoint data, page cache that the kernel can
drop at any time. Prints a table and writes JSON.

    make bench-convert     # seed-shaped demo checkpoint (81 M parameters, fp32 → bf16)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ministream_testkit.results import write_json


def _status() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("RssAnon", "RssFile", "VmRSS"):
            out[key] = int(value.split()[0]) * 1024
    return out


def child(checkpoint: Path, raw: Path, out: Path, shard: str, dtype: str) -> dict[str, float]:
    from ministream.convert import convert

    base = _status()
    peak = dict(base)
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for key, value in _status().items():
                peak[key] = max(peak[key], value)
            time.sleep(0.01)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    t0 = time.perf_counter()
    result = convert(
        checkpoint,
        raw / "train_config.json",
        raw / "tokenizer",
        out,
        dtype=dtype,
        max_shard_size=shard,
        progress=False,
    )
    elapsed = time.perf_counter() - t0
    stop.set()
    thread.join()
    sizes = [(out / f).stat().st_size for f in result.manifest.files if f.endswith(".safetensors")]
    return {
        "seconds": elapsed,
        "shards": len(sizes),
        "largest_shard_bytes": max(sizes),
        "output_bytes": sum(sizes),
        "peak_anon_growth_bytes": peak["RssAnon"] - base["RssAnon"],
        "peak_file_backed_bytes": peak["RssFile"] - base["RssFile"],
    }


def _torch_file(raw: Path, out: Path) -> Path:
    return raw / "model.pt"


def _dcp(raw: Path, out: Path) -> Path:
    """`{"model": state dict}` saved by torch.distributed.checkpoint (one process)."""
    import torch.distributed.checkpoint as dcp

    from ministream.checkpoint import load_raw_state_dict

    with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"model": load_raw_state_dict(raw / "model.pt")}, checkpoint_id=out, no_dist=True)
    return out


def _safetensors(raw: Path, out: Path) -> Path:
    """Sharded safetensors with `model.safetensors.index.json` (huggingface_hub's writer)."""
    from huggingface_hub import save_torch_state_dict

    from ministream.checkpoint import load_raw_state_dict

    out.mkdir()
    save_torch_state_dict(load_raw_state_dict(raw / "model.pt"), out, max_shard_size="100MB")
    return out


LAYOUTS: dict[str, Callable[[Path, Path], Path]] = {
    "model.pt": _torch_file,
    "dcp": _dcp,
    "safetensors": _safetensors,
}


def _size(path: Path) -> int:
    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
    return sum(p.stat().st_size for p in files)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--raw", type=Path, help="raw checkpoint dir (default: make one)")
    parser.add_argument("--preset", default="seed")
    parser.add_argument("--shard-sizes", default="25MB,50MB,100MB,2GB")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument(
        "--layouts", default=",".join(LAYOUTS), help=f"comma-separated: {', '.join(LAYOUTS)}"
    )
    parser.add_argument("--out", default=".artifacts/bench-convert.json")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        checkpoint, raw, out, shard = args.child
        print(json.dumps(child(Path(checkpoint), Path(raw), Path(out), shard, args.dtype)))
        return 0

    work = Path(tempfile.mkdtemp(prefix="bench-convert-"))
    try:
        raw = args.raw
        if raw is None:
            from ministream.demo import write_demo_checkpoint

            raw = write_demo_checkpoint(args.preset, work / "raw")
        checkpoints = {
            layout: LAYOUTS[layout](raw, work / f"checkpoint-{layout}")
            for layout in args.layouts.split(",")
        }
        rows = [
            {
                "checkpoint": layout,
                "max_shard_size": shard,
                **_run(args.dtype, checkpoint, raw, work / f"out-{layout}-{shard}", shard),
            }
            for layout, checkpoint in checkpoints.items()
            for shard in args.shard_sizes.split(",")
        ]
        sizes = {layout: _size(path) for layout, path in checkpoints.items()}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "command": " ".join(sys.argv),
        "preset": args.preset,
        "dtype": args.dtype,
        "checkpoint_bytes": sizes,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "runs": rows,
    }
    write_json(Path(args.out), report)
    _print_table(report)
    print(f"JSON: {args.out}")
    return 0


def _run(dtype: str, checkpoint: Path, raw: Path, out: Path, shard: str) -> dict[str, float]:
    """One conversion in a fresh process (its peaks are its own)."""
    proc = subprocess.run(
        [
            sys.executable,
            __file__,
            "--dtype",
            dtype,
            "--child",
            str(checkpoint),
            str(raw),
            str(out),
            shard,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, float] = json.loads(proc.stdout.splitlines()[-1])
    return result


def _print_table(report: dict[str, Any]) -> None:
    mib = 2**20
    rows = report["runs"]
    sizes = ", ".join(f"{k} {v / mib:.0f} MiB" for k, v in report["checkpoint_bytes"].items())
    print(
        f"raw checkpoint ({report['preset']}): {sizes}; "
        f"output {rows[0]['output_bytes'] / mib:.0f} MiB {report['dtype']}"
    )
    print(
        f"{'checkpoint':>12} {'max shard':>10} {'shards':>7} {'largest MiB':>12} "
        f"{'peak anon MiB':>14} {'file-backed MiB':>16} {'s':>6}"
    )
    for r in rows:
        print(
            f"{r['checkpoint']:>12} {r['max_shard_size']:>10} {r['shards']:>7} "
            f"{r['largest_shard_bytes'] / mib:>12.1f} "
            f"{r['peak_anon_growth_bytes'] / mib:>14.1f} "
            f"{r['peak_file_backed_bytes'] / mib:>16.1f} {r['seconds']:>6.1f}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
