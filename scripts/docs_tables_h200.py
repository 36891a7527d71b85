"""The H200 runs' tables (docs/benchmarks.md, "H200"), one renderer each: forward parity,
cold starts, KV offload, FP8, the golden check, side by side, loaders, capture sizes."""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any

from docs_tables import (
    Lines,
    Registry,
    RenderError,
    gpu_script,
    header,
    load,
    num,
    row,
    script,
)

TABLES = Registry()

H200 = "docs/results/h200"
SERVE = "docs/results/serve"


# ---------------------------------------------------------------- H200: forward-pass parity

RUN17_PARITY = f"{H200}/run17/call2/parity-1/forward-parity.json"


def shape_label(key: str) -> str:
    """`decode:1` -> `decode 1`, `prefill:8x512` -> `prefill 8×512`."""
    kind, size = key.split(":")
    return f"{kind} {size.replace('x', '×')}"


def pair_range(summary: dict[str, Any]) -> str:
    """Mean over engines' medians, and the lowest and highest ratio of one engine pair."""
    return str(script("interval_stats").fmt_pair_range(summary))


@TABLES.table("h200-run17-parity", RUN17_PARITY)
def run17_parity(root: Path) -> Lines:
    data = load(root, RUN17_PARITY)
    n = data["settings"]["instances"]
    lines = header(
        "shape",
        f"plugin ms ({n} engines)",
        f"Llama A ms ({n} engines)",
        "**parity, forward** (engine pairs)",
        "A/A, forward (engine pairs)",
        "parity, end to end (engine pairs)",
        "A/A, end to end (engine pairs)",
    )
    for key, shape in data["shapes"].items():
        medians = shape["median_forward_ms"]

        def ms(kind: str, medians: dict[str, float] = medians) -> str:
            return " / ".join(f"{medians[f'{kind}.{i}']:.3f}" for i in range(n))

        lines.append(
            row(
                shape_label(key),
                ms("plugin"),
                ms("llama_a"),
                f"**{pair_range(shape['replicated_parity_forward'])}**",
                pair_range(shape["replicated_aa_forward"]),
                pair_range(shape["replicated_parity_e2e"]),
                pair_range(shape["replicated_aa_e2e"]),
            )
        )
    return lines


# ---------------------------------------------------------------- H200: time to Ready


def cold_start_summary(root: Path, dirs: list[str], order: list[str]) -> Lines:
    for d in dirs:
        if not (root / d).is_dir():
            raise RenderError(f"raw folder missing: {d}")
    lines: Lines = gpu_script("cold_start").summary_lines([str(root / d) for d in dirs], order)
    return lines


RUN13 = (f"{H200}/run13/call2", f"{H200}/run13/call3")
RUN17_COLD = (f"{H200}/run17/call9/coldstart-1/cold", f"{H200}/run17/call10/coldstart-1/cold")
RUN18_A = (f"{H200}/run18/call2",)
RUN18_B = (f"{H200}/run18/call4", f"{H200}/run18/call5", f"{H200}/run18/call6")


@TABLES.table("h200-run13-cold-start", *RUN13)
def run13_cold_start(root: Path) -> Lines:
    order = "vllm-fresh vllm-warm chart-graphs64-fresh chart-graphs64-seeded chart-graphs64-warm"
    order += " chart-kvb-fresh chart-kvb-seeded chart-graphs64-seeded-evict"
    order += " chart-graphs64-seeded-evict-prefetch chart-graphs64-seeded-nopyc"
    return cold_start_summary(root, list(RUN13), order.split())


@TABLES.table("h200-run17-cold-start", *RUN17_COLD)
def run17_cold_start(root: Path) -> Lines:
    return cold_start_summary(root, list(RUN17_COLD), [])


@TABLES.table("h200-run18-cold-start-a", *RUN18_A)
def run18_cold_start_a(root: Path) -> Lines:
    order = "chart-kvb-fresh chart-kvb-seeded-evict-prefetch chart-kvb-warm vllm-fresh vllm-warm"
    return cold_start_summary(root, list(RUN18_A), order.split())


