"""One vLLM engine, measured: cold start and golden outputs.

Run in a fresh process per configuration (`vllm.LLM` needs the `__main__` guard):

    python scripts/gpu/engine_probe.py --model DIR --out FILE.json [--load-format F]
        [--golden] [--save-sharded DIR]

Cold start is process start → imports done → `LLM()` returned → first token; vLLM's own
log lines (weights, torch.compile, CUDA-graph capture, engine init) split `LLM()` further.
Throughput and latency: scripts/bench_plugin.py (both engines side by side).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ministream_testkit.results import write_json

PROCESS_START = time.time()


def _prompts(n: int, length: int) -> list[dict[str, list[int]]]:
    return [
        {"prompt_token_ids": [1 + (i * 7919 + j * 104729) % 31000 for j in range(length)]}
        for i in range(n)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    parser.add_argument("--golden", action="store_true")
    parser.add_argument("--save-sharded", help="also save vLLM sharded_state here")
    parser.add_argument("--extra", default="{}", help="JSON kwargs for vllm.LLM")
    args = parser.parse_args()

    import ministream

    ministream.register()
    from vllm import LLM, SamplingParams

    from ministream_reference.golden import DEFAULT_PROMPTS, Completion

    result: dict[str, Any] = {"model": args.model, "load_format": args.load_format}
    t0 = time.time()
    llm_kwargs = dict(
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        load_format=args.load_format,
        seed=0,
        **json.loads(args.extra),
    )
    llm = LLM(model=args.model, **llm_kwargs)
    t_ready = time.time()
    first = llm.generate(_prompts(1, 16), SamplingParams(max_tokens=1), use_tqdm=False)
    t_first = time.time()
    assert first[0].outputs[0].token_ids
    result["cold_start"] = {
        "imports_s": t0 - PROCESS_START,
        "llm_init_s": t_ready - t0,
        "first_token_s": t_first - t_ready,
        "process_start_to_first_token_s": t_first - PROCESS_START,
    }

    if args.save_sharded:
        Path(args.save_sharded).mkdir(parents=True, exist_ok=True)
        llm.llm_engine.engine_core.save_sharded_state(path=args.save_sharded)

    if args.golden:
        prompts = [list(p) for p in DEFAULT_PROMPTS]
        params = SamplingParams(temperature=0.0, max_tokens=16, logprobs=5)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        result["golden"] = [
            asdict(
                Completion(
                    p,
                    list(o.outputs[0].token_ids),
                    [
                        {int(t): float(lp.logprob) for t, lp in step.items()}
                        for step in (o.outputs[0].logprobs or [])
                    ],
                )
            )
            for p, o in zip(prompts, outs, strict=True)
        ]

    write_json(Path(args.out), result)
    del llm
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
