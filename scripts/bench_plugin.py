"""Throughput and latency: the MiniStream plugin vs vLLM's built-in Llama, side by side.

Both engines serve the same converted directory (the Llama one through a symlinked copy
whose config names `LlamaForCausalLM`) with identical settings, and live in ONE process at
the same time: timed batches alternate plugin/llama (ABBA order), so a noisy machine's
drift hits both alike. Reports the median output tokens/s of each, their ratio, and
offline latency at a few concurrencies (a batch of `c` requests with max_tokens=1 gives
TTFT at concurrency `c`; with `--decode-tokens` tokens, mean ITL = (total - TTFT) /
(tokens - 1)). Prints a table, writes JSON; exit 1 if the ratio is below `--target`.

    make bench-plugin                                        # CPU, demo (seed-shaped) model
    python scripts/bench_plugin.py --model DIR --out F.json \
        --llm-args '{"dtype": "bfloat16", "gpu_memory_utilization": 0.4}'   # GPU
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _batch(n: int, length: int, vocab: int) -> list[dict[str, list[int]]]:
    return [
        {"prompt_token_ids": [3 + (i * 7919 + j * 104729) % (vocab - 3) for j in range(length)]}
        for i in range(n)
    ]


def _timed(llm: Any, batch: list[Any], params: Any) -> tuple[float, int]:
    t0 = time.perf_counter()
    outs = llm.generate(batch, params, use_tqdm=False)
    return time.perf_counter() - t0, sum(len(o.outputs[0].token_ids) for o in outs)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4, help="timed batches per engine")
    parser.add_argument("--concurrency", default="1,8", help="latency at these batch sizes")
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--target", type=float, default=0.98)
    parser.add_argument(
        "--llm-args",
        default='{"max_model_len": 512, "dtype": "bfloat16"}',
        help="JSON kwargs for vllm.LLM, identical for both engines",
    )
    args = parser.parse_args()
    llm_args = json.loads(args.llm_args)

    import ministream

    ministream.register()
    from vllm import LLM, SamplingParams

    from ministream_reference.golden import as_llama

    llama_dir = as_llama(args.model, Path(tempfile.mkdtemp(prefix="bench-llama-")))
    engines: dict[str, Any] = {}
    init_s: dict[str, float] = {}
    for name, model in (("plugin", args.model), ("llama", str(llama_dir))):
        t0 = time.perf_counter()
        engines[name] = LLM(model=model, seed=0, **llm_args)
        init_s[name] = time.perf_counter() - t0

    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    batch = _batch(args.prompts, args.prompt_len, vocab)
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    for llm in engines.values():
        llm.generate(batch, params, use_tqdm=False)  # warm up (compile, graphs, caches)
    rates: dict[str, list[float]] = {"plugin": [], "llama": []}
    for rnd in range(args.rounds):
        order = ("plugin", "llama") if rnd % 2 == 0 else ("llama", "plugin")
        for name in order:
            seconds, tokens = _timed(engines[name], batch, params)
            rates[name].append(tokens / seconds)
        print(
            f"round {rnd + 1}/{args.rounds}: "
            + ", ".join(f"{n} {rates[n][-1]:.0f} tok/s" for n in rates),
            flush=True,
        )

    latency: dict[str, dict[str, dict[str, float]]] = {"plugin": {}, "llama": {}}
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    decode = SamplingParams(temperature=0.0, max_tokens=args.decode_tokens, ignore_eos=True)
    for c in (int(x) for x in args.concurrency.split(",")):
        lat_batch = _batch(c, args.prompt_len, vocab)
        samples: dict[str, list[tuple[float, float]]] = {"plugin": [], "llama": []}
        for rnd in range(3):
            for name in ("plugin", "llama") if rnd % 2 == 0 else ("llama", "plugin"):
                ttft, _ = _timed(engines[name], lat_batch, one)
                total, _ = _timed(engines[name], lat_batch, decode)
                samples[name].append((ttft, (total - ttft) / (args.decode_tokens - 1)))
        for name, pairs in samples.items():
            latency[name][str(c)] = {
                "ttft_ms": 1000 * statistics.median(p[0] for p in pairs),
                "itl_ms": 1000 * statistics.median(p[1] for p in pairs),
            }

    med = {name: statistics.median(r) for name, r in rates.items()}
    ratio = med["plugin"] / med["llama"]
    # Each round's two batches ran back to back, so their ratio cancels the machine's drift.
    paired = [p / q for p, q in zip(rates["plugin"], rates["llama"], strict=True)]
    paired_median, plugin_won = statistics.median(paired), sum(r > 1 for r in paired)
    report = {
        "command": " ".join(sys.argv),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "settings": {
            k: getattr(args, k)
            for k in (
                "prompts",
                "prompt_len",
                "output_len",
                "rounds",
                "concurrency",
                "decode_tokens",
            )
        }
        | {"llm_args": llm_args},
        "engine_init_s": init_s,
        "output_tokens_per_s": rates,
        "median_output_tokens_per_s": med,
        "latency": latency,
        "ratio_plugin_over_llama": ratio,
        "paired_ratios": paired,
        "median_paired_ratio": paired_median,
        "plugin_won_rounds": plugin_won,
        "target": args.target,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"\n{'engine':<8} {'median tok/s':>13}  {'TTFT ms / ITL ms per concurrency':<40}")
    for name in rates:
        lat = "  ".join(
            f"c={c}: {v['ttft_ms']:.1f}/{v['itl_ms']:.2f}" for c, v in latency[name].items()
        )
        print(f"{name:<8} {med[name]:>13.1f}  {lat}")
    print(
        f"paired per round: median {paired_median:.3f}, "
        f"range {min(paired):.3f}-{max(paired):.3f}, plugin won {plugin_won} of {len(paired)}"
    )
    print(f"ratio plugin/llama = {ratio:.3f} (target >= {args.target}); JSON: {args.out}")
    return 0 if ratio >= args.target else 1


if __name__ == "__main__":
    raise SystemExit(main())