@TABLES.table("h200-run18-cold-start-b", *RUN18_B)
def run18_cold_start_b(root: Path) -> Lines:
    order = "chart-kvb-fresh chart-kvb-seeded-evict-prefetch-hide chart-kvb-warm-hide"
    order += " chart-kvb-warm vllm-fresh-hide vllm-warm-hide"
    return cold_start_summary(root, list(RUN18_B), order.split())


RUN19_COLD = (f"{H200}/run19/call4/coldstart-1/cold",)
H200_ORDER = ["h200-fresh", "h200-seeded-evict-prefetch", "h200-warm", "vllm-fresh", "vllm-warm"]


@TABLES.table("h200-run19-cold-start", *RUN19_COLD)
def run19_cold_start(root: Path) -> Lines:
    return cold_start_summary(root, list(RUN19_COLD), H200_ORDER)


RUN20_B = (f"{H200}/run20/call2", f"{H200}/run20/call3")
RUN20_C = (f"{H200}/run20/call5", f"{H200}/run20/call6/coldstart-1")
RUN20_MEGA = (f"{H200}/run20/call6/coldstart-2",)


@TABLES.table("h200-run20-cold-start-b", *RUN20_B)
def run20_cold_start_b(root: Path) -> Lines:
    return cold_start_summary(root, list(RUN20_B), H200_ORDER)


@TABLES.table("h200-run20-cold-start-c", *RUN20_C)
def run20_cold_start_c(root: Path) -> Lines:
    return cold_start_summary(root, list(RUN20_C), H200_ORDER)


@TABLES.table("h200-run20-mega-aot", *RUN20_MEGA)
def run20_mega_aot(root: Path) -> Lines:
    return cold_start_summary(root, list(RUN20_MEGA), [])


RUN21_D = (f"{H200}/run21/call2", f"{H200}/run21/call3")
RUN21_BATCHES = (f"{H200}/run21/call4",)
MEGA = "-mega"  # h200.sh's suffix: VLLM_USE_MEGA_AOT_ARTIFACT=1 (vLLM 0.32's own default)


@TABLES.table("h200-run21-cold-start-d", *RUN21_D)
def run21_cold_start_d(root: Path) -> Lines:
    seeded, warm = H200_ORDER[1], H200_ORDER[2]
    order = [H200_ORDER[0], f"{warm}{MEGA}-fill", seeded, seeded + MEGA, warm, warm + MEGA]
    order += H200_ORDER[3:]
    return cold_start_summary(root, list(RUN21_D), order)


# machine: (raw folders, suffix of the chart's seeded and warm variants)
MACHINES: dict[str, tuple[tuple[str, ...], str]] = {
    "A (run 19)": (RUN19_COLD, ""),
    "B (run 20)": (RUN20_B, ""),
    "C (run 20)": (RUN20_C, ""),
    "D (run 21)": (RUN21_D, ""),
    "D (run 21), mega AOT artifact": (RUN21_D, MEGA),
}


def _ready_median(times: dict[str, tuple[list[float], int]], variant: str) -> float:
    ready, _ = times.get(variant, ([], 0))
    if not ready:
        raise RenderError(f"no start of {variant} served")
    return statistics.median(ready)


def _ready_cell(times: dict[str, tuple[list[float], int]], variant: str) -> str:
    ready, started = times.get(variant, ([], 0))
    return f"{gpu_script('cold_start').spread(ready)} ({len(ready)}/{started})"


