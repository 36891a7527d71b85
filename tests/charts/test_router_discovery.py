"""How the real vllm-router (the installed wheel, the chart's own command line) treats the
serving pods it discovers: the drain in docs/fleet.md relies on it dropping a pod as soon as
the pod is deleted or stops being Ready, while the request it already sent finishes. And the
router's metrics that the Router dashboard and alerts read (ministream_observability's
catalog) are the names it really exports.

No Kubernetes API server runs here, so a stand-in (ministream_testkit.kube_api) serves the one
thing the router asks of it (a LIST and a WATCH of the namespace's pods) and a stand-in replica
answers /health and completions; the router, its discovery, its command line and its
/workers are the real ones. The pod's labels are the rendered serving pod's, the selector the
rendered router's.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from chartkit import CHART, NAMESPACE, render

from ministream_observability import catalog
from ministream_testkit.kube_api import StandInKubeApi, StandInPod
from ministream_testkit.net import free_port
from ministream_testkit.router import RouterProcess
from ministream_testkit.router import routed_workers as workers
from ministream_testkit.waiting import wait_until
from tests.support import tools

ROUTER = CHART / "ci" / "router-values.yaml"

pytestmark = pytest.mark.network

SLOW_PROMPT = "slow"  # the stand-in replica holds this completion until released


POD = "ministream-0"


@dataclass
class Cluster:
    """The stand-in API server with its one pod, and the stand-in replica behind it."""

    api: StandInKubeApi
    release: threading.Event = field(default_factory=threading.Event)
    arrived: threading.Event = field(default_factory=threading.Event)
    failing: threading.Event = field(default_factory=threading.Event)  # the replica answers 500

    def modify(self, ready: bool, deleting: bool = False) -> None:
        self.api.set(POD, ready=ready, deleting=deleting)


def _replica_handler(cluster: Cluster) -> type[BaseHTTPRequestHandler]:
    class Replica(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _json(self, obj: object) -> None:
            body = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _fail(self) -> bool:
            if cluster.failing.is_set():
                self.send_response(500)
                self.send_header("Content-Length", "0")
                self.end_headers()
            return cluster.failing.is_set()

        def do_GET(self) -> None:  # /health, /v1/models
            if self._fail():
                return
            self._json({"object": "list", "data": [{"id": "ministream", "object": "model"}]})

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self._fail():
                return
            if self.path == "/v1/completions" and SLOW_PROMPT.encode() in body:
                cluster.arrived.set()
                cluster.release.wait(timeout=60)
            choice = {"index": 0, "text": " ok", "finish_reason": "stop"}
            self._json({"id": "c", "object": "text_completion", "choices": [choice]})

    return Replica


def _serve(handler: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, int]:
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


@dataclass(frozen=True)
class Routed:
    cluster: Cluster
    url: str  # the router's API
    metrics: str  # its Prometheus exposition
    liveness: str  # the rendered probes' URLs
    readiness: str


@pytest.fixture()
def routed(tmp_path: Path) -> Iterator[Routed]:
    tools.vllm_router()
    out = render(ROUTER)
    (deployment,) = [
        d
        for d in out.of_kind("Deployment")
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == "router"
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    cluster = Cluster(StandInKubeApi(NAMESPACE).start())
    labels = out.pod_template()["metadata"]["labels"]
    cluster.api.apply(StandInPod(POD, labels, "127.0.0.1", ready=True))
    replica, replica_port = _serve(_replica_handler(cluster))
    router = RouterProcess(
        workers=[],
        log_path=tmp_path / "router.log",
        chart_args=container["args"],
        # The chart's 10 s, shortened so a failing replica is marked within seconds.
        extra={"health_check_interval_secs": "1"},
        kube_api=cluster.api,
        discovery_port=replica_port,
    )
    try:
        router.start()
        yield Routed(
            cluster,
            router.url,
            router.metrics_url,
            router.url + container["livenessProbe"]["httpGet"]["path"],
            router.url + container["readinessProbe"]["httpGet"]["path"],
        )
    finally:
        cluster.release.set()
        router.stop()
        cluster.api.stop()
        replica.shutdown()


def complete(url: str, prompt: str = "hello") -> int:
    body = {"model": "ministream", "prompt": prompt, "max_tokens": 1}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=90).status_code


@pytest.mark.parametrize(
    "change",
    [{"ready": False}, {"ready": True, "deleting": True}],
    ids=["not-ready", "terminating"],
)
def test_router_drops_a_pod_that_stops_being_ready_or_is_deleted(
    routed: Routed, change: dict[str, bool]
) -> None:
    cluster, url = routed.cluster, routed.url
    wait_until(lambda: workers(url), 60, what="the router to discover the Ready pod")
    assert complete(url) == 200
    assert httpx.get(routed.readiness, timeout=5).status_code == 200
    # A request in flight when the pod goes: the drain lets it finish.
    results: list[int] = []
    inflight = threading.Thread(target=lambda: results.append(complete(url, SLOW_PROMPT)))
    inflight.start()
    assert cluster.arrived.wait(timeout=60), "the slow request never reached the replica"
    cluster.modify(**change)
    wait_until(lambda: not workers(url), 30, what=f"the router to drop the pod ({change})")
    # Nothing new reaches it; the router has no other replica to offer, and the chart's
    # readiness probe takes the router out of its Service (liveness stays).
    assert complete(url) == 503
    assert httpx.get(routed.readiness, timeout=5).status_code == 503
    assert httpx.get(routed.liveness, timeout=5).status_code == 200
    cluster.release.set()
    inflight.join(timeout=60)
    assert results == [200]


def exported(metrics_url: str) -> dict[str, list[str]]:
    """Metric name -> its sample lines, from the router's exposition."""
    out: dict[str, list[str]] = {}
    for line in httpx.get(metrics_url, timeout=5).text.splitlines():
        if line and not line.startswith("#"):
            out.setdefault(line.split("{")[0].split(" ")[0], []).append(line)
    return out


