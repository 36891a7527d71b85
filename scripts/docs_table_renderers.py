"""The docs' tables of measured figures, one small renderer each (scripts/docs_tables.py).

Each function reads only the raw files it is registered with and returns the table's lines;
labels that describe a setting (a run's name, a shape) may be written here, every figure is
read or computed from the raw files. Interval methods come from the one statistics module
(`scripts/interval_stats.py`, which says which method fits which comparison).
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any

from docs_tables import (
    Lines,
    Registry,
    RenderError,
    fig,
    gpu_script,
    header,
    interval,
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


RUN18_PAIRS = (f"{H200}/run18/call4", f"{H200}/run18/call5")


@TABLES.table("h200-run18-hide-pairs", *RUN18_PAIRS)
def run18_hide_pairs(root: Path) -> Lines:
    """chart-kvb-warm-hide against chart-kvb-warm, start by start (cold_start.py pairs)."""
    cold = gpu_script("cold_start")
    a, b = "chart-kvb-warm-hide", "chart-kvb-warm"
    lines = header(
        "measure",
        "pairs",
        "mean hidden − not, s [95 % t-interval over pairs]",
        "median, s",
        "hidden lower in",
        align="lrlrr",
    )
    measures = (("ready", "Ready"), ("imports", "imports"), ("after_imports", "after imports"))
    for phase, label in measures:
        rows = cold.pair_rows([str(root / d) for d in RUN18_PAIRS], a, b, phase)
        d = cold.pair_difference(rows)
        lines.append(
            row(
                label,
                d["n"],
                cold.fmt_difference(d),
                f"{d['median']:+.2f}".replace("-", "−"),
                f"{d['a_lower']} of {d['n']}",
            )
        )
    return lines


# ---------------------------------------------------------------- routing by cache

ROUTING_CPU = f"{SERVE}/routing-cpu.json"
ROUTING_H200 = (
    f"{H200}/run17/call7/routing-1/routing-h200.json",
    f"{H200}/run17/call8/routing-1/routing-h200.json",
)


def _rounds_of(data: dict[str, Any], policy: str) -> int:
    return sum(policy in r for r in data["rounds"])


def _policy_row(data: dict[str, Any], policy: str, *lead: str) -> str:
    p = data["summary"]["policies"][policy]
    return row(
        *lead,
        policy,
        _rounds_of(data, policy),
        f"{p['hit_rate']:.3f}",
        fig(p["ttft_p50_s"] * 1000),
        fig(p["ttft_p99_s"] * 1000),
        fig(p["output_tok_s"]),
        p["failed"],
    )


def _ratio_row(data: dict[str, Any], policy: str, *lead: str) -> str:
    base = "round_robin"
    r = data["summary"][f"{policy}_over_{base}"]
    cell = {k: interval(v["ratio"], v["lo"], v["hi"]) for k, v in r.items()}
    return row(
        *lead,
        f"**{policy} / {base}**",
        r["hit_rate"]["n"],
        f"**{cell['hit_rate']}**",
        f"**{cell['ttft_p50_s']}**",
        cell["ttft_p99_s"],
        cell["output_tok_s"],
        "",
    )


ROUTING_COLUMNS = ("rounds", "prefix-cache hit rate", "TTFT p50 ms", "TTFT p99 ms")


@TABLES.table("routing-cpu", ROUTING_CPU)
def routing_cpu(root: Path) -> Lines:
    data = load(root, ROUTING_CPU)
    policies = data["policies"]
    lines = header("policy", *ROUTING_COLUMNS, "output tok/s", "failed", align="lrrrrrr")
    lines += [_policy_row(data, p) for p in policies]
    lines += [_ratio_row(data, p) for p in policies if p != "round_robin"]
    return lines


@TABLES.table("routing-h200", *ROUTING_H200)
def routing_h200(root: Path) -> Lines:
    lines = header(
        "offered rate", "policy", *ROUTING_COLUMNS, "output tok/s", "failed", align="rlrrrrrr"
    )
    for rel in ROUTING_H200:
        data = load(root, rel)
        rate = f"{data['workload']['rate']:g} req/s"
        lines += [_policy_row(data, p, rate) for p in ("round_robin", "cache_aware")]
        lines.append(_ratio_row(data, "cache_aware", rate))
    return lines


# ---------------------------------------------------------------- rolling restarts


def _pct(window: dict[str, Any], metric: str) -> str:
    m = window[metric]
    return " / ".join(f"{m[p] / 1000:.2f}" for p in ("p50", "p95", "p99")) + " s"


def _causes(report: dict[str, Any]) -> str:
    causes = report["failures_by_cause"]
    if not causes:
        return "—"
    text = ", ".join(f"`{k}`: {v}" for k, v in sorted(causes.items()))
    pods = ", ".join(f"{k}: {v}" for k, v in sorted(report["failures_by_pod"].items()))
    return f"{text} ({pods})"


def _counter(report: dict[str, Any], name: str, **labels: str) -> dict[str, float]:
    """The router's counter `name` by its `worker` label (or '' without one), filtered."""
    out: dict[str, float] = {}
    for key, value in report["front"]["router_counters"].items():
        m = re.fullmatch(r"(\w+)(?:\{(.*)\})?", key)
        if not m or m[1] != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m[2] or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            out[got.get("worker", "")] = out.get(got.get("worker", ""), 0) + value
    return out


