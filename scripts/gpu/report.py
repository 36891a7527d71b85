"""Render the H200 results (JSON from scripts/gpu/h200.sh) as markdown tables.

python scripts/gpu/report.py docs/results/h200 > /tmp/h200.md
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from ministream_reference.golden import Completion, compare

BF16_ATOL = 0.15


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def _completions(raw: list[dict[str, Any]]) -> list[Completion]:
    return [
        Completion(
            c["prompt"], c["tokens"], [{int(k): v for k, v in s.items()} for s in c["logprobs"]]
        )
        for c in raw
    ]


def golden_rows(root: Path, preset: str) -> list[str]:
    ref_path = root / f"reference-{preset}.json"
    rows = []
    for engine in ("plugin", "llama"):
        probe = _load(root / f"{engine}-{preset}.json")
        if probe is None or "golden" not in probe or not ref_path.exists():
            continue
        ref = _completions(json.loads(ref_path.read_text()))
        got = _completions(probe["golden"])
        same = sum(
            a == b
            for r, g in zip(ref, got, strict=True)
            for a, b in zip(r.tokens, g.tokens, strict=False)
        )
        total = sum(len(r.tokens) for r in ref)
        strict = compare(ref, got, atol=BF16_ATOL, require_identical=True)
        close = compare(ref, got, atol=BF16_ATOL, require_identical=False)
        rows.append(
            f"| {preset} | {engine} | {same}/{total} | "
            f"{'pass' if not strict else f'{len(strict)} issue(s)'} | "
            f"{'pass' if not close else f'{len(close)} issue(s)'} |"
        )
    return rows


def forward_parity_rows(root: Path) -> list[str]:
    """forward_parity.py's JSON: per shape, parity and A/A, forward and end to end."""
    data = _load(root / "forward-parity.json")
    if not data:
        return []

    def cell(summary: dict[str, Any]) -> str:
        lo, hi = summary["ci95"]
        return f"{summary['median']:.3f} [{lo:.3f}, {hi:.3f}]"

    rows = [
        f"{data['settings']['rounds']} rounds; ratio = t(Llama A) / t(x), median [95 % CI]\n",
        "| shape | plugin ms | Llama ms | parity (forward) | A/A (forward) | "
        "parity (end to end) | A/A (end to end) |",
        "|---|---:|---:|---|---|---|---|",
    ]
    for shape, r in data["shapes"].items():
        m = r["median_forward_ms"]
        rows.append(
            f"| {shape} | {m['plugin']:.3f} | {m['llama_a']:.3f} | {cell(r['parity_forward'])} | "
            f"{cell(r['aa_forward'])} | {cell(r['parity_e2e'])} | {cell(r['aa_e2e'])} |"
        )
    return rows


def main(root_arg: str) -> int:
    root = Path(root_arg)
    if rows := forward_parity_rows(root):
        print("### Forward-pass parity (scripts/gpu/forward_parity.py)\n")
        print("\n".join(rows) + "\n")
    print("### Golden check (vLLM bf16 vs reference fp32 on the GPU)\n")
    print(
        f"| model | engine | tokens equal | identical + logprobs (atol {BF16_ATOL}) | "
        "check_logprobs_close |"
    )
    print("|---|---|---|---|---|")
    for preset in ("seed", "gpu-1b"):
        print("\n".join(golden_rows(root, preset)))
    print("\n### Throughput and latency (offline, bf16)\n")
    print(
        "| model | engine | output tok/s (median of 3) | ratio | TTFT ms c=1/16/64 | "
        "ITL ms c=1/16/64 |"
    )
    print("|---|---|---|---|---|---|")
    for preset in ("seed", "gpu-1b"):
        med = {}
        for engine in ("plugin", "llama"):
            probe = _load(root / f"{engine}-{preset}.json")
            if probe and "throughput" in probe:
                med[engine] = statistics.median(probe["throughput"]["output_tokens_per_s"])
        for engine in ("plugin", "llama"):
            probe = _load(root / f"{engine}-{preset}.json")
            if not probe or engine not in med:
                continue
            lat = probe.get("latency", {})
            ttft = "/".join(f"{v['ttft_ms']:.1f}" for v in lat.values())
            itl = "/".join(f"{v['itl_ms']:.2f}" for v in lat.values())
            ratio = (
                f"{med['plugin'] / med['llama']:.3f}"
                if engine == "plugin" and "llama" in med
                else ""
            )
            print(f"| {preset} | {engine} | {med[engine]:,.0f} | {ratio} | {ttft} | {itl} |")
    print("\n### Side by side (scripts/bench_plugin.py: both engines in one process, ABBA)\n")
    print("| model | rounds | median ratio | paired ratio per round: median (range) | plugin won |")
    print("|---|---|---|---|---|")
    for preset in ("seed", "gpu-1b"):
        side = _load(root / f"side-by-side-{preset}.json")
        if not side:
            continue
        rates = side["output_tokens_per_s"]
        paired = [a / b for a, b in zip(rates["plugin"], rates["llama"], strict=True)]
        print(
            f"| {preset} | {len(paired)} | {side['ratio_plugin_over_llama']:.3f} | "
            f"{statistics.median(paired):.3f} ({min(paired):.3f}–{max(paired):.3f}) | "
            f"{sum(r > 1 for r in paired)} of {len(paired)} |"
        )
    print("\n### Cold start of gpu-1b per loader (page cache dropped before each)\n")
    print(
        "| loader | process start → first token s | LLM() s | weights GiB/s (log) | "
        "raw disk read GiB/s |"
    )
    print("|---|---|---|---|---|")
    for name in ("default", "sharded", "runai"):
        probe = _load(root / f"load-{name}.json")
        disk = _load(root / f"disk-{name}.json")
        if not probe:
            continue
        cs = probe["cold_start"]
        disk_bw = f"{disk['bytes_per_s'] / 2**30:.2f}" if disk else "?"
        print(
            f"| {name} | {cs['process_start_to_first_token_s']:.1f} | "
            f"{cs['llm_init_s']:.1f} | see log | {disk_bw} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
