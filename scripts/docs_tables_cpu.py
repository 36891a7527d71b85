"""The CPU benchmarks' tables (docs/benchmarks.md): plugin vs built-in Llama, loading paths."""

from __future__ import annotations

from pathlib import Path

from docs_tables import (
    Lines,
    Registry,
    header,
    interval,
    load,
    row,
    script,
)

TABLES = Registry()


# ---------------------------------------------------------------- plugin vs Llama on the CPU

BENCH_PLUGIN = {
    "docs/results/cpu/bench-plugin-instances-run1.json": "1, other work on the machine",
    "docs/results/cpu/bench-plugin-instances-run2.json": "2, nothing else running",
}


@TABLES.table("bench-plugin-cpu", *BENCH_PLUGIN)
def bench_plugin_cpu(root: Path) -> Lines:
    stats = script("interval_stats")
    lines = header(
        "run",
        "median tok/s per side (plugin / llama / plugin_b)",
        "A/B plugin/llama [95 %]",
        "A/A plugin/plugin_b [95 %]",
        "A/A spread",
        "verdict",
    )
    for rel, label in BENCH_PLUGIN.items():
        d = load(root, rel)
        med = d["median_output_tokens_per_s"]
        cmp = d["comparisons"]["tok/s"]
        ab, aa = cmp["ab_plugin_over_llama"], cmp["aa_plugin_over_plugin_b"]
        spread = stats.aa_spread(
            stats.RatioInterval(aa["ratio"], aa["lo"], aa["hi"], tuple(aa["pair_ratios"]))
        )
        lines.append(
            row(
                f"{label} (`{rel}`)",
                " / ".join(f"{med[s]:.0f}" for s in ("plugin", "llama", "plugin_b")),
                interval(ab["ratio"], ab["lo"], ab["hi"], 3),
                interval(aa["ratio"], aa["lo"], aa["hi"], 3),
                f"{spread[0]:.2f}–{spread[1]:.2f}",
                d["verdict"],
            )
        )
    return lines


BENCH_LOAD_RUN3 = "docs/results/cpu/bench-load-run3.json"


@TABLES.table("bench-load-run3", BENCH_LOAD_RUN3)
def bench_load_run3(root: Path) -> Lines:
    data = load(root, BENCH_LOAD_RUN3)
    raw = data["raw"]
    s3 = max((v for k, v in raw.items() if k.startswith("s3_get")), key=lambda v: v["bytes_per_s"])
    lines = header(
        "path",
        "TP",
        "start→/health s",
        "engine start s",
        "weights s",
        "weights MB/s",
        "raw floor MB/s",
        "ratio",
        "build+read+repack s",
        "KV cache+profile s",
    )
    floors_named: set[str] = set()
    for p in data["paths"]:
        label = p["path"] + (" (S3)" if str(p["target"]).startswith("s3://") else "")
        floor = p["raw_floor_bytes_per_s"] / 1e6
        if floor * 1e6 == raw["local_read"]["bytes_per_s"]:
            what = "file read"
        else:
            what = f"S3 GET, {s3['streams']} streams"
        floor_cell = f"{floor:.0f}" + ("" if what in floors_named else f" ({what})")
        floors_named.add(what)
        lines.append(
            row(
                label,
                p["tp"],
                f"{p['health_s']:.1f}",
                f"{p['engine_start_s']:.1f}",
                f"{p['weights_s']:.2f}",
                f"{p['weight_bytes_per_s'] / 1e6:.0f}",
                floor_cell,
                f"{p['ratio_to_floor']:.2f}",
                f"{p['load_total_s']:.1f}",
                f"{p['kv_cache_profile_s']:.1f}",
            )
        )
    return lines
