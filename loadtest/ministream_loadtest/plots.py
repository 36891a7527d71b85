"""PNG plots of the SLO report and of the rolling-restart timeline (matplotlib, Agg backend)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from .records import RequestRecord
from .rollout_plan import drain_summary

_PCT_STYLE = {"p50": "-o", "p95": "--s", "p99": ":^"}


def _latency_panel(
    ax: Any,
    xs: list[float],
    points: list[dict[str, Any]],
    metric: str,
    title: str,
    slo_ms: float | None,
) -> None:
    for pct, style in _PCT_STYLE.items():
        ax.plot(xs, [p[f"{metric}_ms"][pct] for p in points], style, label=pct)
    if slo_ms is not None:
        ax.axhline(slo_ms, color="red", linewidth=1, label=f"SLO {slo_ms:g} ms")
    ax.set_title(title)
    ax.set_ylabel("ms")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def plot_scenario(scenario: dict[str, Any], out: Path) -> Path:
    """TTFT / ITL / E2E percentiles and throughput + goodput against the swept load."""
    points = scenario["points"]
    mode = scenario["sweep"]["mode"]
    xs = [p["load"][mode] for p in points]
    slo = scenario["slo"]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    _latency_panel(axes[0][0], xs, points, "ttft", "Time to first token", slo.get("ttft_ms"))
    _latency_panel(axes[0][1], xs, points, "itl", "Inter-token latency", None)
    _latency_panel(axes[1][0], xs, points, "e2el", "End-to-end latency", slo.get("e2el_ms"))
    ax = axes[1][1]
    ax.plot(xs, [p["throughput"]["requests_per_s"] for p in points], "-o", label="requests/s")
    if all(p["goodput"]["requests_per_s"] is not None for p in points):
        ax.plot(
            xs,
            [p["goodput"]["requests_per_s"] for p in points],
            "--s",
            label="goodput (good req/s)",
        )
    ax.set_ylabel("requests/s")
    ax.set_title("Throughput and goodput")
    ax.grid(alpha=0.3)
    twin = ax.twinx()
    twin.plot(
        xs,
        [p["throughput"]["output_tokens_per_s"] for p in points],
        ":^",
        color="tab:green",
        label="output tokens/s",
    )
    twin.set_ylabel("output tokens/s")
    lines = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    labels = ax.get_legend_handles_labels()[1] + twin.get_legend_handles_labels()[1]
    ax.legend(lines, labels, fontsize=8, loc="upper left")
    xlabel = "offered load (requests/s)" if mode == "rate" else "concurrent requests"
    for row in axes:
        for a in row:
            a.set_xlabel(xlabel)
    fig.suptitle(
        f"{scenario['name']}: {scenario['input_tokens']} prompt / "
        f"{scenario['output_tokens']} generated tokens ({scenario['api']} API)"
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_rollout(
    report: dict[str, Any], records: Sequence[RequestRecord], t0: float, out: Path
) -> Path:
    """Each request's E2E latency at its send time; failures in red; pod lifecycles as bands."""
    fig, (ax, lanes) = plt.subplots(
        2, 1, figsize=(12, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1.4]}
    )
    ok = [r for r in records if r.ok]
    bad = [r for r in records if not r.ok]
    ax.scatter(
        [r.start - t0 for r in ok],
        [r.latency * 1000 for r in ok],
        s=8,
        label=f"succeeded ({len(ok)})",
    )
    ax.scatter(
        [r.start - t0 for r in ok],
        [r.ttft * 1000 for r in ok],
        s=5,
        marker=".",
        color="tab:gray",
        alpha=0.6,
        label="TTFT of those",
    )
    if bad:
        ax.scatter(
            [r.start - t0 for r in bad],
            [0] * len(bad),
            s=40,
            marker="x",
            color="red",
            label=f"failed ({len(bad)})",
            zorder=3,
        )
    window = report["restart_window"]
    for rep in report["replacements"]:
        control = not rep["drain"]
        ax.axvspan(
            rep["window"]["start_s"],
            rep["window"]["end_s"],
            color="tab:red" if control else "orange",
            alpha=0.12,
            label=f"{rep['old']} → {rep['new']}" + (" (control: no drain)" if control else ""),
        )
    ax.set_ylabel("latency (ms)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    drain = drain_summary(report["restarts"], report["control_restarts"])
    ax.set_title(
        f"Rolling restart of {report['replicas']} replicas behind "
        f"{report.get('front', {}).get('name', 'haproxy')} ({report['rollout_mode']}, "
        f"{drain}): sent {report['sent']}, failed {report['failed']}"
    )

    pods = report["pods"]
    for lane, pod in enumerate(pods):
        created, ready = pod.get("created_s"), pod.get("ready_s")
        term, gone = pod.get("terminating_s"), pod.get("exited_s")
        end = gone if gone is not None else window["end_s"]
        if created is not None and ready is not None:
            lanes.barh(lane, ready - created, left=created, color="tab:gray", alpha=0.5)
        start_ready = ready if ready is not None else 0.0
        stop_ready = term if term is not None else max(end, start_ready)
        lanes.barh(lane, stop_ready - start_ready, left=start_ready, color="tab:green", alpha=0.6)
        if term is not None and gone is not None:
            sigterm = pod.get("sigterm_s", gone)
            lanes.barh(lane, sigterm - term, left=term, color="tab:blue", alpha=0.6)
            lanes.barh(lane, gone - sigterm, left=sigterm, color="tab:red", alpha=0.6)
    lanes.set_yticks(range(len(pods)), [p["name"] for p in pods], fontsize=8)
    lanes.set_xlabel("seconds since the load started")
    lanes.set_title(
        "pods: starting (gray), ready (green), preStop drain (blue), SIGTERM → exit (red)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
