"""Throughput and latency: the MiniStream plugin vs vLLM's built-in Llama, over engine instances.

Both serve the same converted directory (the Llama one through a symlinked copy whose
config names `LlamaForCausalLM`) with identical settings. An engine instance has an offset
of its own that its rounds do not average out, so the comparison is made over instances
(docs/benchmarks.md, "Plugin vs built-in Llama (CPU)"):

- three sides: `plugin`, `llama` and `plugin_b` (the plugin again, for the A/A control);
  `--instances` fresh engines per side, each in its own process (a new `vllm.LLM`), one
  process at a time (on CPU one engine's KV cache and weights is what fits beside the rest);
- created in blocks, one instance of every side per block, the order rotated between
  blocks (block 0: plugin llama plugin_b; block 1: llama plugin_b plugin; ...);
- each instance warms up, times `--rounds` batches (output tokens/s; its figure is the
  median of its rounds) and offline latency at each `--concurrency` c (median of 3: a
  batch of c requests with max_tokens=1 gives TTFT, one with `--decode-tokens` tokens
  mean ITL = (total - TTFT) / (tokens - 1));
- A/B = plugin/llama and A/A = plugin/plugin_b, each the geometric mean of the blocks'
  paired ratios with a 95 % t-interval over blocks (why a t-interval and not a bootstrap:
  interval_stats.py);
- verdict: "difference" only when the A/B interval excludes 1.0 AND the A/B ratio lies
  outside the A/A spread (1.0 give or take the A/A's largest distance from 1.0);
  otherwise "no difference resolved".

Prints one line per finished instance and a table; writes JSON (per-instance raw figures,
the comparisons, the provenance block) after every instance, so a run cut short keeps
what it measured (`complete: false`). Exit 1 only when the plugin is resolved slower than
`--target` (a difference whose whole interval lies below it); 2 when an instance failed.

    make bench-plugin                                        # CPU, demo (seed-shaped) model
    python scripts/bench_plugin.py --model DIR --out F.json \\
        --llm-args '{"dtype": "bfloat16", "gpu_memory_utilization": 0.4}'   # GPU
"""

from __future__ import annotations

import argparse
import hashlib
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from interval_stats import (  # noqa: E402
    DIFFERENCE,
    RatioInterval,
    aa_spread,
    creation_order,
    paired_ratio_interval,
    resolved_below,
    verdict,
)

from ministream_testkit.results import write_json  # noqa: E402

# The plugin twice: plugin vs plugin_b is the A/A control of the same method.
SIDES = ("plugin", "llama", "plugin_b")
AB, AA = ("plugin", "llama"), ("plugin", "plugin_b")
LATENCY_REPS = 3


# --- one instance, in its own process ---------------------------------------------------


def _batch(n: int, length: int, vocab: int) -> list[dict[str, list[int]]]:
    return [
        {"prompt_token_ids": [3 + (i * 7919 + j * 104729) % (vocab - 3) for j in range(length)]}
        for i in range(n)
    ]


def _timed(llm: Any, batch: list[Any], params: Any) -> tuple[float, list[Any]]:
    t0 = time.perf_counter()
    outs = llm.generate(batch, params, use_tqdm=False)
    return time.perf_counter() - t0, outs


def _tokens(outs: list[Any]) -> int:
    return sum(len(o.outputs[0].token_ids) for o in outs)


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """One fresh engine: start, warm-up, timed rounds, latency. Runs in its own process."""
    import ministream

    ministream.register()
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(model=spec["model"], seed=0, **spec["llm_args"])
    init_s = time.perf_counter() - t0
    batch = _batch(spec["prompts"], spec["prompt_len"], spec["vocab"])
    params = SamplingParams(temperature=0.0, max_tokens=spec["output_len"], ignore_eos=True)
    _, warm = _timed(llm, batch, params)  # compile, caches; its tokens say what was computed
    digest = hashlib.sha256(json.dumps([list(o.outputs[0].token_ids) for o in warm]).encode())
    rates = []
    for _ in range(spec["rounds"]):
        seconds, outs = _timed(llm, batch, params)
        rates.append(_tokens(outs) / seconds)
    latency: dict[str, dict[str, Any]] = {}
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    decode = SamplingParams(temperature=0.0, max_tokens=spec["decode_tokens"], ignore_eos=True)
    for c in spec["concurrency"]:
        lat_batch = _batch(c, spec["prompt_len"], spec["vocab"])
        samples = []
        for _ in range(LATENCY_REPS):
            ttft, _ = _timed(llm, lat_batch, one)
            total, _ = _timed(llm, lat_batch, decode)
            samples.append((1000 * ttft, 1000 * (total - ttft) / (spec["decode_tokens"] - 1)))
        latency[str(c)] = {
            "ttft_ms": statistics.median(s[0] for s in samples),
            "itl_ms": statistics.median(s[1] for s in samples),
            "samples_ttft_itl_ms": samples,
        }
    return {
        "init_s": init_s,
        "output_tokens_per_s": rates,
        "median_output_tokens_per_s": statistics.median(rates),
        "latency": latency,
        "warmup_tokens_sha256": digest.hexdigest(),
    }


