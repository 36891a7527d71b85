"""Plot the dashboards from a live Prometheus with their own queries (a screenshot stand-in
for the docs: no Grafana runs here, the queries are the ones Grafana would send)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import httpx

from .alerts import AlertParams
from .catalog import CLUSTER_ONLY
from .dashboards import all_dashboards
from .grafana import Dashboard, Panel
from .promql import concrete, metric_names

COLUMNS = 3


def _query_range(
    client: httpx.Client, expr: str, start: float, end: float, step: float
) -> list[dict[str, Any]]:
    r = client.get(
        "/api/v1/query_range", params={"query": expr, "start": start, "end": end, "step": step}
    )
    r.raise_for_status()
    body = r.json()
    if body.get("status") != "success":
        raise RuntimeError(f"query failed: {expr}: {body}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _legend(template: str, labels: dict[str, str]) -> str:
    out = template
    for key, value in labels.items():
        out = out.replace(f"{{{{{key}}}}}", value)
    return out if "{{" not in out else out.split("{{")[0].strip() or "series"


def _format_axis(ax: Any, unit: str) -> None:
    from matplotlib.ticker import FuncFormatter, PercentFormatter

    if unit == "percentunit":
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    elif unit == "s":
        ax.yaxis.set_major_formatter(
            FuncFormatter(lambda v, _: f"{v * 1000:.0f} ms" if 0 < abs(v) < 1 else f"{v:g} s")
        )


def _plot_panel(
    ax: Any,
    client: httpx.Client,
    panel: Panel,
    start: float,
    end: float,
    step: float,
    rate_interval: str,
) -> None:
    ax.set_title(panel.title, fontsize=9)
    ax.tick_params(labelsize=7)
    cluster_only = any(metric_names(concrete(t.expr)) & CLUSTER_ONLY for t in panel.targets)
    ax.set_xlabel("seconds", fontsize=7)
    if panel.kind == "table":
        rows = []
        for target in panel.targets:
            for series in _query_range(
                client, concrete(target.expr, rate_interval=rate_interval), end, end, step
            ):
                labels = series["metric"]
                rows.append(", ".join(f"{k}={v}" for k, v in sorted(labels.items())))
        ax.axis("off")
        ax.text(
            0.0,
            0.9,
            "\n".join(rows) or "no data",
            fontsize=7,
            va="top",
            wrap=True,
            transform=ax.transAxes,
        )
        return
    plotted = 0
    for target in panel.targets:
        expr = concrete(target.expr, rate_interval=rate_interval)
        for series in _query_range(client, expr, start, end, step):
            xs = [float(t) - start for t, _ in series["values"]]
            ys = [float(v) for _, v in series["values"]]
            ys = [y if math.isfinite(y) else math.nan for y in ys]
            ax.plot(xs, ys, linewidth=1, label=_legend(target.legend, series["metric"]))
            plotted += 1
    if panel.threshold is not None:
        ax.axhline(panel.threshold, color="red", linestyle="--", linewidth=0.8)
    if cluster_only:
        note = "no cluster here: kube-state-metrics" + (" series absent" if plotted else "")
        ax.text(
            0.5,
            0.5 if not plotted else 0.06,
            note,
            ha="center",
            va="center",
            fontsize=7,
            color="gray",
            transform=ax.transAxes,
        )
    elif not plotted:
        ax.text(
            0.5,
            0.5,
            "no data",
            ha="center",
            va="center",
            fontsize=8,
            color="gray",
            transform=ax.transAxes,
        )
    if 0 < plotted <= 6:
        ax.legend(fontsize=6, loc="upper left")
    ax.set_xlim(0, end - start)
    if panel.min is not None:
        ax.set_ylim(bottom=panel.min)
    if panel.max is not None:
        ax.set_ylim(top=panel.max * 1.05)
    _format_axis(ax, panel.unit)
    ax.grid(alpha=0.3)


def render_dashboard(
    prometheus: str,
    dashboard: Dashboard,
    out: Path,
    *,
    start: float,
    end: float,
    rate_interval: str = "15s",
    dpi: int = 60,
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = dashboard.panels()
    rows = math.ceil(len(panels) / COLUMNS)
    fig, axes = plt.subplots(rows, COLUMNS, figsize=(5 * COLUMNS, 3 * rows), squeeze=False)
    step = max(1.0, (end - start) / 200)
    with httpx.Client(base_url=prometheus, timeout=30) as client:
        for ax, panel in zip(axes.flat, panels, strict=False):
            _plot_panel(ax, client, panel, start, end, step, rate_interval)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(
        f"{dashboard.title} — plotted from Prometheus with the dashboard's queries", fontsize=11
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out


def render_dashboards(
    prometheus: str,
    out_dir: Path,
    params: AlertParams,
    *,
    minutes: float = 10.0,
    end: float | None = None,
    rate_interval: str = "15s",
    only: tuple[str, ...] | None = None,
) -> list[Path]:
    """The dashboards as PNG images (`only`: those uids; default all)."""
    end = time.time() if end is None else end
    start = end - minutes * 60
    return [
        render_dashboard(
            prometheus,
            d,
            out_dir / f"{d.uid}.png",
            start=start,
            end=end,
            rate_interval=rate_interval,
        )
        for d in all_dashboards(params)
        if only is None or d.uid in only
    ]