@TABLES.table(
    "h200-cold-start-machines", *dict.fromkeys(d for m in MACHINES.values() for d in m[0])
)
def cold_start_machines(root: Path) -> Lines:
    """The chart's start against vLLM's defaults, machine by machine: Ready medians
    [min–max] (served/started) and the ratios of the medians."""
    lines = header(
        "machine",
        "**seeded new node**",
        "**warm node**",
        "vLLM defaults, fresh",
        "vLLM defaults, warm",
        "seeded / vLLM fresh",
        "warm / vLLM warm",
    )
    for machine, (dirs, suffix) in MACHINES.items():
        for d in dirs:
            if not (root / d).is_dir():
                raise RenderError(f"raw folder missing: {d}")
        times = gpu_script("cold_start").ready_times([str(root / d) for d in dirs])
        seeded, warm = H200_ORDER[1] + suffix, H200_ORDER[2] + suffix
        lines.append(
            row(
                machine,
                f"**{_ready_cell(times, seeded)}**",
                f"**{_ready_cell(times, warm)}**",
                _ready_cell(times, "vllm-fresh"),
                _ready_cell(times, "vllm-warm"),
                f"{_ready_median(times, seeded) / _ready_median(times, 'vllm-fresh'):.2f}",
                f"{_ready_median(times, warm) / _ready_median(times, 'vllm-warm'):.2f}",
            )
        )
    return lines


RUN18_PAIRS = (f"{H200}/run18/call4", f"{H200}/run18/call5")


PairMeasure = tuple[str, tuple[str, ...], str, str, str]  # label, raw folders, A, B, phase


def pairs_table(root: Path, what: str, measures: list[PairMeasure]) -> Lines:
    """Start-by-start differences A − B (cold_start.py pairs), one row per (label, raw
    folders, A, B, phase); `what` names A against B in the header."""
    cold = gpu_script("cold_start")
    lines = header(
        "measure",
        "pairs",
        f"mean {what} [95 % t-interval over pairs]",
        "median",
        "A lower in",
        align="lrlrr",
    )
    for label, dirs, a, b, phase in measures:
        rows = cold.pair_rows([str(root / d) for d in dirs], a, b, phase)
        if not rows:
            raise RenderError(f"no pairs of {a} and {b} in {', '.join(dirs)}")
        d = cold.pair_difference(rows)
        unit = cold.unit_of(phase)
        lines.append(
            row(
                label,
                d["n"],
                cold.fmt_difference(d, unit),
                f"{cold.signed(d['median'], unit)} {unit}".replace("-", "−"),
                f"{d['a_lower']} of {d['n']}",
            )
        )
    return lines


@TABLES.table("h200-run18-hide-pairs", *RUN18_PAIRS)
def run18_hide_pairs(root: Path) -> Lines:
    """chart-kvb-warm-hide against chart-kvb-warm, start by start (cold_start.py pairs)."""
    a, b = "chart-kvb-warm-hide", "chart-kvb-warm"
    measures: list[PairMeasure] = [
        (label, RUN18_PAIRS, a, b, phase)
        for phase, label in (
            ("ready", "Ready"),
            ("imports", "imports"),
            ("after_imports", "after imports"),
        )
    ]
    return pairs_table(root, "hidden − not (A − B)", measures)


@TABLES.table("h200-run21-mega-pairs", *RUN21_D, *RUN21_BATCHES)
def run21_mega_pairs(root: Path) -> Lines:
    """The mega AOT artifact against the plain compile cache, start by start on one machine:
    time to Ready, the compile phase, and each started engine's decode tokens/s after Ready
    (cold_start.py --decode-probe BATCH:128:128, three rounds, median)."""
    seeded, warm = H200_ORDER[1], H200_ORDER[2]
    measures: list[PairMeasure] = [
        ("seeded: Ready", RUN21_D, seeded + MEGA, seeded, "ready"),
        ("seeded: compile", RUN21_D, seeded + MEGA, seeded, "compile"),
        ("seeded: decode, batch 64", RUN21_D, seeded + MEGA, seeded, "decode_tokens_per_s"),
        ("warm: Ready", RUN21_D, warm + MEGA, warm, "ready"),
        ("warm: compile", RUN21_D, warm + MEGA, warm, "compile"),
        ("warm: decode, batch 64", RUN21_D, warm + MEGA, warm, "decode_tokens_per_s"),
    ]
    for batch in (256, 16):
        a, b = f"{warm}{MEGA}-b{batch}", f"{warm}-b{batch}"
        measures.append(
            (f"warm: decode, batch {batch}", RUN21_BATCHES, a, b, "decode_tokens_per_s")
        )
    return pairs_table(root, "mega − plain (A − B)", measures)


