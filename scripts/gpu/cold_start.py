"""Time to Ready of one vLLM OpenAI server, split into phases.

Starts the server as a subprocess exactly as a pod would (plain `vllm serve DIR` with
vLLM's defaults, or the chart's command, arguments and environment from
chart-defaults.json, rendered by chart_args.py), stamps every output line with its
arrival time, polls GET /health, then sends the sidecar's warmup (the chart's request
count, concurrency, prompt and output lengths) and stops the server with SIGTERM.
ministream_sidecar.startup_phases (the parser the sidecar's cold-start metrics use) turns
the lines into phases; the result goes to OUT/NAME.json and the stamped log to OUT/NAME.log.
The process is started and stopped by ministream_testkit's VLLMServer (`PodServer`:
the pod's own command line, none of the tests' environment, each line handed over as it
arrives).

    python scripts/gpu/cold_start.py run --name chart-fresh --mode chart --model DIR \
        --out OUT --cache-root /tmp/cache/a --fresh-cache
    python scripts/gpu/cold_start.py table OUT      # markdown table of every run in OUT
    python scripts/gpu/cold_start.py summary OUT... # per variant: median [min–max] per phase
    python scripts/gpu/cold_start.py pairs OUT... --a V1 --b V2  # V1 against V2, start by start

Caches: `--cache-root` is VLLM_CACHE_ROOT (Triton's cache inside it, as the chart sets
it); `--fresh-cache` empties it first (a node that never ran the model);
`--seed-cache-from DIR` first copies DIR's contents there (compile artifacts brought from
elsewhere). TorchInductor's own cache always starts empty (in a pod it lives in /tmp).
`--prefetch PATH` (repeatable) starts a reader of every file under PATH at the same moment
as the server (as a container command could: `(cat FILES >/dev/null &); exec vllm ...`),
so the weights and compile cache reach the page cache while Python imports.

Every result carries the provenance block (ministream_testkit.provenance: commit, command,
machine, versions, and whether torch/vLLM had bytecode as this process sees it; the server
inherits this process's environment, so PYTHONPYCACHEPREFIX set here applies to both).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ministream.startup_log import ENV as STARTUP_LOG_ENV
from ministream_sidecar.startup_phases import PHASES, parse
from ministream_testkit.results import write_json
from ministream_testkit.vllm_server import VLLMServer

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # scripts/: the one statistics module

from interval_stats import paired_difference_interval  # noqa: E402

CHART_DEFAULTS = HERE / "chart-defaults.json"
TABLE_PHASES = (
    [p for p, _, _ in PHASES[:4]] + ["compile", "profiling"] + [p for p, _, _ in PHASES[4:]]
)


def _set_flag(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    if flag in out:
        out[out.index(flag) + 1] = value
    else:
        out += [flag, value]
    return out


def drop_flag(argv: list[str], flag: str) -> list[str]:
    """argv without `flag` and the values after it (up to the next flag)."""
    if flag not in argv:
        return list(argv)
    i = argv.index(flag)
    rest = argv[i + 1 :]
    end = next((k for k, a in enumerate(rest) if a.startswith("-")), len(rest))
    return argv[:i] + rest[end:]


def server_command(
    mode: str, model: str, port: int, chart_defaults: Path = CHART_DEFAULTS
) -> tuple[list[str], dict[str, str], str]:
    """argv, env and served model name for `mode` (vllm-defaults | chart)."""
    if mode == "vllm-defaults":  # `vllm serve DIR`, as the console script runs it
        argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model]
        return _set_flag(argv, "--port", str(port)), {}, model
    chart = json.loads(chart_defaults.read_text())
    argv = [sys.executable, *chart["argv"][1:]] if chart["argv"][0] == "python3" else chart["argv"]
    argv = _set_flag(_set_flag(argv, "--model", model), "--port", str(port))
    argv = _set_flag(argv, "--host", "127.0.0.1")
    name = argv[argv.index("--served-model-name") + 1] if "--served-model-name" in argv else model
    return argv, dict(chart["env"]), name


def _http(url: str, body: dict[str, Any] | None = None, timeout: float = 60) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json"} if data else {}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"null") if body is not None else resp.status


def _prompt(i: int, prompt_tokens: int) -> list[int]:
    """The warmup's exact token-id prompt (ministream_sidecar.warmup.prompt_token_ids: ids
    1..97, the first token varies with `i`, so it repeats every 97)."""
    return [1 + (i * 31 + j * 7) % 97 for j in range(prompt_tokens)]


def _completion(base: str, model: str, prompt: list[int], max_tokens: int) -> float:
    """One greedy completion of exactly `max_tokens` tokens; its latency in seconds."""
    t0 = time.perf_counter()
    _http(
        f"{base}/v1/completions",
        {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
        },
    )
    return time.perf_counter() - t0


def warmup(base: str, model: str, settings: dict[str, int]) -> dict[str, Any]:
    """The sidecar's warmup: N completions of exact token-id prompts, C at a time."""

    def one(i: int) -> float:
        return _completion(
            base, model, _prompt(i, settings["prompt_tokens"]), settings["max_tokens"]
        )

    with ThreadPoolExecutor(settings["concurrency"]) as pool:
        latencies = list(pool.map(one, range(settings["requests"])))
    return {"settings": settings, "latencies_s": latencies}


