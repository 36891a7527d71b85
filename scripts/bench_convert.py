"""Peak memory of `ministream convert` against the output shard size.

Each conversion runs in a fresh process that samples its own /proc/self/status every
10 ms: `RssAnon` is the memory the converter itself allocates (tensors being split and
the shard being assembled); `RssFile` is the memory-mapped checkpoint, page cache that the
kernel can drop at any time. Prints a table and writes JSON.

    make bench-convert     # seed-shaped demo checkpoint (81 M parameters, fp32 → bf16)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def _status() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("RssAnon", "RssFile", "VmRSS"):
            out[key] = int(value.split()[0]) * 1024
    return out


def child(raw: Path, out: Path, shard: str, dtype: str) -> dict[str, float]:
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
        raw / "model.pt",
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


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--raw", type=Path, help="raw checkpoint dir (default: make one)")
    parser.add_argument("--preset", default="seed")
    parser.add_argument("--shard-sizes", default="25MB,50MB,100MB,2GB")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", default=".artifacts/bench-convert.json")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        raw, out, shard = args.child
        print(json.dumps(child(Path(raw), Path(out), shard, args.dtype)))
        return 0

    work = Path(tempfile.mkdtemp(prefix="bench-convert-"))
    raw = args.raw
    if raw is None:
        from ministream.demo import write_demo_checkpoint

        raw = write_demo_checkpoint(args.preset, work / "raw")
    rows = []
    for shard in args.shard_sizes.split(","):
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--dtype",
                args.dtype,
                "--child",
                str(raw),
                str(work / f"out-{shard}"),
                shard,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append({"max_shard_size": shard, **json.loads(proc.stdout.splitlines()[-1])})
    report = {
        "command": " ".join(sys.argv),
        "preset": args.preset,
        "dtype": args.dtype,
        "raw_checkpoint_bytes": (raw / "model.pt").stat().st_size,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "runs": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    mib = 2**20
    print(
        f"raw checkpoint {report['raw_checkpoint_bytes'] / mib:.0f} MiB ({args.preset}), "
        f"output {rows[0]['output_bytes'] / mib:.0f} MiB {args.dtype}"
    )
    print(
        f"{'max shard':>10} {'shards':>7} {'largest MiB':>12} {'peak anon MiB':>14} "
        f"{'file-backed MiB':>16} {'s':>6}"
    )
    for r in rows:
        print(
            f"{r['max_shard_size']:>10} {r['shards']:>7} {r['largest_shard_bytes'] / mib:>12.1f} "
            f"{r['peak_anon_growth_bytes'] / mib:>14.1f} "
            f"{r['peak_file_backed_bytes'] / mib:>16.1f} {r['seconds']:>6.1f}"
        )
    print(f"JSON: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
