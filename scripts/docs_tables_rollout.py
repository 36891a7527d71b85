"""The rolling restarts' and bad releases' tables (docs/benchmarks.md): behind vLLM's router,
behind HAProxy, under podman."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from docs_tables import (
    Lines,
    Registry,
    header,
    load,
    num,
    row,
)

TABLES = Registry()

SERVE = "docs/results/serve"


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


ROLLOUT_COLUMNS = ("sent", "succeeded", "failed", "failures by cause (by pod)", "restart window")
TTFT_COLUMN = "window TTFT p50 / p95 / p99"
E2E_COLUMN = "window E2E p50 / p95 / p99"


def _window(report: dict[str, Any]) -> str:
    w = report["restart_window"]
    return f"{w['duration_s']:.0f} s, {w['sent']} requests"


def _outcome(report: dict[str, Any], ttft: bool = True) -> list[Any]:
    """The cells of ROLLOUT_COLUMNS, then the window's TTFT (if `ttft`) and E2E latencies."""
    window = report["restart_window"]
    return [
        report["sent"],
        report["succeeded"],
        f"**{report['failed']}**",
        _causes(report),
        _window(report),
        *([_pct(window, "ttft_ms")] if ttft else []),
        _pct(window, "e2el_ms"),
    ]


ROUTER_PAIR = (f"{SERVE}/rollout-router-drain.json", f"{SERVE}/rollout-router-nodrain.json")


@TABLES.table("rollout-router-pair", *ROUTER_PAIR)
def rollout_router_pair(root: Path) -> Lines:
    lines = header(
        "run (load average at the end)",
        *ROLLOUT_COLUMNS,
        TTFT_COLUMN,
        E2E_COLUMN,
        "router: failed tries / retries / retries exhausted / breakers opened",
        "pods",
        align="lrrrlrrrll",
    )
    for rel, label in zip(
        ROUTER_PAIR, ("with preStop `/drain`", "`--no-drain`, the control"), strict=True
    ):
        r = load(root, rel)
        load_avg = r["provenance"]["machine"]["load_average"][0]
        lines.append(row(f"{label} ({load_avg:.1f})", *_outcome(r), _router_tries(r), _pods(r)))
    return lines


ROUTER_PAIRED = {
    f"{SERVE}/rollout-router-paired.json": "chart defaults: `cache_aware`, 5 tries",
    f"{SERVE}/rollout-router-paired-2.json": "chart defaults again, a second run",
    f"{SERVE}/rollout-router-paired-round-robin.json": "`--router-policy round_robin`, 5 tries",
    f"{SERVE}/rollout-router-paired-noretry.json": (
        "`cache_aware`, no retry (`router.retries.maxRetries=1`)"
    ),
}


PAIRED_COLUMNS = (
    "sent",
    "failed",
    "drained replacement: sent / failed",
    "control (no drain): sent / failed",
    "failures by cause (by pod)",
    "router: failed tries / retries / retries exhausted / breakers opened",
)


def _paired_table(
    root: Path, runs: dict[str, str], extra: dict[str, Callable[[dict[str, Any]], str]]
) -> Lines:
    """Runs whose replacements include drained ones and the paired control: PAIRED_COLUMNS,
    the `extra` columns (header: the cell of a report), then the window's E2E latencies."""
    lines = header(
        "run (load average at the end)",
        *PAIRED_COLUMNS,
        *extra,
        E2E_COLUMN,
        align="lrrrrll" + "r" * (len(extra) + 1),
    )
    for rel, label in runs.items():
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
                *(cell(r) for cell in extra.values()),
                _pct(r["restart_window"], "e2el_ms"),
            )
        )
    return lines


@TABLES.table("rollout-router-paired", *ROUTER_PAIRED)
def rollout_router_paired(root: Path) -> Lines:
    return _paired_table(root, ROUTER_PAIRED, {})