# ---------------------------------------------------------------- H200: one engine per side

RUN4_PARITY = f"{H200}/run4/forward-parity.json"
RUN11_PARITY = {
    f"{H200}/run11/forward-parity-default.json": "defaults",
    f"{H200}/run11/forward-parity-prefill-graphs.json": "piecewise graphs at 2048/4096",
    f"{H200}/run11/forward-parity-prefill-8x512-graphs.json": "piecewise graphs at 2048/4096",
}
PARITY_COLUMNS = (
    "plugin ms",
    "Llama ms",
    "**parity, forward**",
    "A/A, forward",
    "parity, end to end",
    "A/A, end to end",
)


def _parity_cells(shape: dict[str, Any]) -> list[str]:
    """Round-by-round ratios of one engine per side: median [95 % bootstrap over rounds]."""
    fmt = script("interval_stats").fmt_ratio
    medians = shape["median_forward_ms"]
    return [
        f"{medians['plugin']:.3f}",
        f"{medians['llama_a']:.3f}",
        f"**{fmt(shape['parity_forward'])}**",
        fmt(shape["aa_forward"]),
        fmt(shape["parity_e2e"]),
        fmt(shape["aa_e2e"]),
    ]


@TABLES.table("h200-run4-parity", RUN4_PARITY)
def run4_parity(root: Path) -> Lines:
    data = load(root, RUN4_PARITY)
    lines = header("shape", *PARITY_COLUMNS, align="lrr")
    for key, shape in data["shapes"].items():
        lines.append(row(shape_label(key), *_parity_cells(shape)))
    return lines


@TABLES.table("h200-run11-parity", *RUN11_PARITY)
def run11_parity(root: Path) -> Lines:
    lines = header("shape", "path", "rounds", *PARITY_COLUMNS, align="llrrr")
    for rel, path in RUN11_PARITY.items():
        data = load(root, rel)
        for key, shape in data["shapes"].items():
            label = (
                f"{path} (no graph)" if path == "defaults" and key.startswith("prefill") else path
            )
            rounds = shape["parity_forward"]["n"]
            lines.append(row(shape_label(key), label, rounds, *_parity_cells(shape)))
    return lines


# ---------------------------------------------------------------- KV-cache offload on the H200

KV_OFFLOAD = {
    f"{H200}/run16/call2/kv-offload.json": (
        '`OFFLOAD_LIMIT=500 bash scripts/gpu/h200.sh offload "$OUT"`'
    ),
    f"{H200}/run16/call6/kv-offload.json": (
        '`OFFLOAD_GIB=48 OFFLOAD_ARGS="--sessions 64 --turns 4 --prefix-tokens 3072 '
        '--concurrency 32 --pair-s 60"`'
    ),
}


def _median_ci(cell: dict[str, Any], scale: float, digits: int) -> str:
    lo, hi = cell["ci95"]
    return (
        f"{num(cell['median'] * scale, digits)} "
        f"[{num(lo * scale, digits)}, {num(hi * scale, digits)}]"
    )


def _tier(blocks: list[dict[str, Any]]) -> tuple[str, str]:
    """The offload tier's hit rate and loaded / stored GB/s: medians over the "on" blocks,
    bytes over each block's wall time."""
    on = [b for b in blocks if b["side"] == "on"]

    def med(fn: Any) -> float:
        return statistics.median(fn(b["counters"], b["wall_s"]) for b in on)

    hit = med(
        lambda c, _w: (
            c["vllm:external_prefix_cache_hits_total"]
            / c["vllm:external_prefix_cache_queries_total"]
        )
    )
    load_gbs = med(lambda c, w: c["vllm:kv_offload_load_bytes_total"] / w / 1e9)
    store_gbs = med(lambda c, w: c["vllm:kv_offload_store_bytes_total"] / w / 1e9)
    return f"{hit:.2f}", f"{load_gbs:.1f} / {store_gbs:.1f}"


