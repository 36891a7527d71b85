"""CUDA-graph capture sizes: capture time and decode throughput, side by side on one GPU.

Four kinds of engine, K instances each (`--instances`), all alive in ONE process on one device,
identical but for their capture sizes:
  vllm_a, vllm_b  vLLM's own sizes (two groups of the same configuration: the A/A control)
  size64          `--max-cudagraph-capture-size 64` (the cold-start runs' old lever)
  chart           the chart's `--cudagraph-capture-sizes` and `--max-num-seqs`, read from
                  scripts/gpu/chart-defaults-h200.json (rendered by chart_args.py) and parsed
                  by the installed vLLM's own CLI parser, so the rendered flag is what runs
Every kind serves the chart's max-num-seqs. Capture time: each engine's `capture_model()`
call (capture_timer.py), exact where vLLM logs whole seconds. Decode: per round, every
engine decodes every batch size once (B random prompts of `--prompt-len` tokens,
`--decode-steps` tokens out, greedy, no prefix caching), the engines in a shuffled order;
the figure is the median forward time of the rep's full decode steps (forward_timer.py:
CUDA events around the runner's forward call, graph replay or not), as tokens/s = B / step.
Each engine's figure is its median over rounds; a kind's, the mean over its engines; ratios
of kinds with a two-level bootstrap interval over engines and rounds
(paired_stats.instance_ratio_summary). The end-to-end view (B x steps / generate wall time,
prefill included) is kept beside it.

    python scripts/gpu/capture_sizes.py run --model DIR --out F.json [--instances 3]
    python scripts/gpu/capture_sizes.py table F.json    # the markdown tables again
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from forward_parity import (  # noqa: E402
    _prompts,
    add_round_options,
    another_round,
    shape_figure,
)
from paired_stats import fmt_ratio, instance_ratio_summary  # noqa: E402

from ministream_testkit.results import write_json  # noqa: E402

PROCESS_START = time.time()
KINDS = ("vllm_a", "vllm_b", "size64", "chart")
REFERENCE = "vllm_a"
CHART_DEFAULTS = HERE / "chart-defaults-h200.json"
BATCHES = "16,32,40,64,80,96,128,160,200,256"
CHART_FLAGS = ("--max-num-seqs", "--cudagraph-capture-sizes")
GOAL_RATIO = 0.97


def chart_flags(argv: list[str]) -> list[str]:
    """The chart's batch-limit and capture-size flags with their values, from its argv."""
    out: list[str] = []
    for flag in CHART_FLAGS:
        if flag not in argv:
            raise ValueError(
                f"{flag} is not in the chart's argv: re-render chart-defaults-h200.json"
            )
        rest = argv[argv.index(flag) + 1 :]
        end = next((i for i, a in enumerate(rest) if a.startswith("-")), len(rest))
        out += [flag, *rest[:end]]
    return out


def engine_order(instances: int) -> list[str]:
    """Engine names, started interleaved (vllm_a.0, vllm_b.0, size64.0, chart.0, vllm_a.1, ...)
    so that no kind always starts on an emptier GPU."""
    return [f"{kind}.{i}" for i in range(instances) for kind in KINDS]