ROUTER_PD = {f"{SERVE}/rollout-pd-prefill.json": "prefill pool rolled"}


def _nixl(report: dict[str, Any]) -> str:
    nixl = report["pd"]["nixl"]
    return f"{nixl['transfers']} / {nixl['failed']}"


def _read_late(report: dict[str, Any]) -> str:
    nixl = report["pd"]["nixl"]
    return f"{nixl['expired']} / {nixl['read_late']}"


@TABLES.table("rollout-router-pd", *ROUTER_PD)
def rollout_router_pd(root: Path) -> Lines:
    return _paired_table(
        root,
        ROUTER_PD,
        {
            "NIXL transfers / failed (decode pods)": _nixl,
            "KV expired / notices after it (prefill pods)": _read_late,
        },
    )


# ---------------------------------------------------------------- rolling restarts behind HAProxy

ROLLOUT = {
    f"{SERVE}/rollout-drain.json": "with preStop `/drain`, busy",
    f"{SERVE}/rollout-nodrain.json": "`--no-drain` (control), busy",
    f"{SERVE}/rollout-drain-quiet.json": "with preStop `/drain`, quiet",
    f"{SERVE}/rollout-nodrain-quiet.json": "`--no-drain`, quiet",
}


@TABLES.table("rollout-haproxy", *ROLLOUT)
def rollout_haproxy(root: Path) -> Lines:
    lines = header(
        "run",
        *ROLLOUT_COLUMNS,
        TTFT_COLUMN,
        E2E_COLUMN,
        "before the window E2E p50 / p99",
        align="lrrrlrrrr",
    )
    for rel, label in ROLLOUT.items():
        r = load(root, rel)
        before = r["before_window"]["e2el_ms"]
        before_cell = f"{before['p50'] / 1000:.2f} / {before['p99'] / 1000:.2f} s"
        lines.append(row(label, *_outcome(r), before_cell))
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
        lines.append(row(label + _load_average(r), *_outcome(r, ttft), _pods(r)))
    return lines


@TABLES.table("rollout-podman-ci", *ROLLOUT_PODMAN_CI)
def rollout_podman_ci(root: Path) -> Lines:
    lines = header("run", *ROLLOUT_COLUMNS, E2E_COLUMN, "pods", align="lrrrlrrl")
    return lines + _podman_rows(root, ROLLOUT_PODMAN_CI, ttft=False)


@TABLES.table("rollout-podman", *ROLLOUT_PODMAN)
def rollout_podman(root: Path) -> Lines:
    lines = header(
        "run",
        *ROLLOUT_COLUMNS,
        TTFT_COLUMN,
        E2E_COLUMN,
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


# ---------------------------------------------------------------- the rollout soak

SOAK_SMOKE = f"{SERVE}/rollout-soak-smoke.json"
SOAK = f"{SERVE}/rollout-soak.json"


def _soak_rows(soak: dict[str, Any]) -> Lines:
    lines = header(
        "front",
        "mode",
        "rollouts (completed)",
        "sent",
        "failed",
        "failures by cause",
        align="llrrrl",
    )
    for r in soak["summary"]:
        causes = ", ".join(f"`{k}`: {v}" for k, v in r["failures_by_cause"].items()) or "—"
        lines.append(
            row(
                r["front"],
                "preStop `/drain`" if r["mode"] == "drain" else "`--no-drain` (control)",
                f"{r['rollouts']} ({r['rollouts_completed']})",
                num(r["sent"], 0),
                f"**{r['failed']}**",
                causes,
            )
        )
    return lines


@TABLES.table("rollout-soak-smoke", SOAK_SMOKE)
def rollout_soak_smoke(root: Path) -> Lines:
    return _soak_rows(load(root, SOAK_SMOKE))


@TABLES.table("rollout-soak", SOAK)
def rollout_soak(root: Path) -> Lines:
    return _soak_rows(load(root, SOAK))
