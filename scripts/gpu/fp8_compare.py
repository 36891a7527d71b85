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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ministream_testkit.provenance import stamp
from ministream_testkit.results import write_json

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


def _parse(argv: list[str] | None) -> argparse.Namespace:
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
    return args


def start_variant(
    name: str, args: argparse.Namespace, llm_args: dict[str, Any], reference: list[Any]
) -> tuple[Any, dict[str, Any]]:
    """The variant's engine (None when it failed to start) and its report entry: start
    time, weight bytes and accuracy on the golden prompts, or the error."""
    from vllm import LLM, SamplingParams

    from ministream_reference.golden import DEFAULT_PROMPTS, Completion

    t0 = time.perf_counter()
    try:
        llm = LLM(model=args.model, **llm_args, **VARIANT_ARGS[name])
    except Exception as exc:  # e.g. FP8 on a build without the kernels: say so, go on
        print(f"{name}: engine failed: {exc!r}"[:400], flush=True)
        return None, {"error": repr(exc)[:2000]}
    init_s = time.perf_counter() - t0
    weights = llm.collective_rpc("forward_timer_weight_bytes")[0]
    golden = llm.generate(
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
    print(f"{name}: up in {init_s:.1f} s, weights {weights}", flush=True)
    return llm, {
        "engine_init_s": init_s,
        "weight_bytes": weights,
        "weight_bytes_total": sum(weights.values()),
        "accuracy_vs_fp32_reference": accuracy(reference, got, ATOL[name]),
        "golden_tokens": [c.tokens for c in got],
    }


@dataclass
class Bench:
    """Timed batches of one concurrency on the live engines."""

    args: argparse.Namespace
    engines: dict[str, Any]
    vocab: int

    def batch(self, c: int, seed: int) -> list[dict[str, list[int]]]:
        return [
            {
                "prompt_token_ids": [
                    3 + (seed * 7919 + i * 104729 + j * 31) % (self.vocab - 3)
                    for j in range(self.args.prompt_len)
                ]
            }
            for i in range(c)
        ]

    def timed(self, name: str, prompts: list[Any], max_tokens: int) -> float:
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        t0 = time.perf_counter()
        self.engines[name].generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - t0

    def concurrency(self, c: int, live: list[str]) -> dict[str, dict[str, list[float]]]:
        """Per live variant at concurrency c: tokens/s, offline TTFT and ITL per round, the
        variants' order alternating (ABBA), after an untimed warm-up at this batch size."""
        out_len = self.args.output_len
        perf: dict[str, dict[str, list[float]]] = {
            v: {"tok_s": [], "ttft_ms": [], "itl_ms": []} for v in live
        }
        for name in live:  # warm-up at this batch size
            self.timed(name, self.batch(c, -1), out_len)
        for rnd in range(self.args.rounds):
            order = live if rnd % 2 == 0 else live[::-1]
            for name in order:
                prompts = self.batch(c, rnd)
                ttft = self.timed(name, prompts, 1)
                total = self.timed(name, prompts, out_len)
                perf[name]["tok_s"].append(c * out_len / total)
                perf[name]["ttft_ms"].append(1000 * ttft)
                perf[name]["itl_ms"].append(1000 * (total - ttft) / (out_len - 1))
        return perf


def record_concurrency(
    report: dict[str, Any], key: str, perf: dict[str, dict[str, list[float]]]
) -> str:
    """Put one concurrency's figures into `report`; its progress line."""
    line = [key]
    for name, figures in perf.items():
        med = {m: statistics.median(v) for m, v in figures.items()}
        report["variants"][name].setdefault("performance", {})[key] = med | figures
        line.append(
            f"{name} {med['tok_s']:.0f} tok/s TTFT {med['ttft_ms']:.1f} ITL {med['itl_ms']:.2f}"
        )
    if "fp8" in perf and "bf16" in perf:
        ratio = ratio_summary(perf["fp8"]["tok_s"], perf["bf16"]["tok_s"])
        report.setdefault("fp8_over_bf16_tok_s", {})[key] = ratio
        line.append(f"fp8/bf16 tok/s {fmt_ratio(ratio)}")
    return "  ".join(line)


def print_variants(report: dict[str, Any], variants: list[str], out: str) -> None:
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
    print(f"JSON: {out}")


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
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
    from ministream_reference.golden import load

    reference = load(args.reference)
    engines: dict[str, Any] = {}
    # Stamped once: the provenance block is the same for every stage's copy.
    report: dict[str, Any] = stamp(
        {
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
            "versions": engine_versions(),
            "settings": vars(args) | {"llm_args": llm_args},
            "variants": {},
        }
    )
    for name in variants:
        llm, report["variants"][name] = start_variant(name, args, llm_args, reference)
        if llm is not None:
            engines[name] = llm
    out = Path(args.out)
    write_json(out, report)  # after every stage: a run cut short keeps what it measured
    live = [v for v in variants if v in engines]
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    bench = Bench(args, engines, vocab)
    for c in (int(x) for x in args.concurrency.split(",")):
        perf = bench.concurrency(c, live)
        print(record_concurrency(report, f"c={c}", perf), flush=True)
        write_json(out, report)
    write_json(out, report)
    print_variants(report, variants, args.out)
    return 0 if live else 1


if __name__ == "__main__":
    raise SystemExit(main())