@TABLES.table("h200-kv-offload", *KV_OFFLOAD)
def kv_offload(root: Path) -> Lines:
    lines = header(
        "workload",
        "side",
        "pairs",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "output tok/s",
        "offload tier hit rate",
        "loaded / stored GB/s",
        align="llrlllrl",
    )
    for rel, command in KV_OFFLOAD.items():
        d = load(root, rel)
        w, s = d["workload"], d["summary"]
        label = (
            f"{w['sessions']} sessions x {w['turns']} turns, {num(w['prefix_tokens'], 0)}-token "
            f"prefix, {w['concurrency']} in flight; tier {d['offload_gib']:g} GiB ({command})"
        )
        hit, gbs = _tier(d["blocks"])
        for side in ("off", "on"):
            c = s["sides"][side]
            lines.append(
                row(
                    label if side == "off" else "",
                    side,
                    c["ttft_p50_s"]["n"],
                    _median_ci(c["ttft_p50_s"], 1000, 1),
                    _median_ci(c["ttft_p99_s"], 1000, 1),
                    _median_ci(c["output_tok_s"], 1, 0),
                    hit if side == "on" else "–",
                    gbs if side == "on" else "–",
                )
            )
        r = s["ratio_on_off"]
        lines.append(
            row(
                "",
                "**on/off**",
                r["ttft_p50_s"]["n"],
                *(f"**{_median_ci(r[k], 1, 2)}**" for k in ("ttft_p50_s", "ttft_p99_s")),
                f"**{_median_ci(r['output_tok_s'], 1, 2)}**",
                "",
                "",
            )
        )
    return lines


# ---------------------------------------------------------------- FP8 on the H200

FP8 = f"{H200}/run5/fp8-compare.json"
FP8_EMULATION = f"{H200}/run5/fp8-emulation-check.json"


@TABLES.table("h200-fp8", FP8)
def fp8(root: Path) -> Lines:
    data = load(root, FP8)
    variants = data["variants"]
    levels = [f"c={c}" for c in data["settings"]["concurrency"].split(",")]
    lines = header(
        "variant",
        "engine start (empty compile cache; the first pays the process's CUDA and Triton set-up)",
        "weights on GPU",
        f"tok/s {' / '.join(levels)}",
        f"TTFT ms {' / '.join(levels)}",
        f"ITL ms {' / '.join(levels)}",
        "vs fp32 reference",
        align="lrr",
    )
    base = variants["bf16"]["weight_bytes_total"]
    for name, v in variants.items():
        perf = v["performance"]

        def med(metric: str, digits: int, perf: dict[str, Any] = perf) -> str:
            return " / ".join(num(statistics.median(perf[c][metric]), digits) for c in levels)

        acc = v["accuracy_vs_fp32_reference"]
        weights = f"{v['weight_bytes_total'] / 1e9:.2f} GB"
        if v["weight_bytes_total"] != base:
            weights += f" ({v['weight_bytes_total'] / base:.2f}×)"
        lines.append(
            row(
                name,
                f"{v['engine_init_s']:.1f} s",
                weights,
                med("tok_s", 0),
                med("ttft_ms", 1),
                med("itl_ms", 2),
                f"{acc['identical_prefix_tokens']} identical, max \\|Δ logprob\\| "
                f"{acc['max_abs_dlogprob']:.3g} (atol {acc['atol']:g}): "
                f"**{'pass' if acc['pass'] else 'fail'}**",
            )
        )
    return lines


