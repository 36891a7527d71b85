"""Helpers of the observability tests: promtool, a real Prometheus server, the name checks.

Prometheus and promtool come from Debian's `prometheus` package. Missing binaries fail the
tests instead of skipping them: CI runs scripts/install_prometheus.sh first, so absence is a
broken set-up, not a reason to go green.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from ministream_observability.catalog import CLUSTER_ONLY
from ministream_observability.generate import Query
from ministream_observability.promql import metric_names
from ministream_testkit.local_server import LocalServer
from ministream_testkit.net import answers
from ministream_testkit.processes import stop_group
from ministream_testkit.waiting import wait_until
from tests.support import tools

ROOT = Path(__file__).resolve().parents[2]
# Labels the live scrape config attaches, as a ServiceMonitor would in a cluster.
NAMESPACE = "ministream-test"
POD = "ms-ministream-6d5f8b7c9-x7k2p"  # <deployment>-<replicaset hash>-<pod hash>
INSTALL_HINT = "run scripts/install_prometheus.sh (Debian's prometheus: prometheus, promtool)"


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        tools.missing_tool(f"{name} not found on PATH: {INSTALL_HINT}")
    return path


def promtool(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary("promtool"), *map(str, args)], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def recording_rules_file(queries: Iterable[Query], path: Path) -> Path:
    """Every query as a recording rule, so `promtool check rules` parses it."""
    rules = [
        {"record": f"ministream_check:query_{i}", "expr": q.promql} for i, q in enumerate(queries)
    ]
    path.write_text(yaml.safe_dump({"groups": [{"name": "queries", "rules": rules}]}))
    return path


def missing_metrics(queries: Iterable[Query], present: set[str]) -> dict[str, list[str]]:
    """Metric names the queries use that `present` lacks (cluster-only names exempt),
    each with the queries that use it."""
    missing: dict[str, list[str]] = {}
    for q in queries:
        for name in sorted(metric_names(q.promql) - present - CLUSTER_ONLY):
            missing.setdefault(name, []).append(q.origin)
    return missing


@dataclass(frozen=True)
class ScrapeTarget:
    job: str
    address: str  # host:port
    labels: dict[str, str]


@dataclass
class PrometheusServer(LocalServer):
    """A real Prometheus on 127.0.0.1, a free port and its own data dir, scraping every 2 s.

    Not every 1 s: a scrape must answer within its interval, and the busy engine's API
    server, sharing two cores with the engine and the test, missed 1-s deadlines in loaded
    CI runs; a failed scrape marks the series stale, and the autoscaling query then read
    no data for minutes."""

    workdir: Path
    targets: Sequence[ScrapeTarget]
    rule_files: Sequence[Path] = ()
    interval: str = "2s"

    @property
    def log_path(self) -> Path:
        return self.workdir / "prometheus.log"

    def config(self) -> dict[str, Any]:
        return {
            "global": {
                "scrape_interval": self.interval,
                "scrape_timeout": self.interval,
                "evaluation_interval": self.interval,
            },
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [
                {
                    "job_name": t.job,
                    "static_configs": [{"targets": [t.address], "labels": t.labels}],
                }
                for t in self.targets
            ],
        }

    def start(self, timeout: float = 60) -> PrometheusServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(self.config()))
        check = promtool("check", "config", config)
        assert check.returncode == 0, check.stdout + check.stderr
        command = [
            binary("prometheus"),
            f"--config.file={config}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=1d",
        ]
        self.launch(command, self.log_path, own_group=True)

        def ready() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited:\n{self.log_tail()}")
            return answers(f"{self.url}/-/ready")

        wait_until(ready, timeout, 0.2, what="prometheus ready", detail=self.log_tail)
        return self

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        stop_group(self.process)

    def api(self, path: str, **params: Any) -> Any:
        r = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=30)
        body = r.json()
        if r.status_code != 200 or body.get("status") != "success":
            raise PromQLError(f"{path} {params}: {r.status_code} {body}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = at
        data = self.api("query", **params)
        result: list[dict[str, Any]] = data["result"]
        return result

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """`expr` evaluated at every `step` seconds from `start` to `end` (a matrix)."""
        data = self.api("query_range", query=expr, start=start, end=end, step=step)
        result: list[dict[str, Any]] = data["result"]
        return result

    def names(self) -> set[str]:
        """Every metric name Prometheus has stored (what the scrapes really exported)."""
        return set(self.api("label/__name__/values"))

    def wait_for(self, expr: str, timeout: float = 60, what: str = "") -> list[dict[str, Any]]:
        """Until `expr` returns data (its result, a non-empty vector)."""
        return wait_until(
            lambda: self.query(expr), timeout, 0.5, what=f"{what or expr} (query: {expr})"
        )

    def wait_evaluated(self, after: float, timeout: float = 30) -> None:
        """Until every rule group has been evaluated after `after` (epoch seconds)."""

        def evaluated() -> bool:
            groups = self.api("rules")["groups"]
            return bool(groups) and all(
                datetime.fromisoformat(g["lastEvaluation"]).timestamp() >= after for g in groups
            )

        wait_until(evaluated, timeout, 0.5, what=f"every rule group evaluated after {after}")


class PromQLError(Exception):
    pass


@dataclass(frozen=True)
class LiveStack:
    prom: PrometheusServer
    started: float  # epoch seconds: Prometheus up, before any traffic
    finished: float  # epoch seconds: load and drains done, scraped