@dataclass(frozen=True)
class DecodeProbe:
    """`--decode-probe BATCH:PROMPT:OUT`: after Ready, BATCH concurrent completions of
    PROMPT token ids in and OUT tokens out, `reps` times; output tokens per second of
    wall time per rep. Decode speed of the engine that just started, so a start-time
    lever is seen with what it does to serving (each start is a fresh engine instance).
    Every probe prompt opens with its own token id above the warmup's 1..97, so none shares
    a cached prefix with the warmup or another probe request: the rate is decode, not
    prefix-cache hits."""

    batch: int
    prompt_tokens: int
    max_tokens: int
    reps: int = 3

    @classmethod
    def parse(cls, text: str) -> DecodeProbe:
        try:
            batch, prompt, out = (int(x) for x in text.split(":"))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--decode-probe {text!r}: want BATCH:PROMPT_TOKENS:MAX_TOKENS, e.g. 64:128:128"
            ) from None
        if min(batch, prompt, out) < 1:
            raise argparse.ArgumentTypeError(f"--decode-probe {text!r}: each part must be >= 1")
        return cls(batch, prompt, out)

    def prompt(self, i: int) -> list[int]:
        return [98 + i, *_prompt(i, self.prompt_tokens - 1)]

    def run(self, base: str, model: str) -> dict[str, Any]:
        walls = []
        with ThreadPoolExecutor(self.batch) as pool:
            for rep in range(self.reps):
                first = rep * self.batch
                t0 = time.perf_counter()
                list(
                    pool.map(
                        lambda i: _completion(base, model, self.prompt(i), self.max_tokens),
                        range(first, first + self.batch),
                    )
                )
                walls.append(time.perf_counter() - t0)
        rates = [self.batch * self.max_tokens / w for w in walls]
        return {
            "batch": self.batch,
            "prompt_tokens": self.prompt_tokens,
            "max_tokens": self.max_tokens,
            "wall_s": walls,
            "tokens_per_s": rates,
            "median_tokens_per_s": statistics.median(rates),
        }


@dataclass
class PodServer(VLLMServer):
    """A vLLM server started with a pod's own command line (`server_command`'s argv, which
    names the model, served name and port given here) instead of the tests' one."""

    argv: Sequence[str] = ()

    def command(self) -> list[str]:
        return list(self.argv)


def cache_env(cache: Path, scratch: Path) -> dict[str, str]:
    """The compile caches under `cache` (Triton's inside it, as the chart sets it), and
    TorchInductor's cache and the hub's home in `scratch` (in a pod they live in /tmp)."""
    return {
        "VLLM_CACHE_ROOT": str(cache),
        "TRITON_CACHE_DIR": str(cache / "triton"),
        "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor"),
        "HF_HOME": str(scratch / "hf"),
        "PYTHONUNBUFFERED": "1",
    }


def _prepare_cache(args: argparse.Namespace) -> Path:
    """The cache root: emptied (`--fresh-cache`) or seeded (`--seed-cache-from`) first."""
    cache = Path(args.cache_root)
    if args.fresh_cache or args.seed_cache_from:
        shutil.rmtree(cache, ignore_errors=True)
    if args.seed_cache_from:
        shutil.copytree(args.seed_cache_from, cache, symlinks=True)
    cache.mkdir(parents=True, exist_ok=True)
    return cache


