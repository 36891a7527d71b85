"""LoRA adapters mixed on one GPU: output throughput with 0, 1, 4 and 16 adapters, one engine.

One vLLM engine serves a converted MiniStream model through the plugin with LoRA on and the
chart's slot rule (`--max-loras` = the most adapters in use + 1). Each arm sends the same
prompts (random token ids, fixed length, `ignore_eos`): arm 0 as base requests, arm k spread
round robin over k adapters (`ministream demo-lora` + `convert-lora`, ranks alternating 8 and
16). Rounds rotate the arms' order; the table gives each arm's output tokens/s (median and
range over rounds, after one unrecorded pass per arm) and its ratio to arm 0 in the same
round.

    python3 scripts/gpu/lora_throughput.py --model M --adapters DIR --out lora.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ministream_testkit.results import write_json

RANKS = (8, 16)


def make_adapters(model: Path, root: Path, count: int) -> list[tuple[str, Path, int]]:
    """`count` converted adapters for `model` under `root` (made once, reused after)."""
    adapters = []
    for i in range(count):
        name, rank = f"a{i}", RANKS[i % len(RANKS)]
        out = root / name
        if not (out / "ministream_manifest.json").exists():
            pt = root / f"{name}.pt"
            cli = [sys.executable, "-m", "ministream.cli"]
            subprocess.run(
                [
                    *cli,
                    "demo-lora",
                    "--base",
                    str(model),
                    "--output",
                    str(pt),
                    "--rank",
                    str(rank),
                    "--seed",
                    str(i),
                ],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            subprocess.run(
                [
                    *cli,
                    "convert-lora",
                    "--adapter",
                    str(pt),
                    "--base",
                    str(model),
                    "--output",
                    str(out),
                    "--force",
                    "--quiet",
                ],
                check=True,
                stdout=subprocess.DEVNULL,
            )
        adapters.append((name, out, rank))
    return adapters


def arm_adapters(arm: int, prompts: int) -> list[int | None]:
    """Adapter index per prompt: None (base) for arm 0, else round robin over `arm`."""
    return [None if arm == 0 else i % arm for i in range(prompts)]


def summarize(rounds: dict[int, list[float]]) -> list[dict[str, Any]]:
    """Per arm: median and range of tok/s, and of the ratio to arm 0 in the same round."""
    base = rounds[0]
    rows = []
    for arm, values in rounds.items():
        ratios = [v / b for v, b in zip(values, base, strict=True)]
        rows.append(
            {
                "adapters": arm,
                "tok_s_median": statistics.median(values),
                "tok_s_min": min(values),
                "tok_s_max": max(values),
                "ratio_median": statistics.median(ratios),
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
                "rounds": values,
            }
        )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| adapters | output tok/s median [min-max] | ratio to 0 adapters median [min-max] |",
        "|---:|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['adapters']} | {r['tok_s_median']:.0f} [{r['tok_s_min']:.0f}-"
            f"{r['tok_s_max']:.0f}] | {r['ratio_median']:.3f} [{r['ratio_min']:.3f}-"
            f"{r['ratio_max']:.3f}] |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--adapters", type=Path, required=True, help="where the adapters are made")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--arms", default="0,1,4,16")
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--extra", default="{}", help="more vllm.LLM arguments, as JSON")
    ap.add_argument("--adapters-only", action="store_true", help="make the adapters, then stop")
    args = ap.parse_args()

    arms = [int(a) for a in args.arms.split(",")]
    if arms[0] != 0:
        ap.error("--arms must start with 0 (the ratios are to the base arm)")
    args.adapters.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    adapters = make_adapters(args.model, args.adapters, max(arms))
    made_s = time.perf_counter() - t0
    if args.adapters_only:
        print(f"{len(adapters)} adapters in {args.adapters} ({made_s:.0f} s)")
        return 0

    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    llm = LLM(
        model=str(args.model),
        dtype=args.dtype,
        enable_lora=True,
        max_loras=max(arms) + 1,
        max_cpu_loras=max(arms) + 1,
        max_lora_rank=max(RANKS),
        max_model_len=args.prompt_len + args.max_tokens + 16,
        seed=0,
        **json.loads(args.extra),
    )
    rng = random.Random(0)
    vocab = llm.get_tokenizer().vocab_size
    prompts = [
        {"prompt_token_ids": [rng.randrange(10, vocab - 10) for _ in range(args.prompt_len)]}
        for _ in range(args.prompts)
    ]
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True, temperature=0.0)
    requests = [LoRARequest(name, i + 1, str(path)) for i, (name, path, _) in enumerate(adapters)]

    def run(arm: int, n: int) -> float:
        picks = arm_adapters(arm, n)
        lora = [None if p is None else requests[p] for p in picks]
        start = time.perf_counter()
        outs = llm.generate(prompts[:n], params, lora_request=lora, use_tqdm=False)
        elapsed = time.perf_counter() - start
        return sum(len(o.outputs[0].token_ids) for o in outs) / elapsed

    for arm in arms:  # one full unrecorded pass per arm: adapters loaded, kernels compiled
        run(arm, args.prompts)
    rounds: dict[int, list[float]] = {arm: [] for arm in arms}
    for r in range(args.rounds):
        order = arms[r % len(arms) :] + arms[: r % len(arms)]
        for arm in order:
            rounds[arm].append(run(arm, args.prompts))
            print(f"round {r} arm {arm}: {rounds[arm][-1]:.0f} tok/s", flush=True)
    rows = summarize(rounds)
    result = {
        "what": "output tok/s with 0..N LoRA adapters mixed round robin, one engine",
        "settings": {
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "max_loras": max(arms) + 1,
            "max_lora_rank": max(RANKS),
            "adapter_ranks": [rank for _, _, rank in adapters],
            "adapters_made_s": round(made_s, 1),
        },
        "arms": rows,
    }
    write_json(args.out, result)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