def _router_tries(report: dict[str, Any]) -> str:
    failed = _counter(report, "vllm_router_cb_outcomes_total", outcome="failure")
    retries = sum(_counter(report, "vllm_router_retries_total").values())
    exhausted = sum(_counter(report, "vllm_router_retries_exhausted_total").values())
    opened = sum(_counter(report, "vllm_router_cb_state_transitions_total", to="open").values())
    per = " and ".join(f"{v:.0f}" for v in failed.values())
    tries = f"{sum(failed.values()):.0f}" + (f" ({per} by replica)" if len(failed) > 1 else "")
    return f"{tries} / {retries:.0f} / {exhausted:.0f} / {opened:.0f}"


def _span(values: list[float], digits: int = 0) -> str:
    lo, hi = min(values), max(values)
    return (
        f"{lo:.{digits}f}"
        if round(lo, digits) == round(hi, digits)
        else (f"{lo:.{digits}f}-{hi:.{digits}f}")
    )


def _pods(report: dict[str, Any]) -> str:
    pods = report["pods"]
    # Pods created once the run's clock started (the fleet's own pods start before it).
    new = [p for p in pods if p["created_s"] >= 0 and p["ready_s"] is not None]
    old = [p for p in pods if p["sigterm_s"] is not None]
    ready = _span([p["ready_s"] - p["created_s"] for p in new])
    parts = [f"new pods ready {ready} s after creation"]
    drains = [p["prestop"] for p in old if p.get("prestop")]
    if drains:
        outcomes = sorted({d["body"]["outcome"] for d in drains if d.get("body")})
        seconds = _span([d["seconds"] for d in drains], 1)
        parts.append(f"preStop `/drain` {seconds} s ({', '.join(outcomes)})")
    exits = _span([p["exited_s"] - p["sigterm_s"] for p in old if p["exited_s"] is not None])
    codes = sorted({p["vllm_exit_code"] for p in old})
    killed = sum(bool(p.get("sigkilled")) for p in old)
    parts.append(
        f"old vLLMs exited {', '.join(map(str, codes))} {exits} s after SIGTERM, "
        + ("none SIGKILLed" if not killed else f"{killed} SIGKILLed")
    )
    return "; ".join(parts)


ROUTER_PAIR = (f"{SERVE}/rollout-router-drain.json", f"{SERVE}/rollout-router-nodrain.json")


@TABLES.table("rollout-router-pair", *ROUTER_PAIR)
def rollout_router_pair(root: Path) -> Lines:
    lines = header(
        "run (load average at the end)",
        "sent",
        "succeeded",
        "failed",
        "failures by cause (by pod)",
        "restart window",
        "window TTFT p50 / p95 / p99",
        "window E2E p50 / p95 / p99",
        "router: failed tries / retries / retries exhausted / breakers opened",
        "pods",
        align="lrrrlrrrll",
    )
    for rel, label in zip(
        ROUTER_PAIR, ("with preStop `/drain`", "`--no-drain`, the control"), strict=True
    ):
        r = load(root, rel)
        w = r["restart_window"]
        load_avg = r["provenance"]["machine"]["load_average"][0]
        lines.append(
            row(
                f"{label} ({load_avg:.1f})",
                r["sent"],
                r["succeeded"],
                f"**{r['failed']}**",
                _causes(r),
                f"{w['duration_s']:.0f} s, {w['sent']} requests",
                _pct(w, "ttft_ms"),
                _pct(w, "e2el_ms"),
                _router_tries(r),
                _pods(r),
            )
        )
    return lines