def _run_env(
    args: argparse.Namespace, env_over: dict[str, str], cache: Path, scratch: Path
) -> dict[str, str]:
    """What the server's environment adds to this process's: the mode's, the caches, the
    chart's pod paths moved into `scratch`, then `--env`."""
    env = env_over | cache_env(cache, scratch) | {"HOME": os.environ.get("HOME", str(scratch))}
    if STARTUP_LOG_ENV in env_over:  # the chart's path is a pod volume: use scratch
        env[STARTUP_LOG_ENV] = str(scratch / "vllm-startup.log")
    if "PROMETHEUS_MULTIPROC_DIR" in env_over:
        env["PROMETHEUS_MULTIPROC_DIR"] = str(scratch / "prometheus")
        Path(env["PROMETHEUS_MULTIPROC_DIR"]).mkdir(parents=True)
    for item in args.env:
        key, _, value = item.partition("=")
        env[key] = value
    return env


def _health_ok(server: VLLMServer, timeout: float, t0: float) -> float:
    """Seconds after `t0` at which GET /health first answered 200: the measurement itself,
    so polled every 0.1 s with a bare urllib request (an httpx client per poll took 60-160
    ms on the 2-core machine, coarsening the phase) rather than VLLMServer.wait_healthy."""
    assert server.process is not None
    while time.time() - t0 < timeout:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode} before /health")
        try:
            if _http(f"{server.url}/health", timeout=2) == 200:
                return time.time() - t0
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"no /health 200 within {timeout} s")


def _time_to_ready(
    server: VLLMServer, args: argparse.Namespace, t0: float, result: dict[str, Any]
) -> tuple[float | None, float | None]:
    """Wait for /health, send the chart's warmup: (health OK, Ready) in seconds after `t0`,
    None for what was not reached. A failure is recorded in `result`, never raised."""
    health_ok = ready = None
    try:
        health_ok = _health_ok(server, args.timeout, t0)
        if args.warmup != "none":
            settings = json.loads(Path(args.chart_defaults).read_text())["warmup"]
            result["warmup"] = warmup(server.url, server.served_name, settings)
        ready = time.time() - t0
        if args.decode_probe is not None:  # after Ready: not part of the start
            result["decode_probe"] = args.decode_probe.run(server.url, server.served_name)
        result["ok"] = True
    except (Exception, KeyboardInterrupt) as exc:  # keep the log and what was measured
        # KeyboardInterrupt: an outer `timeout -s INT` ran out (h200.sh); the server is
        # still stopped and the partial result still written.
        result["ok"] = False
        result["error"] = repr(exc)
        result["health_seconds_so_far"] = time.time() - t0
    return health_ok, ready


def _report(
    args: argparse.Namespace, result: dict[str, Any], lines: list[tuple[float, str]]
) -> int:
    """Write the stamped log and the result, print its line (and the log's end on a failure)."""
    out = Path(args.out)
    (out / f"{args.name}.log").write_text("".join(f"{t:9.3f} {s}\n" for t, s in lines))
    result = write_json(out / f"{args.name}.json", result)
    ph = result["phases"]
    print(
        f"{args.name}: ok={result['ok']} total={_f(ph.get('total'))} s "
        + " ".join(f"{k}={_f(ph.get(k))}" for k in TABLE_PHASES)
        + f" cache_hit={result['compile_cache_hit']}",
        flush=True,
    )
    if not result["ok"]:
        print(f"{args.name}: {result.get('error')}; last lines:", flush=True)
        print("\n".join(text for _, text in lines[-25:]), flush=True)
    return 0 if result["ok"] else 1