def _instance_main(spec_path: Path, out_path: Path) -> int:
    result = measure(json.loads(spec_path.read_text()))
    out_path.write_text(json.dumps(result))
    return 0


# --- the run: instances in rotated blocks -----------------------------------------------


def _interrupted(signum: int, _frame: FrameType | None) -> None:
    # A timeout's SIGTERM must reach the `finally` that stops the running instance: an
    # orphaned engine would keep its memory (a GPU's, too) after the run gave up.
    raise SystemExit(128 + signum)


def run_instance(spec: dict[str, Any], workdir: Path, index: int) -> dict[str, Any]:
    """Start one instance's process, wait for it, return its figures (raises on failure)."""
    spec_path, out_path = workdir / f"{index}.spec.json", workdir / f"{index}.result.json"
    log_path = workdir / f"{index}.log"
    spec_path.write_text(json.dumps(spec))
    argv = [sys.executable, str(Path(__file__).resolve()), "--instance", str(spec_path)]
    t0 = time.perf_counter()
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [*argv, str(out_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            rc = proc.wait()
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    if rc != 0 or not out_path.exists():
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"instance {index} ({spec['side']}) exited {rc}:\n{tail}")
    result: dict[str, Any] = json.loads(out_path.read_text())
    return result | {"wall_s": time.perf_counter() - t0}


def _complete_blocks(instances: Sequence[dict[str, Any]], sides: Sequence[str]) -> list[int]:
    have = {(i["block"], i["side"]) for i in instances}
    blocks = sorted({i["block"] for i in instances})
    return [k for k in blocks if all((k, s) in have for s in sides)]


def compare(
    instances: Sequence[dict[str, Any]], figure: str, pair: tuple[str, str]
) -> tuple[RatioInterval, list[int]] | None:
    """pair[0]/pair[1] over the blocks that hold both; `figure` picks an instance's number."""
    by = {(i["block"], i["side"]): i for i in instances}
    blocks = _complete_blocks(instances, pair)
    if len(blocks) < 2:
        return None
    a = [_pick(by[(k, pair[0])], figure) for k in blocks]
    b = [_pick(by[(k, pair[1])], figure) for k in blocks]
    if min(a + b) <= 0:
        # ITL comes from two separate calls ((decode - TTFT) / tokens): on a loaded machine the
        # decode call can finish sooner than the TTFT call, and a negative figure has no ratio.
        return None
    return paired_ratio_interval(a, b), blocks


def _pick(instance: dict[str, Any], figure: str) -> float:
    """`tok/s`, or `ttft_ms@c` / `itl_ms@c`."""
    if figure == "tok/s":
        return float(instance["median_output_tokens_per_s"])
    name, _, c = figure.partition("@")
    return float(instance["latency"][c][name])


def summarize(instances: Sequence[dict[str, Any]], target: float) -> dict[str, Any]:
    """Per figure: A/B and A/A over blocks, the A/A spread and the verdict."""
    figures = ["tok/s"] + [
        f"{name}@{c}" for c in instances[0]["latency"] for name in ("ttft_ms", "itl_ms")
    ]
    out: dict[str, Any] = {}
    for figure in figures:
        ab, aa = compare(instances, figure, AB), compare(instances, figure, AA)
        entry: dict[str, Any] = {
            "ab_plugin_over_llama": ab[0].as_dict() | {"blocks": ab[1]} if ab else None,
            "aa_plugin_over_plugin_b": aa[0].as_dict() | {"blocks": aa[1]} if aa else None,
        }
        if ab and aa:
            spread = aa_spread(aa[0])
            entry |= {"aa_spread": list(spread), "verdict": verdict(ab[0], spread)}
            if figure == "tok/s":
                entry["resolved_below_target"] = resolved_below(ab[0], spread, target)
        out[figure] = entry
    return out


def build_report(
    instances: list[dict[str, Any]], settings: dict[str, Any], target: float, complete: bool
) -> dict[str, Any]:
    per_side = {s: [i for i in instances if i["side"] == s] for s in SIDES}
    rates = {s: [i["median_output_tokens_per_s"] for i in v] for s, v in per_side.items()}
    latency = {
        s: {
            c: {k: statistics.median(i["latency"][c][k] for i in v) for k in ("ttft_ms", "itl_ms")}
            for c in (v[0]["latency"] if v else {})
        }
        for s, v in per_side.items()
    }
    comparisons = summarize(instances, target) if instances else {}
    throughput = comparisons.get("tok/s", {})
    ab = throughput.get("ab_plugin_over_llama")
    verdict_text = throughput.get("verdict", "not enough instances")
    if verdict_text == DIFFERENCE and ab:
        verdict_text += ": plugin " + ("faster" if ab["ratio"] > 1 else "slower")
    return {
        "complete": complete,
        "method": "fresh engine instances per side in rotated blocks; "
        "t-interval over blocks of paired log-ratios; A/A = plugin vs plugin_b",
        "settings": settings,
        "instances": instances,
        # Per side, one figure per instance (the median of its rounds), in block order.
        "output_tokens_per_s": rates,
        "median_output_tokens_per_s": {s: statistics.median(r) for s, r in rates.items() if r},
        # Per side, the median over instances of each instance's median of 3.
        "latency": latency,
        "comparisons": comparisons,
        "ratio_plugin_over_llama": ab["ratio"] if ab else None,
        "verdict": verdict_text,
        "target": target,
        "resolved_below_target": throughput.get("resolved_below_target", False),
        "distinct_warmup_outputs": len({i["warmup_tokens_sha256"] for i in instances}),
    }


def _fmt(d: dict[str, Any] | None) -> str:
    if not d:
        return "n/a (fewer than 2 blocks)"
    pairs = " ".join(f"{r:.3f}" for r in d["pair_ratios"])
    return f"{d['ratio']:.3f} [{d['lo']:.3f}, {d['hi']:.3f}]  pairs: {pairs}"


def table(report: dict[str, Any]) -> str:
    lines = [f"\n{'side':<9} {'tok/s per instance (median of its rounds)':<44} {'median':>8}"]
    for side, rates in report["output_tokens_per_s"].items():
        per = " ".join(f"{r:.1f}" for r in rates)
        med = report["median_output_tokens_per_s"].get(side, float("nan"))
        lines.append(f"{side:<9} {per:<44} {med:>8.1f}")
    lines.append("\nTTFT ms / ITL ms per concurrency (median over instances)")
    for side, lat in report["latency"].items():
        cells = "  ".join(f"c={c}: {v['ttft_ms']:.1f}/{v['itl_ms']:.2f}" for c, v in lat.items())
        lines.append(f"{side:<9} {cells}")
    lines.append("\nratio, 95 % t-interval over blocks, paired ratio per block")
    for figure, entry in report["comparisons"].items():
        lines.append(f"{figure:<12} A/B plugin/llama    {_fmt(entry['ab_plugin_over_llama'])}")
        lines.append(f"{'':<12} A/A plugin/plugin_b {_fmt(entry['aa_plugin_over_plugin_b'])}")
        if "aa_spread" in entry:
            lo, hi = entry["aa_spread"]
            lines.append(f"{'':<12} A/A spread {lo:.3f}-{hi:.3f}: {entry['verdict']}")
    lines.append(
        f"\noutput tokens/s: {report['verdict']} (exit 1 only if resolved below "
        f"{report['target']}: {'yes' if report['resolved_below_target'] else 'no'})"
    )
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--instances", type=int, default=3, help="fresh engines per side")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4, help="timed batches per instance")
    parser.add_argument(
        "--concurrency", default="1,8", help="latency at these batch sizes ('' for none)"
    )
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--target", type=float, default=0.98)
    parser.add_argument(
        "--llm-args",
        default='{"max_model_len": 512, "dtype": "bfloat16"}',
        help="JSON kwargs for vllm.LLM, identical for every instance",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--instance"]:  # the parent's call for one instance
        return _instance_main(Path(argv[1]), Path(argv[2]))
    args = _parser().parse_args(argv)
    if args.instances < 2:
        raise SystemExit("--instances: at least 2 (an interval over instances needs two)")
    signal.signal(signal.SIGTERM, _interrupted)
    from ministream_reference.golden import as_llama

    settings = {
        k: getattr(args, k)
        for k in ("instances", "prompts", "prompt_len", "output_len", "rounds", "decode_tokens")
    } | {"concurrency": args.concurrency, "llm_args": json.loads(args.llm_args)}
    out = Path(args.out)
    order = creation_order(args.instances, SIDES)
    instances: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-plugin-") as tmp:
        work = Path(tmp)
        models = {"plugin": args.model, "plugin_b": args.model}
        models["llama"] = str(as_llama(args.model, work / "llama"))
        vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
        base = settings | {
            "concurrency": [int(c) for c in args.concurrency.split(",") if c.strip()],
            "vocab": vocab,
        }
        started = time.perf_counter()
        for index, (block, side) in enumerate(order):
            spec = base | {"model": models[side], "side": side, "block": block}
            try:
                result = run_instance(spec, work, index)
            except RuntimeError as err:  # the instances so far are in the JSON already
                print(f"{err}\nstopped after {index} instances (JSON: {out})", flush=True)
                return 2
            instances.append({"side": side, "block": block, "position": index} | result)
            lat = "  ".join(
                f"c={c} {v['ttft_ms']:.0f}/{v['itl_ms']:.1f} ms"
                for c, v in result["latency"].items()
            )
            print(
                f"[{index + 1}/{len(order)}] block {block} {side:<8} "
                f"{result['median_output_tokens_per_s']:.1f} tok/s (rounds "
                + " ".join(f"{r:.1f}" for r in result["output_tokens_per_s"])
                + f"), TTFT/ITL {lat or '-'}, start {result['init_s']:.0f} s, "
                f"{result['wall_s']:.0f} s; {time.perf_counter() - started:.0f} s so far",
                flush=True,
            )
            report = build_report(instances, settings, args.target, index + 1 == len(order))
            write_json(out, report)
    print(table(report))
    print(f"JSON: {out}")
    return 1 if report["resolved_below_target"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