ROUTER_PAIRED = {
    f"{SERVE}/rollout-router-paired.json": "chart defaults: `cache_aware`, 5 tries",
    f"{SERVE}/rollout-router-paired-2.json": "chart defaults again, a second run",
    f"{SERVE}/rollout-router-paired-round-robin.json": "`--router-policy round_robin`, 5 tries",
    f"{SERVE}/rollout-router-paired-noretry.json": (
        "`cache_aware`, no retry (`router.retries.maxRetries=1`)"
    ),
}


@TABLES.table("rollout-router-paired", *ROUTER_PAIRED)
def rollout_router_paired(root: Path) -> Lines:
    lines = header(
        "run (load average at the end)",
        "sent",
        "failed",
        "drained replacement: sent / failed",
        "control (no drain): sent / failed",
        "failures by cause (by pod)",
        "router: failed tries / retries / retries exhausted / breakers opened",
        "window E2E p50 / p95 / p99",
        align="lrrrrllr",
    )
    for rel, label in ROUTER_PAIRED.items():
        r = load(root, rel)
        drained = next(x["window"] for x in r["replacements"] if x["drain"])
        control = next(x["window"] for x in r["replacements"] if not x["drain"])
        load_avg = r["provenance"]["machine"]["load_average"][0]
        lines.append(
            row(
                f"{label} ({load_avg:.1f})",
                r["sent"],
                f"**{r['failed']}**",
                f"{drained['sent']} / {drained['failed']}",
                f"{control['sent']} / **{control['failed']}**",
                _causes(r),
                _router_tries(r),
                _pct(r["restart_window"], "e2el_ms"),
            )
        )
    return lines


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


# ---------------------------------------------------------------- LoRA

LORA_CPU = f"{SERVE}/lora-mix.json"
LORA_H200 = (
    f"{H200}/run15/call3/lora-throughput-1.json",
    f"{H200}/run15/call3/lora-throughput-2.json",
)


@TABLES.table("lora-mix-cpu", LORA_CPU)
def lora_mix_cpu(root: Path) -> Lines:
    data = load(root, LORA_CPU)
    lines = header(
        "rate (all models, req/s)",
        "model",
        "requests sent / failed",
        "TTFT p50 / p99 (ms)",
        "TPOT p99 (ms)",
        "E2E p99 (ms)",
        "output tok/s",
        "SLO attainment",
    )
    base = data["target"]["model"]
    for scenario in data["scenarios"]:
        for p in scenario["points"]:
            name = f"`{p['model']}`" + (" (base)" if p["model"] == base else "")
            lines.append(
                row(
                    f"{p['load']['rate']:g}",
                    name,
                    f"{p['requests']['sent']} / {p['requests']['failed']}",
                    f"{p['ttft_ms']['p50']:.0f} / {p['ttft_ms']['p99']:.0f}",
                    f"{p['tpot_ms']['p99']:.1f}",
                    f"{p['e2el_ms']['p99']:.0f}",
                    f"{p['throughput']['output_tokens_per_s']:.1f}",
                    f"{p['goodput']['attainment']:.2f}",
                )
            )
    return lines


@TABLES.table("lora-h200", *LORA_H200)
def lora_h200(root: Path) -> Lines:
    engines = [load(root, rel)["arms"] for rel in LORA_H200]
    lines = header(
        "adapters in the mix",
        "engine 1: output tok/s median [min–max]",
        "engine 1: ratio to base median [min–max]",
        "engine 2: output tok/s median [min–max]",
        "engine 2: ratio to base median [min–max]",
        align="r",
    )
    for arms in zip(*engines, strict=True):
        cells: list[str] = []
        for arm in arms:
            cells.append(
                f"{num(arm['tok_s_median'], 0)} "
                f"[{num(arm['tok_s_min'], 0)}–{num(arm['tok_s_max'], 0)}]"
            )
            cells.append(
                "1"
                if arm["adapters"] == 0
                else f"{arm['ratio_median']:.2f} [{arm['ratio_min']:.2f}–{arm['ratio_max']:.2f}]"
            )
        label = f"{arms[0]['adapters']}" + (" (base)" if arms[0]["adapters"] == 0 else "")
        lines.append(row(label, *cells))
    return lines


# ---------------------------------------------------------------- overload and soak