def summarise(
    forward_ms: dict[int, dict[str, list[float]]],
    wall_s: dict[int, dict[str, list[float]]],
    engines: list[str],
    decode_steps: int,
    resamples: int = 4000,
) -> dict[str, Any]:
    """Per batch: each kind's mean tokens/s and its ratio to the reference kind (> 1: faster)."""
    by_kind = {k: [e for e in engines if e.split(".")[0] == k] for k in KINDS}
    out: dict[str, Any] = {}
    for batch, times in forward_ms.items():
        row: dict[str, Any] = {"tokens_per_s": {}, "e2e_tokens_per_s": {}, "ratio": {}}
        for kind, names in by_kind.items():
            row["tokens_per_s"][kind] = statistics.fmean(
                batch * 1000.0 / statistics.median(times[e]) for e in names
            )
            row["e2e_tokens_per_s"][kind] = statistics.fmean(
                batch * decode_steps / statistics.median(wall_s[batch][e]) for e in names
            )
            if kind == REFERENCE:
                continue
            # time(reference) / time(kind) = throughput(kind) / throughput(reference)
            row["ratio"][kind] = instance_ratio_summary(
                [times[e] for e in by_kind[REFERENCE]],
                [times[e] for e in names],
                resamples=resamples,
            )
            row["ratio"][kind + "_e2e"] = instance_ratio_summary(
                [wall_s[batch][e] for e in by_kind[REFERENCE]],
                [wall_s[batch][e] for e in names],
                resamples=resamples,
            )
        chart = row["ratio"]["chart"]
        row["chart_meets_goal"] = {
            "estimate": chart["median"] >= GOAL_RATIO,
            "interval_lower": chart["ci95"][0] >= GOAL_RATIO,
        }
        out[str(batch)] = row
    return out


def _spread(values: list[float], fmt: str) -> str:
    """`median [min–max]`, or – when there is nothing."""
    if not values:
        return "–"
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}–{max(values):{fmt}}]"


def capture_table(report: dict[str, Any]) -> str:
    lines = [
        "| capture sizes | sizes | capture s, median [min–max] over engines "
        "| graph memory GiB | engine init s |",
        "|---|---|---|---|---|",
    ]
    engines = report["engines"]
    for kind in KINDS:
        names = [e for e in engines if e.split(".")[0] == kind]
        caps = [engines[e]["capture"] for e in names if engines[e]["capture"]]
        counts = sorted({len(c.get("sizes", [])) for c in caps})
        lines.append(
            f"| {kind} | {'/'.join(map(str, counts))} "
            f"| {_spread([c['seconds'] for c in caps], '.2f')} "
            f"| {_spread([c['graph_bytes'] / 2**30 for c in caps], '.2f')} "
            f"| {_spread([engines[e]['init_s'] for e in names], '.1f')} |"
        )
    return "\n".join(lines)


def throughput_table(report: dict[str, Any], view: str = "") -> str:
    """`view` "" (forward steps) or "_e2e" (generate wall time, prefill included)."""
    key = "tokens_per_s" if not view else "e2e_tokens_per_s"
    lines = [
        f"| batch | vLLM's sizes tok/s | size 64 tok/s | chart tok/s | A/A (vllm_b / vllm_a) "
        f"| size 64 / vLLM's | chart / vLLM's |{' chart >= 0.97 |' if not view else ''}",
        f"|---|---|---|---|---|---|---|{'---|' if not view else ''}",
    ]
    for batch, row in report["batches"].items():
        tps = row[key]
        ratio = row["ratio"]
        line = (
            f"| {batch} | {tps['vllm_a'] / 1e3:.1f}k | {tps['size64'] / 1e3:.1f}k | "
            f"{tps['chart'] / 1e3:.1f}k | {fmt_ratio(ratio['vllm_b' + view])} | "
            f"{fmt_ratio(ratio['size64' + view])} | {fmt_ratio(ratio['chart' + view])} |"
        )
        if not view:
            goal = row["chart_meets_goal"]
            line += (
                " yes |"
                if goal["interval_lower"]
                else (" estimate only |" if goal["estimate"] else " **no** |")
            )
        lines.append(line)
    return "\n".join(lines)


def print_tables(report: dict[str, Any]) -> None:
    s = report["settings"]
    print(
        f"\n{s['rounds']} rounds, {s['instances']} engines per kind; ratios: throughput of a kind "
        f"over vLLM's sizes (vllm_a), mean of engine medians, 95% CI over engines and rounds"
    )
    print(capture_table(report))
    print("\nDecode, forward steps (CUDA events):")
    print(throughput_table(report))
    print("\nDecode, end to end (generate wall time, prefill included):")
    print(throughput_table(report, "_e2e"))