def run(args: argparse.Namespace) -> int:
    Path(args.out).mkdir(parents=True, exist_ok=True)
    cache = _prepare_cache(args)
    scratch = Path(tempfile.mkdtemp(prefix=f"cold-{args.name}-"))
    argv, env_over, served = server_command(
        args.mode, args.model, args.port, Path(args.chart_defaults)
    )
    for flag in args.drop_arg:
        argv = drop_flag(argv, flag)
    argv += args.extra_arg
    lines: list[tuple[float, str]] = []  # each output line with its arrival after t0
    t0 = 0.0  # set just before the server starts
    server = PodServer(
        args.model,
        scratch / "server.log",
        served_name=served,
        port=args.port,
        env=_run_env(args, env_over, cache, scratch),
        test_env=False,
        on_line=lambda line: lines.append((time.time() - t0, line)),
        argv=argv,
    )
    result: dict[str, Any] = {
        "name": args.name,
        "mode": args.mode,
        "argv": argv,
        "env_overrides": env_over | dict(e.partition("=")[::2] for e in args.env),
        "cache_root": str(cache),
        "seed_cache_from": args.seed_cache_from,
        "prefetch": {"paths": args.prefetch} if args.prefetch else None,
    }
    t0 = time.time()
    prefetch = _start_prefetch(args.prefetch)
    server.start()
    try:
        health_ok, ready = _time_to_ready(server, args, t0, result)
    finally:
        server.stop(args.stop_timeout)
        if prefetch is not None:
            result["prefetch"]["done_s"] = _finish_prefetch(prefetch, t0)
        shutil.rmtree(scratch, ignore_errors=True)
    result |= parse(lines, health_ok=health_ok, ready=ready)
    result["cache_bytes"] = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file())
    return _report(args, result, lines)