OVERLOAD = "docs/results/overload"
OVERLOAD_RUN1 = f"{OVERLOAD}/overload-kubelet-run1.json"
OVERLOAD_ADMISSION = {
    f"{OVERLOAD}/overload-5x-admission64-kubelet-run1.json": "1: clean tree, quiet machine",
    f"{OVERLOAD}/overload-5x-admission64-kubelet-busy.json": "2: dirty tree, shared machine",
}


def _probe(level: dict[str, Any], kind: str, what: str) -> float:
    return float(level["probes"][kind]["latency_ms"][what]) / 1000


@TABLES.table("overload-kubelet", OVERLOAD_RUN1)
def overload_kubelet(root: Path) -> Lines:
    data = load(root, OVERLOAD_RUN1)
    lines = header(
        "load",
        "sent",
        "ok",
        "timed out",
        "other failures",
        "TTFT p50 / p99 s",
        "liveness failures (restarts)",
        "readiness failures (flips)",
        "probe p99 / slowest s (live, ready)",
        "sidecar busy checks",
        align="lrrrrlrrlr",
    )
    for lv in data["levels"]:
        ttft = lv["latency"]["ttft_ms"]
        live, ready = lv["probes"]["liveness"], lv["probes"]["readiness"]
        lines.append(
            row(
                f"{lv['multiple']:g}× ({lv['rate_per_s']:.1f}/s)",
                num(lv["sent"], 0),
                num(lv["succeeded"], 0),
                lv["timed_out"],
                lv["failed_other"],
                f"{ttft['p50'] / 1000:.2f} / {ttft['p99'] / 1000:.2f}",
                f"{live['failures']} ({live['restarts']})",
                f"{ready['failures']} ({ready['flips']})",
                f"{_probe(lv, 'liveness', 'p99'):.3f} / {_probe(lv, 'liveness', 'max'):.3f}, "
                f"{_probe(lv, 'readiness', 'p99'):.2f} / {_probe(lv, 'readiness', 'max'):.2f}",
                f"{lv['sidecar']['upstream_busy_checks']:.0f}",
            )
        )
    return lines


@TABLES.table("overload-admission", *OVERLOAD_ADMISSION)
def overload_admission(root: Path) -> Lines:
    lines = header(
        "run",
        "capacity",
        "load",
        "sent",
        "ok",
        "rejected (503)",
        "other failures",
        "TTFT p50 / p99 s",
        "E2E p99 s",
        "liveness failures",
        "readiness failures (flips)",
        "slowest probe s (live, ready)",
        align="lrlrrrrlrrrl",
    )
    for rel, label in OVERLOAD_ADMISSION.items():
        data = load(root, rel)
        for lv in data["levels"]:
            ttft, e2e = lv["latency"]["ttft_ms"], lv["latency"]["e2el_ms"]
            live, ready = lv["probes"]["liveness"], lv["probes"]["readiness"]
            lines.append(
                row(
                    f"{label} (`{rel.rsplit('/', 1)[-1]}`)",
                    f"{data['capacity']['requests_per_s']:.1f}/s",
                    f"{lv['multiple']:g}× ({lv['rate_per_s']:.1f}/s)",
                    num(lv["sent"], 0),
                    num(lv["succeeded"], 0),
                    num(lv["rejected"], 0),
                    num(lv["failed_other"], 0),
                    f"{ttft['p50'] / 1000:.2f} / {ttft['p99'] / 1000:.1f}",
                    f"{e2e['p99'] / 1000:.1f}",
                    live["failures"],
                    f"{ready['failures']} ({ready['flips']})",
                    f"{_probe(lv, 'liveness', 'max'):.2f}, {_probe(lv, 'readiness', 'max'):.2f}",
                )
            )
    return lines


SOAK = "docs/results/soak/soak.json"


@TABLES.table("soak", SOAK)
def soak(root: Path) -> Lines:
    rss = load(root, SOAK)["rss"]
    lines = header(
        "process",
        "median RSS, first 5 min",
        "median RSS, last 5 min",
        "growth",
        "fitted slope",
        align="lrrrr",
    )
    names = {"sidecar": "sidecar", "vllm": "vLLM (API server, engine core, worker)"}
    for key, label in names.items():
        r = rss[key]
        growth = (
            f"{r['growth_mib']:+.2f} MiB" if key == "sidecar" else f"{r['growth_mib']:+.1f} MiB"
        )
        lines.append(
            row(
                label,
                f"{num(r['first_mib'], 2 if key == 'sidecar' else 1)} MiB",
                f"{num(r['last_mib'], 2 if key == 'sidecar' else 1)} MiB",
                f"**{growth}**" if key == "sidecar" else growth,
                f"{r['slope_mib_per_h']:.2f} MiB/h"
                if key == "sidecar"
                else f"{r['slope_mib_per_h']:.1f} MiB/h",
            )
        )
    return lines