FP8_PAIRS = {
    "gpu_fp8~reference": "GPU FP8 vs fp32 reference",
    "gpu_fp8~emulated": "**GPU FP8 vs CPU FP8 emulation**",
    "emulated~reference": "CPU FP8 emulation vs fp32 reference",
    "gpu_bf16~reference": "GPU bf16 vs fp32 reference",
}


@TABLES.table("h200-fp8-emulation", FP8_EMULATION)
def fp8_emulation(root: Path) -> Lines:
    pairs = load(root, FP8_EMULATION)["pairs"]
    lines = header(
        "pair (greedy tokens, 4 prompts × 16)",
        "identical prefix per prompt",
        "total",
        align="llr",
    )
    for key, label in FP8_PAIRS.items():
        p = pairs[key]
        total = f"**{p['total']}**" if label.startswith("**") else p["total"]
        lines.append(row(label, ", ".join(map(str, p["per_prompt"])), total))
    return lines


# ---------------------------------------------------------------- H200: earlier cold-start runs

RUN4_COLD = (f"{H200}/run4",)
RUN6_7_COLD = {f"{H200}/run6": "6 (lazy registration)", f"{H200}/run7": "7 (eager registration)"}
RUN9_COLD = (f"{H200}/run9",)


@TABLES.table("h200-run4-cold-start", *RUN4_COLD)
def run4_cold_start(root: Path) -> Lines:
    return cold_start_summary(root, list(RUN4_COLD), [])


@TABLES.table("h200-run6-7-cold-start", *RUN6_7_COLD)
def run6_7_cold_start(root: Path) -> Lines:
    order = ["vllm-fresh", "chart-fresh", "vllm-warm", "chart-warm"]
    lines: Lines = []
    for rel, run in RUN6_7_COLD.items():
        table = cold_start_summary(root, [rel], order)
        if not lines:
            lines = ["| run " + table[0], "|---" + table[1]]
        lines += [f"| {run} " + line for line in table[2:]]
    return lines


@TABLES.table("h200-run9-cold-start", *RUN9_COLD)
def run9_cold_start(root: Path) -> Lines:
    order = [
        "vllm-fresh",
        "chart-fork-fresh",
        "vllm-warm",
        "chart-warm",
        "chart-fork-warm",
        "chart-fork-warm-fork",
        "chart-fork-seeded",
        "chart-graphs64-warm-fork",
    ]
    return cold_start_summary(root, list(RUN9_COLD), order)


# ---------------------------------------------------- H200: golden, side by side, loaders

GOLDEN = tuple(
    f"{H200}/{engine}-{preset}.json"
    for preset in ("seed", "gpu-1b")
    for engine in ("reference", "plugin", "llama")
)


@TABLES.table("h200-golden", *GOLDEN)
def golden(root: Path) -> Lines:
    """Tokens and top-5 logprobs against the fp32 reference (scripts/gpu/report.py's rule)."""
    for rel in GOLDEN:
        load(root, rel)  # every raw file present, or a RenderError naming it
    report = gpu_script("report")
    lines = header(
        "model",
        "engine",
        "tokens equal",
        f"identical, logprobs atol {report.BF16_ATOL:g}",
        f"check_logprobs_close (atol {report.BF16_ATOL:g})",
    )
    for preset in ("seed", "gpu-1b"):
        lines += report.golden_rows(root / H200, preset)
    return lines


SIDE_BY_SIDE = (f"{H200}/side-by-side-seed.rounds.txt", f"{H200}/side-by-side-gpu-1b.json")
SIDE_BY_SIDE_RUN3 = f"{H200}/run3/side-by-side-gpu-1b.json"


def _seed_rounds(root: Path, rel: str) -> dict[str, list[float]]:
    """`round 1/6: plugin 27704 tok/s, llama 26944 tok/s` lines of a log excerpt."""
    path = root / rel
    if not path.is_file():
        raise RenderError(f"raw file missing: {rel}")
    rounds: dict[str, list[float]] = {"plugin": [], "llama": []}
    for m in re.finditer(r"plugin (\d+) tok/s, llama (\d+) tok/s", path.read_text()):
        rounds["plugin"].append(float(m[1]))
        rounds["llama"].append(float(m[2]))
    return rounds


