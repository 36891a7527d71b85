"""The serving experiments' tables (docs/benchmarks.md): routing by cache, P/D
disaggregation, LoRA, overload, soak, the SLO report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from docs_tables import (
    Lines,
    Registry,
    fig,
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


# ---------------------------------------------------------------- P/D disaggregation

PD_CPU = f"{SERVE}/pd-cpu.json"
# `scripts/gpu/h200.sh pd` on an H100 (the script wrote it as pd-h200.json; calls.txt there).
PD_H100 = "docs/results/h100/run1/pd-h100.json"


def _bench_pd(root: Path, raw: str) -> Lines:
    """bench_pd.py's own table and verdicts, from its result file."""
    lines: Lines = script("bench_pd").table(load(root, raw)).split("\n")
    return lines


@TABLES.table("pd-cpu", PD_CPU)
def pd_cpu(root: Path) -> Lines:
    return _bench_pd(root, PD_CPU)


@TABLES.table("pd-h100", PD_H100)
def pd_h100(root: Path) -> Lines:
    return _bench_pd(root, PD_H100)


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
