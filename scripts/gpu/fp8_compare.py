"""FP8 vs bf16 for the MiniStream plugin, side by side in one process.

Both engines serve the same converted (bf16) directory through the plugin; `fp8` adds
vLLM's online FP8 quantization (`quantization="fp8"`: weights quantized per tensor to
float8_e4m3 while loading, activations per token at run time), which reaches every
linear layer through the plugin's `quant_config` (MiniStreamForCausalLM passes it to
each QKV/gate-up/o/down projection). Reported per variant:

- engine start (`LLM()` seconds in this process) and weight bytes on the device, by dtype;
- output tokens/s at each concurrency c (a batch of c requests, `--output-len` tokens),
  offline TTFT (the same batch with max_tokens=1) and ITL; rounds alternate the variants
  (ABBA) and the fp8/bf16 ratio is reported per round as median and 95 % interval;
- accuracy against the fp32 reference model (`--reference`, from
  `python -m ministream_reference.golden --engine reference`): share of greedy tokens
  identical to the reference before the first divergence, max |Δ logprob| over the top-5
  tokens both sides share up to that point, and vLLM's check_logprobs_close rule.

Acceptance (stated before the run): a variant passes when check_logprobs_close holds on
every golden prompt (each divergence within the other side's top-5) and max |Δ logprob|
before the first divergence is at most `--atol` (0.15 nats for bf16, as the golden check;
0.5 nats for fp8: an e4m3 weight keeps 3 mantissa bits, ~6 % relative step).

    python scripts/gpu/fp8_compare.py --model DIR --reference REF.json --out F.json
    python scripts/gpu/fp8_compare.py --model DIR --reference REF.json --out F.json --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # scripts/: the one statistics module

from engine_versions import engine_versions  # noqa: E402
from interval_stats import fmt_ratio, ratio_summary  # noqa: E402

VARIANT_ARGS: dict[str, dict[str, Any]] = {"bf16": {}, "fp8": {"quantization": "fp8"}}
ATOL = {"bf16": 0.15, "fp8": 0.5}


def accuracy(reference: list[Any], got: list[Any], atol: float) -> dict[str, Any]:
    """Identical-prefix share, max |Δ logprob| before divergence, check_logprobs_close."""
    from ministream_reference.golden import compare

    same = total = 0
    max_delta = 0.0
    for ref, out in zip(reference, got, strict=True):
        total += len(ref.tokens)
        for pos, (a, b) in enumerate(zip(ref.tokens, out.tokens, strict=False)):
            if a != b:
                break
            same += 1
            common = ref.logprobs[pos].keys() & out.logprobs[pos].keys()
            max_delta = max(
                [max_delta, *(abs(ref.logprobs[pos][t] - out.logprobs[pos][t]) for t in common)]
            )
    close = compare(reference, got, atol=1e9, require_identical=False)
    return {
        "identical_prefix_tokens": f"{same}/{total}",
        "identical_share": same / total if total else 0.0,
        "max_abs_dlogprob": max_delta,
        "check_logprobs_close_issues": len(close),
        "atol": atol,
        "pass": not close and max_delta <= atol,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True)
    parser.add_argument("--reference", required=True, help="reference golden JSON (fp32)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--variants", default="bf16,fp8")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--llm-args",
        default='{"dtype": "bfloat16", "max_model_len": 2048, "gpu_memory_utilization": 0.3}',
    )
    parser.add_argument("--smoke", action="store_true", help="CPU/CI: tiny sizes, 2 rounds")
    args = parser.parse_args(argv)
    if args.smoke:
        args.concurrency, args.prompt_len, args.output_len, args.rounds = "1,4", 16, 8, 2
        args.llm_args = '{"dtype": "bfloat16", "max_model_len": 256, "enforce_eager": true}'
    variants = args.variants.split(",")
    llm_args = json.loads(args.llm_args) | {
        "seed": 0,
        "worker_extension_cls": "forward_timer.ForwardTimer",
    }
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p
    )

    import ministream

    ministream.register()
    from vllm import LLM, SamplingParams

    from ministream_reference.golden import DEFAULT_PROMPTS, Completion, load

    reference = load(args.reference)
    engines: dict[str, Any] = {}
    report: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "versions": engine_versions(),
        "settings": vars(args) | {"llm_args": llm_args},
        "variants": {},
    }
    for name in variants:
        t0 = time.perf_counter()
        try:
            engines[name] = LLM(model=args.model, **llm_args, **VARIANT_ARGS[name])
        except Exception as exc:  # e.g. FP8 on a build without the kernels: say so, go on
            report["variants"][name] = {"error": repr(exc)[:2000]}
            print(f"{name}: engine failed: {exc!r}"[:400], flush=True)
            continue
        init_s = time.perf_counter() - t0
        weights = engines[name].collective_rpc("forward_timer_weight_bytes")[0]
        golden = engines[name].generate(
            [{"prompt_token_ids": list(p)} for p in DEFAULT_PROMPTS],
            SamplingParams(temperature=0.0, max_tokens=len(reference[0].tokens), logprobs=5),
            use_tqdm=False,
        )
        got = [
            Completion(
                list(p),
                list(o.outputs[0].token_ids),
                [
                    {int(t): float(lp.logprob) for t, lp in s.items()}
                    for s in o.outputs[0].logprobs or []
                ],
            )
            for p, o in zip(DEFAULT_PROMPTS, golden, strict=True)
        ]
        report["variants"][name] = {
            "engine_init_s": init_s,
            "weight_bytes": weights,
            "weight_bytes_total": sum(weights.values()),
            "accuracy_vs_fp32_reference": accuracy(reference, got, ATOL[name]),
            "golden_tokens": [c.tokens for c in got],
        }
        print(f"{name}: up in {init_s:.1f} s, weights {weights}", flush=True)

    def write() -> None:  # after every stage: a run cut short keeps what it measured
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")

    write()
    live = [v for v in variants if v in engines]
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]

    def batch(c: int, seed: int) -> list[dict[str, list[int]]]:
        return [
            {
                "prompt_token_ids": [
                    3 + (seed * 7919 + i * 104729 + j * 31) % (vocab - 3)
                    for j in range(args.prompt_len)
                ]
            }
            for i in range(c)
        ]

    def timed(name: str, prompts: list[Any], max_tokens: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        t0 = time.perf_counter()
        engines[name].generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - t0

    perf: dict[str, dict[str, dict[str, list[float]]]] = {}
    for c in (int(x) for x in args.concurrency.split(",")):
        key = f"c={c}"
        perf[key] = {v: {"tok_s": [], "ttft_ms": [], "itl_ms": []} for v in live}
        for name in live:  # warm-up at this batch size
            timed(name, batch(c, -1), args.output_len)
        for rnd in range(args.rounds):
            order = live if rnd % 2 == 0 else live[::-1]
            for name in order:
                prompts = batch(c, rnd)
                ttft = timed(name, prompts, 1)
                total = timed(name, prompts, args.output_len)
                perf[key][name]["tok_s"].append(c * args.output_len / total)
                perf[key][name]["ttft_ms"].append(1000 * ttft)
                perf[key][name]["itl_ms"].append(1000 * (total - ttft) / (args.output_len - 1))
        line = [key]
        for name in live:
            med = {m: statistics.median(v) for m, v in perf[key][name].items()}
            report["variants"][name].setdefault("performance", {})[key] = med | perf[key][name]
            line.append(
                f"{name} {med['tok_s']:.0f} tok/s TTFT {med['ttft_ms']:.1f} ITL {med['itl_ms']:.2f}"
            )
        if "fp8" in live and "bf16" in live:
            ratio = ratio_summary(perf[key]["fp8"]["tok_s"], perf[key]["bf16"]["tok_s"])
            report.setdefault("fp8_over_bf16_tok_s", {})[key] = ratio
            line.append(f"fp8/bf16 tok/s {fmt_ratio(ratio)}")
        print("  ".join(line), flush=True)
        write()

    write()
    print("\nvariant  start s  weight MB  identical  max|dlp|  pass")
    for name in variants:
        v = report["variants"][name]
        if "error" in v:
            print(f"{name:<8} error: {v['error'][:200]}")
            continue
        acc = v["accuracy_vs_fp32_reference"]
        print(
            f"{name:<8} {v['engine_init_s']:7.1f} {v['weight_bytes_total'] / 1e6:10.1f}  "
            f"{acc['identical_prefix_tokens']:>9}  {acc['max_abs_dlogprob']:.3f}  {acc['pass']}"
        )
    print(f"JSON: {args.out}")
    return 0 if live else 1


if __name__ == "__main__":
    raise SystemExit(main())
