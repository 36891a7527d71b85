"""A small model of a Grafana dashboard (schemaVersion 39, Grafana 10/11) and its JSON.

Only what our dashboards need: query variables, rows, time-series / stat / table panels
with Prometheus targets, laid out left to right on Grafana's 24-column grid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRID_WIDTH = 24


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str = ""
    instant: bool = False  # tables and stats read one value, not a range

    def to_json(self, ref_id: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "refId": ref_id,
            "datasource": DATASOURCE,
            "expr": self.expr,
            "legendFormat": self.legend or "__auto",
            "range": not self.instant,
            "instant": self.instant,
        }
        if self.instant:
            out["format"] = "table"
        return out


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    targets: tuple[Target, ...]
    unit: str = "short"
    kind: str = "timeseries"  # timeseries | stat | table
    width: int = 8
    height: int = 8
    min: float | None = 0
    max: float | None = None
    threshold: float | None = None  # drawn as a red line (an SLO or an alert threshold)
    stack: bool = False

    def to_json(self, panel_id: int, x: int, y: int) -> dict[str, Any]:
        defaults: dict[str, Any] = {"unit": self.unit}
        if self.min is not None:
            defaults["min"] = self.min
        if self.max is not None:
            defaults["max"] = self.max
        steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
        if self.threshold is not None:
            steps.append({"color": "red", "value": self.threshold})
        defaults["thresholds"] = {"mode": "absolute", "steps": steps}
        options: dict[str, Any] = {}
        if self.kind == "timeseries":
            defaults["custom"] = {
                "drawStyle": "line",
                "lineWidth": 1,
                "fillOpacity": 10,
                "showPoints": "never",
                "spanNulls": False,
                "stacking": {"mode": "normal" if self.stack else "none", "group": "A"},
                "thresholdsStyle": {"mode": "line" if self.threshold is not None else "off"},
            }
            options = {
                "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                "tooltip": {"mode": "multi", "sort": "desc"},
            }
        elif self.kind == "stat":
            options = {
                "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                "colorMode": "value",
                "graphMode": "none",
                "textMode": "auto",
            }
        elif self.kind == "table":
            options = {"showHeader": True}
        panel: dict[str, Any] = {
            "id": panel_id,
            "type": self.kind,
            "title": self.title,
            "description": self.description,
            "datasource": DATASOURCE,
            "gridPos": {"h": self.height, "w": self.width, "x": x, "y": y},
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": options,
            "targets": [t.to_json(chr(ord("A") + i)) for i, t in enumerate(self.targets)],
        }
        if self.kind == "table":
            # Drop the instant query's Time and Value columns: the labels are the content.
            panel["transformations"] = [
                {"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True}}}
            ]
        return panel


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Variable:
    """A multi-value query variable; "All" sends `.*` so queries use `label=~"$name"`."""

    name: str
    label: str
    query: str  # label_values(selector, label)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "label": self.label,
            "type": "query",
            "datasource": DATASOURCE,
            "definition": self.query,
            "query": {"query": self.query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
            "refresh": 2,  # on time-range change: pods come and go with every rollout
            "multi": True,
            "includeAll": True,
            "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "sort": 1,
            "hide": 0,
            "options": [],
        }


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    variables: tuple[Variable, ...]
    rows: tuple[Row, ...]
    tags: tuple[str, ...] = ("ministream", "vllm")
    links: tuple[dict[str, Any], ...] = field(default_factory=tuple)

    def panels(self) -> list[Panel]:
        return [p for row in self.rows for p in row.panels]

    def to_json(self) -> dict[str, Any]:
        panels: list[dict[str, Any]] = []
        next_id = 1
        y = 0
        for row in self.rows:
            panels.append(
                {
                    "id": next_id,
                    "type": "row",
                    "title": row.title,
                    "collapsed": False,
                    "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y},
                    "panels": [],
                }
            )
            next_id += 1
            y += 1
            x = 0
            line_height = 0
            for panel in row.panels:
                if x + panel.width > GRID_WIDTH:
                    x, y = 0, y + line_height
                    line_height = 0
                panels.append(panel.to_json(next_id, x, y))
                next_id += 1
                x += panel.width
                line_height = max(line_height, panel.height)
            y += line_height
        datasource_var = {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "hide": 0,
            "refresh": 1,
            "options": [],
        }
        return {
            "uid": self.uid,
            "title": self.title,
            "description": self.description,
            "tags": list(self.tags),
            "editable": True,
            "graphTooltip": 1,  # shared crosshair: line latency up with queueing and KV usage
            "schemaVersion": 39,
            "version": 1,
            "timezone": "browser",
            "time": {"from": "now-1h", "to": "now"},
            "refresh": "30s",
            "links": list(self.links),
            "annotations": {"list": []},
            "templating": {"list": [datasource_var, *(v.to_json() for v in self.variables)]},
            "panels": panels,
        }
