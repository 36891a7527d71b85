"""`make bench-load`: cold-start time and weight throughput of each loading path (docs/loading.md).

For one model (default preset `bench-1b`, ~1.2 GB in bfloat16) this script
1. builds it (demo checkpoint → `ministream convert`), uploads it to a local S3 server (moto,
   a separate process on loopback), shards it for TP=2 and uploads the shard set;
2. measures the raw bandwidth of the same storage in the same run: a plain sequential
   read of the weight files (page cache evicted first), and a plain ranged-GET download of
   the same objects from the same S3 server (64 MiB ranges, one stream, then 4 streams);
3. for each path starts a real `vllm.entrypoints.openai.api_server` (one at a time), times
   process start → `/health` OK, and splits the time by tailing the server log as it is
   written (each marker timestamped when it appears): engine start (imports, processes,
   distributed init) → model built → weights read (vLLM's "Loading weights took", or the
   streamer's 100% line) → weights post-processed → KV cache + profile (vLLM's "init
   engine ... took") → API up;
4. prints a table and writes JSON (default .artifacts/bench-load.json).

Weight bytes/s = bytes of the weight files the path reads / weights-read seconds (for TP=2,
all ranks' bytes over the slowest rank's time). Ratio = that / the raw floor of the same
storage (local read for local paths, S3 GET for S3 paths).

Usage: python scripts/bench_load.py [--preset bench-1b] [--work .artifacts/bench-load]
       [--paths local,runai_streamer,sharded_state,runai_streamer_sharded] [--tp 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ministream.demo import convert_argv
from ministream_sidecar import cpu_memory
from ministream_testkit.processes import evict_from_page_cache
from ministream_testkit.provenance import stamp
from ministream_testkit.s3_server import S3Server
from ministream_testkit.vllm_server import VLLMServer

ROOT = Path(__file__).resolve().parents[1]

MiB = 2**20
PATHS = ("local", "runai_streamer", "sharded_state", "runai_streamer_sharded")
# Log markers, in the order a start passes them.
MARKERS = {
    "load_start": re.compile(r"Starting to load model"),
    "model_built": re.compile(r"Initializing model took ([\d.]+) seconds"),
    "weights_read": re.compile(r"Loading weights took ([\d.]+) seconds"),
    "runai_done": re.compile(r"Loading safetensors using Runai Model Streamer: 100%"),
    "kv_start": re.compile(r"GiB for KV cache|KV cache size"),
    "engine_init": re.compile(
        r"init engine \(profile, create kv cache, warmup model\) "
        r"took ([\d.]+) s"
    ),
}


@dataclass
class LogTail:
    """Timestamps (monotonic) of the first appearance of each marker; all captured values."""

    path: Path
    seen: dict[str, float] = field(default_factory=dict)
    values: dict[str, list[float]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        pos, buf = 0, ""
        while not self.stop.is_set():
            if self.path.exists():
                with open(self.path, errors="replace") as fh:
                    fh.seek(pos)
                    chunk = fh.read()
                    pos = fh.tell()
                now = time.monotonic()
                buf += chunk
                *lines, buf = re.split(r"[\r\n]", buf)
                for line in lines:
                    for name, rx in MARKERS.items():
                        if m := rx.search(line):
                            self.seen.setdefault(name, now)
                            if m.groups():
                                self.values.setdefault(name, []).append(float(m.group(1)))
            time.sleep(0.05)


def raw_local_read(files: list[Path]) -> dict[str, float]:
    evict_from_page_cache(files)
    total, started = 0, time.monotonic()
    for path in files:
        with open(path, "rb", buffering=0) as fh:
            while block := fh.read(16 * MiB):
                total += len(block)
    secs = time.monotonic() - started
    return {"bytes": total, "seconds": secs, "bytes_per_s": total / secs}


def raw_s3_get(
    client: Any, bucket: str, keys: list[tuple[str, int]], streams: int
) -> dict[str, float]:
    ranges = [
        (key, start, min(start + 64 * MiB, size) - 1)
        for key, size in keys
        for start in range(0, size, 64 * MiB)
    ]

    def get(item: tuple[str, int, int]) -> int:
        key, start, end = item
        body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end}")["Body"]
        return sum(len(chunk) for chunk in iter(lambda: body.read(8 * MiB), b""))

    started = time.monotonic()
    with ThreadPoolExecutor(streams) as pool:
        total = sum(pool.map(get, ranges))
    secs = time.monotonic() - started
    return {"bytes": total, "seconds": secs, "bytes_per_s": total / secs, "streams": streams}


def cli(*args: str, env: dict[str, str]) -> float:
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "ministream.cli", *args], check=True, env={**os.environ, **env}
    )
    return time.monotonic() - started


def prepare(args: argparse.Namespace, s3: S3Server, env: dict[str, str]) -> dict[str, Any]:
    work: Path = args.work
    raw, model, shards = work / "raw", work / "model", work / f"shards-tp{args.tp}"
    times: dict[str, float] = {}
    if not (model / "ministream_manifest.json").exists():
        if not (raw / "model.pt").exists():
            times["demo_s"] = cli("demo", "--preset", args.preset, "--output", str(raw), env=env)
        times["convert_s"] = cli(
            *convert_argv(raw, model),
            "--dtype",
            "bfloat16",
            "--quiet",
            env=env,
        )
    times["shard_s"] = cli(
        "shard",
        "--model",
        str(model),
        "--tensor-parallel-size",
        str(args.tp),
        "--output",
        str(shards),
        "--quiet",
        env=env,
    )
    s3.client().create_bucket(Bucket="bench")
    times["upload_model_s"] = cli("upload", str(model), "s3://bench/model", "--quiet", env=env)
    times["upload_shards_s"] = cli("upload", str(shards), "s3://bench/shards", "--quiet", env=env)
    return {"model": model, "shards": shards, "times": times}


def run_path(
    name: str, args: argparse.Namespace, prep: dict[str, Any], env: dict[str, str], log_dir: Path
) -> dict[str, Any]:
    target, tp, fmt, files = _path_target(name, args, prep)
    weight_bytes = sum(p.stat().st_size for p in files)
    evict_from_page_cache(files)  # local paths start cold, like a fresh node
    log = log_dir / f"{name}.log"
    log.unlink(missing_ok=True)
    load_before = os.getloadavg()[0]
    tail, started, healthy = _start_until_healthy(_server(target, tp, fmt, env, log), log)
    return {
        "path": name,
        "tp": tp,
        "load_format": fmt,
        "target": target,
        "weight_bytes": weight_bytes,
        "health_s": healthy - started,
        **_load_phases(tail, started, weight_bytes),
        # 1-min load average at start and at /health: other engines share these 2 cores.
        "loadavg_start": load_before,
        "loadavg_healthy": os.getloadavg()[0],
        "log": str(log),
    }


def _path_target(
    name: str, args: argparse.Namespace, prep: dict[str, Any]
) -> tuple[str, int, str, list[Path]]:
    """What a loading path serves: its model argument, TP size, load format and the weight
    files it reads."""
    model: Path = prep["model"]
    shards: Path = prep["shards"]
    return {
        "local": (str(model), 1, "auto", sorted(model.glob("*.safetensors"))),
        "runai_streamer": (
            "s3://bench/model",
            1,
            "runai_streamer",
            sorted(model.glob("*.safetensors")),
        ),
        "sharded_state": (
            str(shards),
            args.tp,
            "sharded_state",
            sorted(shards.glob("*.safetensors")),
        ),
        "runai_streamer_sharded": (
            "s3://bench/shards",
            args.tp,
            "runai_streamer_sharded",
            sorted(shards.glob("*.safetensors")),
        ),
    }[name]


def _server(target: str, tp: int, fmt: str, env: dict[str, str], log: Path) -> VLLMServer:
    server_env = dict(env)
    if tp == 2:
        server_env["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"
    return VLLMServer(
        model=target,
        log_path=log,
        env=server_env,
        args=[
            "--dtype",
            "bfloat16",
            "--max-model-len",
            "2048",
            "--enforce-eager",
            "--tensor-parallel-size",
            str(tp),
            "--load-format",
            fmt,
        ],
    )


def _start_until_healthy(server: VLLMServer, log: Path) -> tuple[LogTail, float, float]:
    """Start `server` with its log tailed, wait for /health OK, stop it; return the tail and
    the monotonic times of the start and of /health OK."""
    tail = LogTail(log)
    thread = threading.Thread(target=tail.run, daemon=True)
    thread.start()
    started = time.monotonic()
    server.start()
    try:
        server.wait_healthy(timeout=1800)
        healthy = time.monotonic()
    finally:
        time.sleep(0.2)
        tail.stop.set()
        thread.join()
        server.stop()
    return tail, started, healthy


def _load_phases(tail: LogTail, started: float, weight_bytes: int) -> dict[str, Any]:
    """The start split by the log's markers (seconds from `started`, or vLLM's own figures)."""
    seen, values = tail.seen, tail.values

    def at(marker: str) -> float | None:
        return seen[marker] - started if marker in seen else None

    built = at("model_built")
    if "weights_read" in values:  # default and sharded loaders log it (per rank)
        weights_s = max(values["weights_read"])
    else:  # the Run:ai loader does not: from "model built" to the streamer's 100% line
        done = at("runai_done")
        weights_s = (done - built) if (done is not None and built is not None) else float("nan")
    kv_start, load_start = at("kv_start"), at("load_start")
    return {
        "engine_start_s": at("load_start"),
        "model_init_s": max(values.get("model_built", [float("nan")])),
        "weights_s": weights_s,
        "weight_bytes_per_s": weight_bytes / weights_s,
        # build + read + post-process (CPU repacking), measured from the log
        "load_total_s": (kv_start - load_start) if kv_start and load_start else None,
        "kv_cache_profile_s": max(values.get("engine_init", [float("nan")])),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="bench-1b")
    parser.add_argument("--work", type=Path, default=ROOT / ".artifacts" / "bench-load")
    parser.add_argument("--out", type=Path, default=ROOT / ".artifacts" / "bench-load.json")
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--tp", type=int, default=2)
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)

    # No auth, no delays, ranged GETs served with a seek (see ministream_testkit/s3_server.py).
    s3 = S3Server(args.work / "s3", fast_ranges=True).start()
    env = {
        **s3.env(),
        "VLLM_ASSETS_CACHE": str(args.work / "vllm-assets"),
        # The same cache at every path and on every machine: the timings compare.
        **cpu_memory.pinned(),
    }
    try:
        for key, value in env.items():
            os.environ[key] = value
        prep = prepare(args, s3, env)
        model_files = sorted(prep["model"].glob("*.safetensors"))
        client = s3.client()
        keys = [(f"model/{p.name}", p.stat().st_size) for p in model_files]
        raw = {
            "local_read": raw_local_read(model_files),
            "s3_get_1_stream": raw_s3_get(client, "bench", keys, 1),
            "s3_get_4_streams": raw_s3_get(client, "bench", keys, 4),
        }
        results = []
        for name in args.paths.split(","):
            try:
                results.append(run_path(name, args, prep, env, args.work))
            except Exception as exc:  # one broken path must not hide the others' figures
                first_line = str(exc).splitlines()[0] if str(exc) else ""
                results.append({"path": name, "error": f"{type(exc).__name__}: {first_line}"})
    finally:
        s3.stop()
    report = {
        "preset": args.preset,
        "model_bytes": sum(p.stat().st_size for p in model_files),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "prepare_seconds": prep["times"],
        "raw": raw,
        "paths": results,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
    add_ratios(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(stamp(report), indent=2, default=str))
    print(table(report))
    print(f"\nwrote {args.out}")
    return 0


def add_ratios(report: dict[str, Any]) -> None:
    """Ratio to the raw floor of the same storage: the sequential file read for local paths,
    the better of the 1- and 4-stream ranged-GET downloads for S3 paths."""
    raw = report["raw"]
    s3_floor = max(raw["s3_get_1_stream"]["bytes_per_s"], raw["s3_get_4_streams"]["bytes_per_s"])
    for r in report["paths"]:
        if "error" in r:
            continue
        local = r["path"] in ("local", "sharded_state")
        floor = raw["local_read"]["bytes_per_s"] if local else s3_floor
        r["raw_floor_bytes_per_s"] = floor
        r["ratio_to_floor"] = r["weight_bytes_per_s"] / floor


def table(report: dict[str, Any]) -> str:
    mb = 1e6
    raw = report["raw"]
    lines = [
        f"model: {report['preset']}, {report['model_bytes'] / mb:.0f} MB of weights; "
        f"raw floor: local read {raw['local_read']['bytes_per_s'] / mb:.0f} MB/s, "
        f"S3 ranged GET {raw['s3_get_1_stream']['bytes_per_s'] / mb:.0f} MB/s (1 stream), "
        f"{raw['s3_get_4_streams']['bytes_per_s'] / mb:.0f} MB/s (4 streams)",
        "",
        "| path | TP | start→/health s | engine start s | weights s | weights MB/s "
        "| raw floor MB/s | ratio | build+read+repack s | KV cache+profile s | load avg |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["paths"]:

        def f(v: Any, spec: str = ".1f") -> str:
            return "n/a" if v is None else format(v, spec)

        lines.append(
            f"| {r['path']} | {r['tp']} | {f(r['health_s'])} | {f(r['engine_start_s'])} | "
            f"{f(r['weights_s'], '.2f')} | {r['weight_bytes_per_s'] / mb:.0f} | "
            f"{r['raw_floor_bytes_per_s'] / mb:.0f} | {r['ratio_to_floor']:.2f} | "
            f"{f(r['load_total_s'])} | {f(r['kv_cache_profile_s'])} | "
            f"{r['loadavg_start']:.1f}→{r['loadavg_healthy']:.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
