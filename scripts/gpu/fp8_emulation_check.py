"""Are a GPU FP8 run's tokens what FP8 does to the model? Compared with its CPU emulation.

fp8_compare.py measures the FP8 engine against the fp32 reference; a large gap there has two
readings: FP8's rounding moves this model's greedy choices (a random-weight model has small
margins between its top tokens), or the serving path (the plugin's quant config, the fused
scales) adds an error of its own. The emulation (`ministream_reference.fp8_emulation`, the
reference model with vLLM's online-FP8 rounding) separates them: where the GPU's FP8 tokens
follow the emulation much longer than they follow the fp32 reference, the gap is FP8's.

    python -m ministream_reference.golden --engine reference --emulate fp8 \\
        --model DIR --out emulated.json                     # CPU, minutes for gpu-1b
    python scripts/gpu/fp8_emulation_check.py --fp8-report fp8-compare.json \\
        --reference reference.json --emulated emulated.json --out check.json

Prints, per golden prompt, the identical-prefix length of each pair (of 16 tokens) and writes
the same as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ministream_testkit.results import write_json

PAIRS = (
    ("gpu_fp8", "reference"),
    ("gpu_fp8", "emulated"),
    ("emulated", "reference"),
    ("gpu_bf16", "reference"),
)


def identical_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two greedy sequences share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def check(fp8_report: dict[str, Any], reference: list[Any], emulated: list[Any]) -> dict[str, Any]:
    """Per-prompt identical prefixes of every pair in PAIRS, and their totals."""
    tokens = {
        "gpu_fp8": fp8_report["variants"]["fp8"]["golden_tokens"],
        "gpu_bf16": fp8_report["variants"]["bf16"]["golden_tokens"],
        "reference": [c["tokens"] for c in reference],
        "emulated": [c["tokens"] for c in emulated],
    }
    if [c["prompt"] for c in reference] != [c["prompt"] for c in emulated]:
        raise SystemExit("the reference and the emulation were run on different prompts")
    counts = {len(v) for v in tokens.values()}
    if len(counts) != 1:
        raise SystemExit(
            f"different numbers of prompts: { {k: len(v) for k, v in tokens.items()} }"
        )
    total = sum(len(seq) for seq in tokens["reference"])
    pairs: dict[str, Any] = {}
    for a, b in PAIRS:
        per_prompt = [identical_prefix(x, y) for x, y in zip(tokens[a], tokens[b], strict=True)]
        pairs[f"{a}~{b}"] = {"per_prompt": per_prompt, "total": f"{sum(per_prompt)}/{total}"}
    return {"pairs": pairs, "tokens": tokens}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--fp8-report", required=True, help="fp8_compare.py's JSON")
    parser.add_argument("--reference", required=True, help="fp32 reference golden JSON")
    parser.add_argument("--emulated", required=True, help="golden JSON of --emulate fp8")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    result = check(
        json.loads(Path(args.fp8_report).read_text()),
        json.loads(Path(args.reference).read_text()),
        json.loads(Path(args.emulated).read_text()),
    )
    print(f"{'pair':<22} identical prefix per prompt   total")
    for name, pair in result["pairs"].items():
        print(f"{name:<22} {pair['per_prompt']!s:<28} {pair['total']}")
    write_json(Path(args.out), result, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