# ---------------------------------------------------------------- rolling restarts behind HAProxy

ROLLOUT = {
    f"{SERVE}/rollout-drain.json": "with preStop `/drain`, busy",
    f"{SERVE}/rollout-nodrain.json": "`--no-drain` (control), busy",
    f"{SERVE}/rollout-drain-quiet.json": "with preStop `/drain`, quiet",
    f"{SERVE}/rollout-nodrain-quiet.json": "`--no-drain`, quiet",
}


def _window(report: dict[str, Any]) -> str:
    w = report["restart_window"]
    return f"{w['duration_s']:.0f} s, {w['sent']} requests"


@TABLES.table("rollout-haproxy", *ROLLOUT)
def rollout_haproxy(root: Path) -> Lines:
    lines = header(
        "run",
        "sent",
        "succeeded",
        "failed",
        "failures by cause (by pod)",
        "restart window",
        "window TTFT p50 / p95 / p99",
        "window E2E p50 / p95 / p99",
        "before the window E2E p50 / p99",
        align="lrrrlrrrr",
    )
    for rel, label in ROLLOUT.items():
        r = load(root, rel)
        before = r["before_window"]["e2el_ms"]
        lines.append(
            row(
                label,
                r["sent"],
                r["succeeded"],
                f"**{r['failed']}**",
                _causes(r),
                _window(r),
                _pct(r["restart_window"], "ttft_ms"),
                _pct(r["restart_window"], "e2el_ms"),
                f"{before['p50'] / 1000:.2f} / {before['p99'] / 1000:.2f} s",
            )
        )
    return lines


ROLLOUT_PODMAN_CI = {
    f"{SERVE}/rollout-podman-drain-ci.json": (
        "with the rendered preStop drain, `surge`, 1 of 2 replaced"
    ),
    f"{SERVE}/rollout-podman-nodrain-ci.json": (
        "control, `--no-drain`, `inPlace`, endpoint lag 6 s, 2 of 2 replaced"
    ),
}
ROLLOUT_PODMAN = {
    f"{SERVE}/rollout-podman-drain.json": "with the rendered preStop drain",
    f"{SERVE}/rollout-podman-nodrain.json": "`--no-drain` (control)",
}


def _load_average(report: dict[str, Any]) -> str:
    """` (load average at the end 8.6)` where the provenance has it."""
    load_avg = report.get("provenance", {}).get("machine", {}).get("load_average")
    return f" (load average at the end {load_avg[0]:.1f})" if load_avg else ""


def _podman_rows(root: Path, runs: dict[str, str], ttft: bool) -> Lines:
    lines = []
    for rel, label in runs.items():
        r = load(root, rel)
        lines.append(
            row(
                label + _load_average(r),
                r["sent"],
                r["succeeded"],
                f"**{r['failed']}**",
                _causes(r),
                _window(r),
                *([_pct(r["restart_window"], "ttft_ms")] if ttft else []),
                _pct(r["restart_window"], "e2el_ms"),
                _pods(r),
            )
        )
    return lines


ROLLOUT_COLUMNS = ("sent", "succeeded", "failed", "failures by cause (by pod)", "restart window")


@TABLES.table("rollout-podman-ci", *ROLLOUT_PODMAN_CI)
def rollout_podman_ci(root: Path) -> Lines:
    lines = header("run", *ROLLOUT_COLUMNS, "window E2E p50 / p95 / p99", "pods", align="lrrrlrrl")
    return lines + _podman_rows(root, ROLLOUT_PODMAN_CI, ttft=False)


@TABLES.table("rollout-podman", *ROLLOUT_PODMAN)
def rollout_podman(root: Path) -> Lines:
    lines = header(
        "run",
        *ROLLOUT_COLUMNS,
        "window TTFT p50 / p95 / p99",
        "window E2E p50 / p95 / p99",
        "pods",
        align="lrrrlrrrl",
    )
    return lines + _podman_rows(root, ROLLOUT_PODMAN, ttft=True)