def _register() -> None:
    """The plugin registered, and every engine-core process able to import forward_timer
    and capture_timer (they are in this folder)."""
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p
    )
    import ministream

    ministream.register()


def chart_limits(model: str, flags: list[str]) -> tuple[int, list[int]]:
    """The chart's max-num-seqs and capture sizes through this vLLM's own parser: the
    rendered form must parse here."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parsed = EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(
        ["--model", model, *flags]
    )
    seqs, sizes = parsed.max_num_seqs, parsed.cudagraph_capture_sizes
    if not seqs or not sizes:
        raise ValueError(f"the chart's flags parsed to max_num_seqs={seqs}, sizes={sizes}")
    return seqs, sizes


def start_engines(
    model: str, names: list[str], common: dict[str, Any], per_kind: dict[str, dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Every engine, in `names`' order: the engines, and each one's start, capture and
    capture sizes."""
    from vllm import LLM

    llms: dict[str, Any] = {}
    engines: dict[str, dict[str, Any]] = {}
    for name in names:
        t0 = time.perf_counter()
        llm = LLM(model=model, **common, **per_kind[name.split(".")[0]])
        init_s = time.perf_counter() - t0
        llm.collective_rpc("forward_timer_install")
        config = llm.llm_engine.vllm_config.compilation_config
        engines[name] = {
            "init_s": init_s,
            "capture": llm.collective_rpc("capture_timer_fetch")[0],
            "capture_sizes": list(config.cudagraph_capture_sizes or []),
            "cudagraph_mode": str(config.cudagraph_mode),
        }
        llms[name] = llm
        cap = engines[name]["capture"] or {}
        print(
            f"{name}: up in {init_s:.1f} s, {len(engines[name]['capture_sizes'])} sizes captured "
            f"in {cap.get('seconds', float('nan')):.2f} s",
            flush=True,
        )
    return llms, engines


@dataclass
class Decoder:
    """One timed decode rep of a batch on one engine."""

    llms: dict[str, Any]
    prompt_len: int
    vocab: int
    params: Any  # vllm.SamplingParams

    def rep(self, name: str, batch: int, seed: int) -> tuple[float, float]:
        """(median forward ms of the full decode steps, generate wall s)."""
        prompts = _prompts(random.Random(seed), batch, self.prompt_len, self.vocab)
        llm = self.llms[name]
        llm.collective_rpc("forward_timer_fetch")  # drop anything recorded before
        t0 = time.perf_counter()
        llm.generate(prompts, self.params, use_tqdm=False)
        wall = time.perf_counter() - t0
        ms, _ = shape_figure("decode", llm.collective_rpc("forward_timer_fetch")[0])
        return ms, wall


def one_round(
    decoder: Decoder,
    names: list[str],
    batches: list[int],
    index: int,
    forward_ms: dict[int, dict[str, list[float]]],
    wall_s: dict[int, dict[str, list[float]]],
) -> None:
    """Every engine decodes every batch once, the engines shuffled per batch and round."""
    for batch in batches:
        order = list(names)
        random.Random(index * 1000 + batch).shuffle(order)
        for name in order:
            ms, wall = decoder.rep(name, batch, seed=index)
            forward_ms[batch][name].append(ms)
            wall_s[batch][name].append(wall)


def round_line(
    rounds: int, elapsed: float, forward_ms: dict[int, dict[str, list[float]]], names: list[str]
) -> str:
    """The progress line of a round: per batch, each kind's median of its last steps (ms)."""
    last = {
        b: "/".join(
            f"{statistics.median(times[e][-1] for e in names if e.startswith(k)):.2f}"
            for k in KINDS
        )
        for b, times in forward_ms.items()
    }
    return f"round {rounds} ({elapsed:.0f} s), ms: " + "  ".join(
        f"{b}:{v}" for b, v in last.items()
    )