def test_the_metrics_the_dashboards_and_alerts_read_are_the_routers_own(routed: Routed) -> None:
    cluster, url = routed.cluster, routed.url
    wait_until(lambda: workers(url), 60, what="the router to discover the Ready pod")
    assert complete(url) == 200
    cluster.failing.set()
    # Each try fails (5xx): retries, then the breaker opens (the chart: 10 in a row).
    for _ in range(3):
        assert complete(url) >= 500

    def unhealthy() -> bool:
        return any(
            line.endswith(" 0")
            for line in exported(routed.metrics).get(catalog.ROUTER_WORKER_HEALTH.name, [])
        )

    wait_until(unhealthy, 60, what="the router's health check to mark the replica unhealthy")
    names = set(exported(routed.metrics))
    assert names >= catalog.ROUTER_ONLY, sorted(catalog.ROUTER_ONLY - names)
    samples = exported(routed.metrics)
    (opened,) = [s for s in samples[catalog.ROUTER_CB_TRANSITIONS.name] if 'to="open"' in s]
    assert 'worker="http://127.0.0.1:' in opened
    assert any(s.endswith(" 1") for s in samples[catalog.ROUTER_CB_STATE.name])


def test_the_stand_in_api_replays_changes_since_the_list_to_every_watch() -> None:
    """What the router's discovery relies on of the API server, held by the stand-in: a watch
    opened at the LIST's resource version first gets the changes made in between, and every
    open watch gets every later change (a client may hold more than one)."""
    api = StandInKubeApi(NAMESPACE).start()
    pods = f"{api.url}/api/v1/namespaces/{NAMESPACE}/pods"
    try:
        api.apply(StandInPod("a", {"pool": "prefill"}, "127.0.0.2", ready=True))
        listed = httpx.get(pods, timeout=5).json()
        assert [p["metadata"]["name"] for p in listed["items"]] == ["a"]
        api.set("a", ready=False)  # after the LIST, before the watch
        since = listed["metadata"]["resourceVersion"]
        streams = [
            httpx.stream("GET", f"{pods}?watch=true&resourceVersion={since}", timeout=10)
            for _ in range(2)
        ]
        lines = [s.__enter__().iter_lines() for s in streams]
        api.delete("a")
        for watch in lines:
            unready, marked, deleted = (json.loads(next(watch)) for _ in range(3))
            assert unready["type"] == "MODIFIED"
            assert unready["object"]["status"]["conditions"][0]["status"] == "False"
            # A graceful deletion: the deletion timestamp first, then the pod is gone.
            assert (
                marked["type"] == "MODIFIED" and "deletionTimestamp" in marked["object"]["metadata"]
            )
            assert deleted["type"] == "DELETED" and deleted["object"]["metadata"]["name"] == "a"
        for s in streams:
            s.__exit__(None, None, None)
    finally:
        api.stop()