# ---------------------------------------------------------------- bad releases

BAD_RELEASE = f"{SERVE}/bad-release.json"
BAD_RELEASE_PODMAN = f"{SERVE}/bad-release-podman.json"
BAD_KIND = {
    "missing-model": "`missing-model` (`<model>-missing`)",
    "wrong-tp": "`wrong-tp` (a TP=2 shard set at TP=1)",
    "crash": "`crash` (`--max-model-len 1024`, model max 512)",
}


def _bad_release_rows(report: dict[str, Any]) -> Lines:
    lines = []
    for b in report["bad_releases"]:
        served = " + ".join(str(v) for v in b["old_pods_served"].values())
        running = all(p.get("vllm_running_at_end") for p in report["old_pods"].values())
        lines.append(
            row(
                BAD_KIND.get(b["kind"], f"`{b['kind']}`"),
                f"{num(b['stall']['sent'], 0)} / **{b['stall']['failed']}**",
                f"{b['first_failed_start_s']:.1f} s",
                b["failed_starts"],
                "yes" if b["became_ready"] else "never",
                f"{served} / {len(b['old_pods_lb_changes'])} / {'yes' if running else 'no'}",
                f"{b['rollback']['duration_s']:.1f} s, {b['rollback']['sent']} / "
                f"**{b['rollback']['failed']}**",
            )
        )
    return lines


BAD_COLUMNS = (
    "requests sent / failed during the stall",
    "new pod: first failed start",
)
OLD_PODS = "old pods: requests served / LB state changes / first vLLM still running at the end"
ROLLBACK = "rollback: duration, requests sent / failed"


@TABLES.table("bad-release", BAD_RELEASE)
def bad_release(root: Path) -> Lines:
    report = load(root, BAD_RELEASE)
    deadline = report["bad_releases"][0]["progress_deadline_s"]
    lines = header(
        "bad release",
        *BAD_COLUMNS,
        "failed starts in the deadline",
        f"ready within the {deadline} s deadline",
        OLD_PODS,
        ROLLBACK,
        align="lrrrllr",
    )
    return lines + _bad_release_rows(report)


@TABLES.table("bad-release-podman", BAD_RELEASE_PODMAN)
def bad_release_podman(root: Path) -> Lines:
    report = load(root, BAD_RELEASE_PODMAN)
    lines = header(
        "bad release (podman)",
        *BAD_COLUMNS,
        "failed starts",
        "ready",
        OLD_PODS,
        ROLLBACK,
        align="lrrrllr",
    )
    return lines + _bad_release_rows(report)


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


# ---------------------------------------------------------------- SLO report and loading paths

SLO = f"{SERVE}/slo/report.json"


def _load_label(load: dict[str, float]) -> str:
    if "rate" in load:
        return f"{load['rate']:g} req/s"
    return f"{load['concurrency']:g} in flight"


@TABLES.table("slo-demo", SLO)
def slo_demo(root: Path) -> Lines:
    data = load(root, SLO)
    lines = header(
        "scenario",
        "load",
        "sent / failed",
        "TTFT p50 / p95 / p99 (s)",
        "ITL p50 / p99 (ms)",
        "E2E p50 / p95 / p99 (s)",
        "output tok/s",
        "req/s",
        "SLO met",
        align="llrrrrrrr",
    )
    for s in data["scenarios"]:
        for p in s["points"]:
            t, i, e = p["ttft_ms"], p["itl_ms"], p["e2el_ms"]
            req = p["requests"]
            lines.append(
                row(
                    s["name"],
                    _load_label(p["load"]),
                    f"{req['sent']} / {req['failed']}",
                    " / ".join(f"{t[q] / 1000:.2f}" for q in ("p50", "p95", "p99")),
                    f"{i['p50']:.0f} / {i['p99']:.0f}",
                    " / ".join(f"{e[q] / 1000:.1f}" for q in ("p50", "p95", "p99")),
                    f"{p['throughput']['output_tokens_per_s']:.1f}",
                    f"{p['throughput']['requests_per_s']:.3f}",
                    f"{p['goodput']['good_requests']}/{req['sent']}",
                )
            )
    return lines


BENCH_LOAD_RUN3 = "docs/results/cpu/bench-load-run3.json"
RAW_FLOOR = {"auto": "file read", "sharded_state": "file read"}


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


# ---------------------------------------------------------------- H200: golden, side by side, loaders

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