def run(args: argparse.Namespace) -> int:
    batches = [int(b) for b in args.batches.split(",")]
    chart_argv = json.loads(Path(args.chart_defaults).read_text())["argv"]
    flags = chart_flags(chart_argv)
    _register()
    from engine_versions import engine_versions
    from vllm import SamplingParams

    seqs, sizes = chart_limits(args.model, flags)
    common = json.loads(args.llm_args) | {
        "seed": 0,
        "enable_prefix_caching": False,
        "max_num_seqs": seqs,
        "worker_cls": "capture_timer.TimedWorker",
        "worker_extension_cls": "forward_timer.ForwardTimer",
    }
    per_kind: dict[str, dict[str, Any]] = {
        "vllm_a": {},
        "vllm_b": {},
        "size64": {"max_cudagraph_capture_size": 64},
        "chart": {"cudagraph_capture_sizes": sizes},
    }
    names = engine_order(args.instances)
    llms, engines = start_engines(args.model, names, common, per_kind)
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    params = SamplingParams(temperature=0.0, max_tokens=args.decode_steps, ignore_eos=True)
    decoder = Decoder(llms, args.prompt_len, vocab, params)
    for name in names:  # warm-up, untimed: the smallest and the largest batch
        for batch in (batches[0], batches[-1]):
            decoder.rep(name, batch, seed=-1)

    forward_ms: dict[int, dict[str, list[float]]] = {b: {e: [] for e in names} for b in batches}
    wall_s: dict[int, dict[str, list[float]]] = {b: {e: [] for e in names} for b in batches}

    def report(rounds: int, resamples: int) -> dict[str, Any]:
        data = {
            "settings": {
                "model": args.model,
                "batches": batches,
                "prompt_len": args.prompt_len,
                "decode_steps": args.decode_steps,
                "instances": args.instances,
                "rounds": rounds,
                "llm_args": common,
                "per_kind": per_kind,
                "chart_flags": flags,
                "chart_defaults": str(args.chart_defaults),
            },
            "versions": engine_versions(),
            "engines": engines,
            "forward_ms": {str(b): v for b, v in forward_ms.items()},
            "wall_s": {str(b): v for b, v in wall_s.items()},
            "batches": summarise(forward_ms, wall_s, names, args.decode_steps, resamples),
            "ratio_definition": "throughput of a kind / throughput of vllm_a: mean over a kind's "
            "engines of each engine's median over rounds (paired_stats.instance_ratio_summary)",
        }
        return write_json(Path(args.out), data)

    t_start = time.perf_counter()
    rounds = 0
    while another_round(rounds, args, t_start, PROCESS_START):
        one_round(decoder, names, batches, rounds, forward_ms, wall_s)
        rounds += 1
        print(round_line(rounds, time.perf_counter() - t_start, forward_ms, names), flush=True)
        report(rounds, resamples=200)  # an interim copy: a killed run keeps its rounds
    print_tables(report(rounds, resamples=4000))
    print(f"JSON: {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="start the engines and measure")
    r.add_argument("--model", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--chart-defaults", default=str(CHART_DEFAULTS))
    r.add_argument("--instances", type=int, default=3, help="engines of each kind")
    r.add_argument("--batches", default=BATCHES, help="decode batch sizes, comma-separated")
    r.add_argument("--prompt-len", type=int, default=128)
    r.add_argument("--decode-steps", type=int, default=32)
    add_round_options(r, rounds=100, min_rounds=2, budget_s=300)
    r.add_argument(
        "--llm-args",
        default='{"dtype": "bfloat16", "max_model_len": 1024, "gpu_memory_utilization": 0.05, '
        '"kv_cache_memory_bytes": 5368709120, "max_num_batched_tokens": 8192}',
        help="JSON kwargs for vllm.LLM, identical for every engine",
    )
    t = sub.add_parser("table", help="print the tables of a result file")
    t.add_argument("result")
    args = parser.parse_args(argv)
    if args.cmd == "table":
        print_tables(json.loads(Path(args.result).read_text()))
        return 0
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