def _start_prefetch(paths: list[str]) -> subprocess.Popen[bytes] | None:
    """A reader of every file under `paths` (page cache fill), started beside the server."""
    if not paths:
        return None
    reader = 'find "$@" -type f -exec cat {} + > /dev/null; date +%s.%N'
    return subprocess.Popen(
        ["sh", "-c", reader, "prefetch", *paths],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _finish_prefetch(proc: subprocess.Popen[bytes], t0: float) -> float | None:
    """Seconds after the server's start at which the reader finished (None: it did not)."""
    try:
        out, _ = proc.communicate(timeout=60)
        return round(float(out.decode().split()[-1]) - t0, 3)
    except (subprocess.TimeoutExpired, ValueError, IndexError):
        proc.kill()
        return None


def _f(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def table(args: argparse.Namespace) -> int:
    runs = [json.loads(p.read_text()) for p in sorted(Path(args.dir).glob("*.json"))]
    runs = [r for r in runs if "phases" in r and "name" in r]
    order = {name: i for i, name in enumerate(args.order.split(","))} if args.order else {}
    runs.sort(key=lambda r: order.get(r["name"], len(order)))
    print(
        "| run | "
        + " | ".join(TABLE_PHASES)
        + " | health OK | Ready | after imports | compile cache |"
    )
    print("|---|" + "---:|" * (len(TABLE_PHASES) + 3) + "---|")
    for r in runs:
        ph, ev = r["phases"], r["events"]
        print(
            f"| {r['name']} | "
            + " | ".join(_f(ph.get(k)) for k in TABLE_PHASES)
            + f" | {_f(ev.get('health_ok'))} | {_f(ev.get('ready'))} | "
            + f"{_f(_after_imports(r))} | "
            + ("hit" if r.get("compile_cache_hit") else "miss")
            + " |"
        )
    return 0


def _after_imports(run: dict[str, Any]) -> float | None:
    """Ready minus the API server's imports: the part of a start that imports do not set."""
    ready, imports = run["events"].get("ready"), run["phases"].get("imports")
    return None if ready is None or imports is None else ready - imports


def variant_of(name: str) -> str:
    """A run's variant: its name without the repeat marker (`chart-warm.2-fork` ->
    `chart-warm-fork`)."""
    return re.sub(r"\.\d+(?=-|$)", "", name)


def spread(values: list[float]) -> str:
    """`median [min–max]` of a phase over a variant's starts (one value: that value)."""
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.1f}"
    values = sorted(values)
    n = len(values)
    median = values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2
    return f"{median:.1f} [{values[0]:.1f}–{values[-1]:.1f}]"


SUMMARY_COLUMNS: tuple[str, ...] = (
    "imports",
    "engine_core_start",
    "weights",
    "compile",
    "profiling",
    "graph_capture",
    "engine_finish",
    "api_server_up",
    "health",
    "warmup",
)


def _load_runs(dirs: list[str]) -> list[dict[str, Any]]:
    """Every run result (JSON with name, phases and events) under `dirs`, recursively."""
    runs = [json.loads(p.read_text()) for d in dirs for p in sorted(Path(d).rglob("*.json"))]
    return [r for r in runs if "phases" in r and "name" in r and "events" in r]


def repeat_of(name: str) -> int:
    """A run's repeat number: `chart-warm.3-hide` -> 3, `chart-warm` -> 1."""
    m = re.search(r"\.(\d+)(?=-|$)", name)
    return int(m.group(1)) if m else 1


def _measure(run: dict[str, Any], what: str) -> float | None:
    if what == "ready":
        return run["events"].get("ready")
    if what == "after_imports":
        return _after_imports(run)
    if what == "decode_tokens_per_s":
        probe = run.get("decode_probe")
        return None if probe is None else float(probe["median_tokens_per_s"])
    return run["phases"].get(what)


def pair_rows(dirs: list[str], a: str, b: str, phase: str) -> list[tuple[str, str, float, float]]:
    """Variant A against variant B, start by start: starts with the same repeat number (and,
    where results from several calls are given, from the same folder) form a pair, run back
    to back, so each pair's difference cancels the machine's slow drift. (name A, name B,
    A's figure, B's figure) per pair."""
    by_key: dict[tuple[str, str, int], dict[str, Any]] = {}
    for d in dirs:
        for r in _load_runs([d]):
            if r.get("ok"):
                by_key[(d, variant_of(r["name"]), repeat_of(r["name"]))] = r
    rows = []
    for (d, variant, n), run_a in sorted(by_key.items()):
        run_b = by_key.get((d, b, n))
        if variant != a or run_b is None:
            continue
        va, vb = _measure(run_a, phase), _measure(run_b, phase)
        if va is not None and vb is not None:
            rows.append((run_a["name"], run_b["name"], va, vb))
    return rows


def pair_difference(rows: list[tuple[str, str, float, float]]) -> dict[str, Any]:
    """A - B over the pairs: mean and its t-interval over pairs (each start is a fresh
    process, an instance: interval_stats' method for blocks of instances), median, count."""
    return paired_difference_interval([r[2] for r in rows], [r[3] for r in rows])


def signed(x: float, unit: str = "s") -> str:
    """A difference with its sign: seconds to 0.01, tokens/s whole."""
    return f"{x:+.0f}" if unit == "tokens/s" else f"{x:+.2f}"


def fmt_difference(d: dict[str, Any], unit: str = "s") -> str:
    """`−1.62 s [−2.80, −0.44]`: the mean difference and its 95 % t-interval over pairs."""
    lo, hi = d["ci95"]
    return f"{signed(d['mean'], unit)} {unit} [{signed(lo, unit)}, {signed(hi, unit)}]".replace(
        "-", "−"
    )


def unit_of(phase: str) -> str:
    return "tokens/s" if phase == "decode_tokens_per_s" else "s"


def pairs(args: argparse.Namespace) -> int:
    """Prints every pair and the mean difference A - B with its 95 % t-interval over pairs."""
    rows = pair_rows(args.dirs, args.a, args.b, args.phase)
    if len(rows) < 2:
        print(f"fewer than two pairs of {args.a} and {args.b} with {args.phase} in {args.dirs}")
        return 1
    print(f"| {args.a} | {args.b} | {args.phase} A | {args.phase} B | A − B |")
    print("|---|---|---:|---:|---:|")
    for na, nb, va, vb in rows:
        print(f"| {na} | {nb} | {va:.1f} | {vb:.1f} | {va - vb:+.1f} |")
    d, unit = pair_difference(rows), unit_of(args.phase)
    print(
        f"{d['n']} pairs: mean A − B {fmt_difference(d, unit)} (95 % t-interval over pairs), "
        f"median {signed(d['median'], unit)} {unit}; A lower in {d['a_lower']} of {d['n']}"
    )
    return 0


def summary_lines(dirs: list[str], order: list[str] | None = None) -> list[str]:
    """The summary table's lines: per variant over its repeats, n started, n ok, median
    [min–max] of each phase (docs/benchmarks.md renders its cold-start tables with this)."""
    runs = _load_runs(dirs)
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(runs, key=lambda r: r.get("provenance", {}).get("created", "")):
        groups.setdefault(variant_of(r["name"]), []).append(r)
    order = order or []
    keys = sorted(groups, key=lambda k: (order.index(k) if k in order else len(order), k))
    lines = [
        "| variant | n ok/run | "
        + " | ".join(SUMMARY_COLUMNS)
        + " | **Ready** | after imports | compile cache hit |",
        "|---|---|" + "---:|" * (len(SUMMARY_COLUMNS) + 2) + "---|",
    ]
    for key in keys:
        ok = [r for r in groups[key] if r.get("ok")]
        cells = [
            spread([r["phases"][c] for r in ok if r["phases"].get(c) is not None])
            for c in SUMMARY_COLUMNS
        ]
        ready = spread([r["events"]["ready"] for r in ok if r["events"].get("ready")])
        after = spread([a for r in ok if (a := _after_imports(r)) is not None])
        hits = sum(bool(r.get("compile_cache_hit")) for r in ok)
        lines.append(
            f"| {key} | {len(ok)}/{len(groups[key])} | "
            + " | ".join(cells)
            + f" | **{ready}** | {after} | {hits}/{len(ok)} |"
        )
    return lines


def ready_times(dirs: list[str]) -> dict[str, tuple[list[float], int]]:
    """Per variant: the Ready times of its starts that served, and how many it started."""
    out: dict[str, tuple[list[float], int]] = {}
    for r in _load_runs(dirs):
        ready, started = out.setdefault(variant_of(r["name"]), ([], 0))
        if r.get("ok") and r["events"].get("ready") is not None:
            ready.append(r["events"]["ready"])
        out[variant_of(r["name"])] = (ready, started + 1)
    return out


def summary(args: argparse.Namespace) -> int:
    """Per variant over its repeats: n started, n ok, median [min–max] of each phase."""
    print("\n".join(summary_lines(args.dirs, args.order.split(",") if args.order else [])))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run", help="start one server, time it, stop it")
    p.add_argument("--name", required=True)
    p.add_argument("--mode", choices=["vllm-defaults", "chart"], required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--cache-root", required=True)
    p.add_argument("--fresh-cache", action="store_true")
    p.add_argument("--seed-cache-from")
    p.add_argument("--warmup", choices=["chart", "none"], default="chart")
    p.add_argument("--env", action="append", default=[], help="K=V, repeatable")
    p.add_argument("--extra-arg", action="append", default=[], help="vLLM argument, repeatable")
    p.add_argument(
        "--chart-defaults",
        default=str(CHART_DEFAULTS),
        help="the chart's rendering to start (--mode chart); e.g. chart-defaults-h200.json",
    )
    p.add_argument(
        "--drop-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="remove FLAG and its values from the chart's arguments first, repeatable",
    )
    p.add_argument(
        "--prefetch",
        action="append",
        default=[],
        help="read every file under PATH beside the server",
    )
    p.add_argument(
        "--decode-probe",
        type=DecodeProbe.parse,
        metavar="BATCH:PROMPT:OUT",
        help="after Ready, time BATCH concurrent completions (3 rounds): decode tokens/s",
    )
    p.add_argument("--timeout", type=float, default=300, help="seconds to wait for /health")
    p.add_argument(
        "--stop-timeout", type=float, default=20, help="seconds after SIGTERM before SIGKILL"
    )
    p.set_defaults(func=run)
    t = sub.add_parser("table", help="markdown table of every run in a folder")
    t.add_argument("dir")
    t.add_argument("--order", default="", help="comma-separated run names, in this order")
    t.set_defaults(func=table)
    s = sub.add_parser("summary", help="per variant: median [min-max] of each phase")
    s.add_argument("dirs", nargs="+", help="folders searched for run JSON (recursively)")
    s.add_argument("--order", default="", help="comma-separated variants, in this order")
    s.set_defaults(func=summary)
    q = sub.add_parser("pairs", help="variant A against variant B, start by start")
    q.add_argument("dirs", nargs="+", help="one folder per call; pairs never cross folders")
    q.add_argument("--a", required=True, help="variant A (e.g. chart-kvb-warm-hide)")
    q.add_argument("--b", required=True, help="variant B (e.g. chart-kvb-warm)")
    q.add_argument(
        "--phase",
        default="ready",
        help="ready, after_imports, decode_tokens_per_s (--decode-probe) or a phase (imports)",
    )
    q.set_defaults(func=pairs)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