def _k(values: list[float]) -> str:
    return " ".join(f"{v / 1000:.1f}k" for v in values)


@TABLES.table("h200-side-by-side", *SIDE_BY_SIDE)
def side_by_side(root: Path) -> Lines:
    lines = header(
        "model",
        "plugin tok/s per round",
        "Llama tok/s per round",
        "median ratio plugin/Llama",
    )
    seed = _seed_rounds(root, SIDE_BY_SIDE[0])
    gpu = load(root, SIDE_BY_SIDE[1])["output_tokens_per_s"]
    for name, rounds in (("seed", seed), ("gpu-1b", gpu)):
        ratio = statistics.median(rounds["plugin"]) / statistics.median(rounds["llama"])
        lines.append(row(name, _k(rounds["plugin"]), _k(rounds["llama"]), f"{ratio:.3g}"))
    return lines


@TABLES.table("h200-side-by-side-run3", SIDE_BY_SIDE_RUN3)
def side_by_side_run3(root: Path) -> Lines:
    d = load(root, SIDE_BY_SIDE_RUN3)
    rounds, paired = d["output_tokens_per_s"], d["paired_ratios"]
    lines = header(
        "model",
        "plugin tok/s per round",
        "Llama tok/s per round",
        "median ratio",
        "paired ratio per round: median (range)",
        "plugin won",
    )
    lines.append(
        row(
            "gpu-1b",
            _k(rounds["plugin"]),
            _k(rounds["llama"]),
            f"**{d['ratio_plugin_over_llama']:.3f}**",
            f"{d['median_paired_ratio']:.3f} ({min(paired):.3f}–{max(paired):.3f})",
            f"{d['plugin_won_rounds']} of {len(paired)}",
        )
    )
    return lines


LOADERS = {
    "first start (no compile cache)": (f"{H200}/plugin-gpu-1b.json", None),
    "default (compile cache warm)": (f"{H200}/load-default.json", f"{H200}/disk-default.json"),
    "runai_streamer, local files": (f"{H200}/load-runai.json", f"{H200}/disk-runai.json"),
}
LOADERS_RUN2 = {
    "default": (f"{H200}/run2/load-default.json", f"{H200}/run2/disk-default.json"),
    "sharded_state": (f"{H200}/run2/load-sharded.json", f"{H200}/run2/disk-sharded.json"),
}


def _loader_rows(root: Path, loaders: dict[str, tuple[str, str | None]], unit: str) -> Lines:
    lines = header(
        "loader",
        "process start → first token",
        "imports",
        "`LLM()`",
        f"raw disk read, same run ({unit})",
        align="lrrrr",
    )
    scale = 2**30 if unit == "GiB/s" else 1e9
    for label, (probe_rel, disk_rel) in loaders.items():
        cs = load(root, probe_rel)["cold_start"]
        disk = f"{load(root, disk_rel)['bytes_per_s'] / scale:.2f}" if disk_rel else ""
        lines.append(
            row(
                label,
                f"{cs['process_start_to_first_token_s']:.1f} s",
                f"{cs['imports_s']:.1f} s",
                f"{cs['llm_init_s']:.1f} s",
                disk,
            )
        )
    return lines


@TABLES.table("h200-loaders", *(r for pair in LOADERS.values() for r in pair if r is not None))
def loaders(root: Path) -> Lines:
    return _loader_rows(root, LOADERS, "GiB/s")


@TABLES.table("h200-loaders-run2", *(r for pair in LOADERS_RUN2.values() for r in pair))
def loaders_run2(root: Path) -> Lines:
    return _loader_rows(root, {k: (a, b) for k, (a, b) in LOADERS_RUN2.items()}, "GB/s")


