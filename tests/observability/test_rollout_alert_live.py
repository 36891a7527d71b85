"""MiniStreamRolloutStalled in a real Prometheus, with the generated rules loaded: a stalled
rollout fires it, for both workload kinds; a rollout under way and a finished one do not; a
rollback resolves it.

The series are kube-state-metrics' own (names, labels, one series per condition status), served
by a small exposition endpoint: kube-state-metrics itself needs a Kubernetes API server, which
cannot run here. Everything else (scrapes, staleness, rule evaluation, `ALERTS`) is
Prometheus's. The LeaderWorkerSet rule's stall budget is a generator parameter, set short here;
the Deployment rule has none (the Deployment's own progress deadline is the wait).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from promkit import PrometheusServer, ScrapeTarget

from ministream_observability.alerts import AlertParams
from ministream_observability.generate import render_rules
from ministream_testkit.net import free_port
from ministream_testkit.waiting import wait_until

BUDGET = "20s"
FIRING = 'ALERTS{alertname="MiniStreamRolloutStalled", alertstate="firing"}'


def condition(deployment: str, progressing: str) -> list[str]:
    """kube-state-metrics' Progressing condition of a Deployment: one series per status."""
    return [
        f'kube_deployment_status_condition{{namespace="prod", deployment="{deployment}", '
        f'condition="Progressing", status="{s}"}} {int(s == progressing)}'
        for s in ("true", "false", "unknown")
    ]


def leader_set(name: str, current: str, update: str, replicas: int, updated: int) -> list[str]:
    """kube-state-metrics' rollout series of a (LeaderWorkerSet's leader) StatefulSet."""
    sel = f'namespace="prod", statefulset="{name}"'
    return [
        f'kube_statefulset_status_current_revision{{{sel}, revision="{current}"}} 1',
        f'kube_statefulset_status_update_revision{{{sel}, revision="{update}"}} 1',
        f"kube_statefulset_replicas{{{sel}}} {replicas}",
        f"kube_statefulset_status_replicas_updated{{{sel}}} {updated}",
    ]


class KubeStateMetrics:
    """The exposition endpoint: what the cluster's objects say at each scrape."""

    def __init__(self) -> None:
        self.rolled_back = False
        self.scrapes = 0

    def text(self) -> str:
        self.scrapes += 1
        lines = [
            *condition("ms-stalled", "true" if self.rolled_back else "false"),
            *condition("ms-rolling", "true"),  # ReplicaSetUpdated: under way, in time
            *condition("ms-done", "true"),  # NewReplicaSetAvailable
            # One group of two updated, then nothing: stalled.
            *leader_set("lws-stalled", "r1", "r2", 2, 1),
            # A slow rollout of many groups: one more updated at every other scrape.
            *leader_set("lws-rolling", "r1", "r2", 1000, self.scrapes // 2),
            *leader_set("lws-done", "r2", "r2", 2, 2),
        ]
        return "\n".join(lines) + "\n"


@pytest.fixture
def ksm() -> Iterator[tuple[KubeStateMetrics, str]]:
    state = KubeStateMetrics()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = state.text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def firing(prom: PrometheusServer) -> set[tuple[str, str]]:
    return {
        (a["metric"]["kind"], a["metric"].get("deployment") or a["metric"]["statefulset"])
        for a in prom.query(FIRING)
    }


def test_stalled_rollouts_fire_healthy_and_finished_ones_do_not(
    ksm: tuple[KubeStateMetrics, str], tmp_path: Path
) -> None:
    state, address = ksm
    rules = tmp_path / "rules.yaml"
    rules.write_text(render_rules(AlertParams(rollout_stall_budget=BUDGET)))
    prom = PrometheusServer(
        tmp_path / "prom", [ScrapeTarget("kube-state-metrics", address, {})], [rules]
    )
    prom.start()
    try:
        stalled = {("Deployment", "ms-stalled"), ("LeaderWorkerSet", "lws-stalled")}
        wait_until(lambda: firing(prom) >= stalled, 120, 0.5, what=f"{stalled} firing")
        # The LeaderWorkerSet alert needed the whole budget; by now the healthy ones had the
        # same evaluations: none of them fires.
        assert firing(prom) == stalled
        rolling = prom.query(
            'changes(kube_statefulset_status_replicas_updated{statefulset="lws-rolling"}'
            f"[{BUDGET}])"
        )
        assert float(rolling[0]["value"][1]) > 0  # the rolling one did roll meanwhile
        # `helm rollback`: the Deployment is Progressing again, and its alert resolves.
        state.rolled_back = True
        wait_until(
            lambda: firing(prom) == {("LeaderWorkerSet", "lws-stalled")},
            120,
            0.5,
            what="the rolled-back Deployment's alert resolved",
        )
    finally:
        prom.stop()