# ---------------------------------------------------------------- H200: capture sizes

RUN19_CAPTURE = f"{H200}/run19/call3/capture-1/capture-sizes.json"  # run 2, 10 rounds
RUN19_CAPTURE_1 = f"{H200}/run19/call2/capture-1/capture-sizes.json"  # run 1, 7 rounds
CAPTURE_KINDS = {
    "vllm_a": "vLLM's (vllm_a)",
    "vllm_b": "vLLM's (vllm_b)",
    "size64": "size 64",
    "chart": "**chart**",
}


def _engines(report: dict[str, Any], kind: str) -> list[str]:
    return [e for e in report["engines"] if e.split(".")[0] == kind]


def _capture_spread(report: dict[str, Any], kind: str) -> str:
    """A kind's capture seconds, `median [min–max]` over its engines."""
    seconds = [report["engines"][e]["capture"]["seconds"] for e in _engines(report, kind)]
    return f"{statistics.median(seconds):.2f} [{min(seconds):.2f}–{max(seconds):.2f}]"


@TABLES.table("h200-run19-capture", RUN19_CAPTURE, RUN19_CAPTURE_1)
def run19_capture(root: Path) -> Lines:
    report, report_1 = load(root, RUN19_CAPTURE), load(root, RUN19_CAPTURE_1)
    n = report["settings"]["instances"]
    lines = header(
        "capture sizes",
        "sizes",
        f"capture s, median [min–max] over {n} engines",
        "run 1",
        "graph memory GiB",
        align="lrllr",
    )
    for kind, label in CAPTURE_KINDS.items():
        captures = [report["engines"][e]["capture"] for e in _engines(report, kind)]
        sizes = "/".join(str(k) for k in sorted({len(c["sizes"]) for c in captures}))
        memory = "/".join(f"{g:.2f}" for g in sorted({c["graph_bytes"] / 2**30 for c in captures}))
        bold = "**" if kind == "chart" else ""
        lines.append(
            row(
                label,
                sizes,
                f"{bold}{_capture_spread(report, kind)}{bold}",
                f"{bold}{_capture_spread(report_1, kind)}{bold}",
                memory,
            )
        )
    return lines


def _decode_range(report: dict[str, Any], batch: str, kind: str) -> str:
    """Throughput of `kind` over vllm_a's: the ratio of the kinds' means of engine medians and
    the lowest and highest engine pair (three engines a kind, started in one fixed kind order,
    not in rotated blocks: interval_stats' method for instances not created in blocks)."""
    times = report["forward_ms"][batch]
    # time(vllm_a) / time(kind) = throughput(kind) / throughput(vllm_a)
    summary = script("interval_stats").instance_pair_range(
        [times[e] for e in _engines(report, "vllm_a")],
        [times[e] for e in _engines(report, kind)],
    )
    return pair_range(summary)


@TABLES.table("h200-run19-decode", RUN19_CAPTURE, RUN19_CAPTURE_1)
def run19_decode(root: Path) -> Lines:
    report, report_1 = load(root, RUN19_CAPTURE), load(root, RUN19_CAPTURE_1)
    lines = header(
        "batch",
        "vLLM's sizes tok/s",
        "size 64 tok/s",
        "chart tok/s",
        "A/A (vllm_b / vllm_a)",
        "size 64 / vLLM's",
        "**chart / vLLM's**",
        f"chart / vLLM's, run 1 ({report_1['settings']['rounds']} rounds)",
        align="rrrr",
    )
    for batch, figures in report["batches"].items():
        tps = figures["tokens_per_s"]
        lines.append(
            row(
                batch,
                *(f"{tps[kind] / 1e3:.1f}k" for kind in ("vllm_a", "size64", "chart")),
                _decode_range(report, batch, "vllm_b"),
                _decode_range(report, batch, "size64"),
                f"**{_decode_range(report, batch, 'chart')}**",
                _decode_range(report_1, batch, "chart"),
            )
        )
    return lines
