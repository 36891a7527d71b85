"""The rollout's router front without an engine: the real `vllm-router` binary with the chart's
rendered arguments in front of two stand-in HTTP workers (no vLLM: what is tested is which
workers the router is given and when, not what they serve), the chart's readiness probe as
the kubelet's, and `--front`'s checks on the command line. Also the report's failure tracing
by time, the rule used when the front keeps no access log."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from ministream_loadtest.chart_pod import chart_pod
from ministream_loadtest.fronts import front_chart_values, open_front
from ministream_loadtest.haproxy import Slot, StateWatcher
from ministream_loadtest.pd_pools import PD_POOLS, pd_chart_values
from ministream_loadtest.router_front import (
    RouterFront,
    counter_deltas,
    discovery_changes,
    router_counters,
    slot_state,
)
from ministream_testkit import router as router_kit
from ministream_testkit.helm import helm_path
from ministream_testkit.net import free_port
from ministream_testkit.waiting import wait_until
from tests.support import tools

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "ministream"


def test_discovery_adds_the_ready_and_removes_the_rest() -> None:
    assert discovery_changes([0, 2], [1, 2]) == ([0], [1])
    assert discovery_changes([], [0, 1]) == ([], [0, 1])
    assert discovery_changes([1], [1]) == ([], [])


def test_slot_states_read_like_haproxys() -> None:
    assert slot_state(routed=True, endpoint=True, terminating=False) == "UP"
    assert slot_state(routed=False, endpoint=True, terminating=True) == "DRAIN"
    assert slot_state(routed=False, endpoint=True, terminating=False) == "DOWN"
    assert slot_state(routed=False, endpoint=False, terminating=False) == "MAINT"


def test_counter_deltas_count_new_series_from_zero() -> None:
    before = {"a_total": 2.0, 'b_total{w="1"}': 5.0}
    after = {"a_total": 2.0, 'b_total{w="1"}': 7.0, 'b_total{w="2"}': 1.0}
    assert counter_deltas(before, after) == {'b_total{w="1"}': 2.0, 'b_total{w="2"}': 1.0}


def test_the_router_front_renders_the_router_and_what_it_adds_to_vllm() -> None:
    """With the router front the serving pods run the vLLM arguments the chart renders for a
    router (what `chart_router_engine_args` finds), and the router its rendered command."""
    with_router = chart_pod(CHART, sets=front_chart_values("router"), helm=helm_path())
    without = chart_pod(CHART, helm=helm_path())
    added = [a for a in with_router.vllm_args if a not in without.vllm_args]
    assert added == router_kit.chart_router_engine_args() and added
    assert without.router_args == () and "--service-discovery" in with_router.router_args


class _Worker:
    """A stand-in replica: /readyz (its sidecar's) answers 200 or 503 as told, /health 200,
    a completion answers the worker's name."""

    def __init__(self, name: str, host: str = "127.0.0.1", port: int = 0) -> None:
        self.name, self.ready, self.served = name, True, 0
        worker = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                ok = worker.ready or self.path != "/readyz"
                self._answer(200 if ok else 503, {})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                worker.served += 1
                self._answer(200, {"worker": worker.name})

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(params=["worker-api", "kube-api"])
def routed(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[RouterFront, StateWatcher, list[_Worker]]]:
    tools.vllm_router()
    # The chart's readiness probe, one second apart so the test sees flips soon; round robin
    # (cache_aware sends one repeated prompt to one worker) as `--router-policy` sets it.
    chart = chart_pod(
        CHART,
        sets={**front_chart_values("router", "round_robin"), "probes.readiness.periodSeconds": 1},
        helm=helm_path(),
    )
    # The API and the sidecar's /readyz on one port here.
    if request.param == "worker-api":
        workers = [_Worker("a"), _Worker("b")]
        slots = [Slot(i, w.port, w.port) for i, w in enumerate(workers)]
    else:  # the router's own discovery: one port, an address per pod
        port = free_port()
        workers = [_Worker(n, f"127.0.0.{2 + i}", port) for i, n in enumerate("ab")]
        slots = [Slot(i, port, port, f"127.0.0.{2 + i}") for i in range(2)]
    front = open_front("router", tmp_path, slots, {0, 1}, chart, discovery=request.param)
    assert isinstance(front, RouterFront)
    watcher = StateWatcher(front, interval=0.1).start()
    try:
        yield front, watcher, workers
    finally:
        watcher.stop()
        front.stop()
        for w in workers:
            w.server.shutdown()


def _gone(front: RouterFront, slot: Slot) -> None:
    """The slot's worker is no longer routed: at once when the front calls the router's
    worker API, within seconds when the router's own watch has to deliver the change."""
    url = front.worker_url(slot)
    if front.kube is None:
        assert url not in router_kit.routed_workers(front.url)
    else:
        wait_until(lambda: url not in router_kit.routed_workers(front.url), 15, what=f"{url} gone")


def _complete(url: str, n: int) -> list[str]:
    body = {"model": "m", "prompt": "hi", "max_tokens": 1}
    return [
        httpx.post(f"{url}/v1/completions", json=body, timeout=30).json()["worker"]
        for _ in range(n)
    ]


def test_the_router_is_given_ready_pods_and_loses_unready_and_terminating_ones(
    routed: tuple[RouterFront, StateWatcher, list[_Worker]],
) -> None:
    front, watcher, (a, b) = routed
    slot_a, slot_b = front.slots
    args = front.router.command()
    assert "--retry-max-retries" in args  # the chart's own arguments
    if front.kube is None:  # discovery swapped for the worker API
        assert "--service-discovery" not in args and "--worker-urls" in args
    else:  # the chart's discovery, its port the pods' shared one
        assert "--service-discovery" in args and "--worker-urls" not in args
        assert args[args.index("--service-discovery-port") + 1] == str(slot_a.api_port)
    assert args[args.index("--policy") + 1] == "round_robin"  # router.policy
    assert watcher.wait_for(lambda s: s == {"slot0": "UP", "slot1": "UP"}, 30)
    assert set(_complete(front.url, 8)) == {"a", "b"}

    # Not Ready after failureThreshold failed probes: removed; Ready again: added back.
    b.ready = False
    assert watcher.wait_for(lambda s: s["slot1"] == "DOWN", 30)
    assert set(_complete(front.url, 4)) == {"a"}
    b.ready = True
    assert watcher.wait_for(lambda s: s["slot1"] == "UP", 30)

    # A new pod in a slot that is still routed: out of the router at once (with the router's
    # own discovery: once its watch delivers the deletion), and kept out until its probe
    # passes (held failing here, so nothing can add it back in between).
    b.ready = False
    front.add_endpoint(slot_b)
    _gone(front, slot_b)
    wait_until(
        lambda: len(front._endpoints[1].probes.logs["readiness"].results) >= 2,
        30,
        what="two failed probes of the new pod in slot1",
    )
    assert front.worker_url(slot_b) not in router_kit.routed_workers(front.url)
    b.ready = True
    assert watcher.wait_for(lambda s: s["slot1"] == "UP", 30)

    # Terminating: removed when the orchestrator says so, though its probe still passes, and
    # not added back.
    front.remove_endpoint(slot_a)
    _gone(front, slot_a)
    served_a = a.served
    assert set(_complete(front.url, 4)) == {"b"}
    probes_b = len(front._endpoints[1].probes.logs["readiness"].results)
    wait_until(
        lambda: len(front._endpoints[1].probes.logs["readiness"].results) >= probes_b + 2,
        30,
        what="two more probes of slot1",
    )
    assert watcher.current["slot0"] == "DRAIN" and a.served == served_a

    events = [(s, e) for _, s, e in front.discovery_events]
    assert events.count(("slot1", "removed: not ready")) == 2, events  # unready, then a new pod
    assert ("slot0", "removed: terminating") in events, events
    front.stop()
    counted = front.describe(0.0)["router_counters"]
    per_worker = {
        k: v for k, v in counted.items() if k.startswith("vllm_router_processed_requests_total")
    }
    assert sum(per_worker.values()) == 16, counted


def test_router_counters_read_the_real_exposition(
    routed: tuple[RouterFront, StateWatcher, list[_Worker]],
) -> None:
    front, watcher, _ = routed
    assert watcher.wait_for(lambda s: s == {"slot0": "UP", "slot1": "UP"}, 30)
    before = router_counters(httpx.get(front.router.metrics_url, timeout=10).text)
    _complete(front.url, 3)
    after = router_counters(httpx.get(front.router.metrics_url, timeout=10).text)
    gained = counter_deltas(before, after)
    assert gained['vllm_router_requests_total{route="/v1/completions"}'] == 3


def _loadtest(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ministream_loadtest", *args],
        capture_output=True,
        text=True,
        env=env,
    )


ROLLOUT = ("rollout", "--replicas", "2", "--output", "x.json", "--model", "m")


def test_front_options_are_checked() -> None:
    run = _loadtest(*ROLLOUT, "--front", "nginx")
    assert run.returncode == 2 and "--front" in run.stderr and "router" in run.stderr
    run = _loadtest(*ROLLOUT, "--router-policy", "round_robin")
    assert run.returncode != 0 and "--router-policy needs --front router" in run.stderr
    run = _loadtest(*ROLLOUT, "--front", "router", "--runtime", "podman")
    assert run.returncode != 0 and "--runtime process" in run.stderr
    run = _loadtest(*ROLLOUT, "--pd-pool", "prefill")
    assert run.returncode != 0 and "--pd-pool needs --front router" in run.stderr
    run = _loadtest(*ROLLOUT, "--front", "router", "--pd-pool", "both")
    assert run.returncode == 2 and "prefill" in run.stderr and "decode" in run.stderr


def test_a_missing_router_is_named_with_its_install_step(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ministream_loadtest import cli

    monkeypatch.setattr(router_kit, "VLLM_ROUTER", tmp_path / "vllm-router")
    monkeypatch.setattr(cli.signal, "signal", lambda *_: None)  # keep pytest's SIGTERM
    code = cli.main([*ROLLOUT, "--front", "router"])
    assert code == 2 and router_kit.INSTALL_HINT in capsys.readouterr().err


def test_the_routers_own_discovery_pairs_the_pools_by_their_rendered_labels(
    tmp_path: Path,
) -> None:
    """P/D (`--pd-pool`): the chart's router in P/D mode finds a prefill and a decode pod in
    the stand-in API by the pools' rendered selectors, each pod published with its own
    pool's labels (`slot_labels`), and lists each as its pool's worker."""
    tools.vllm_router()
    sets = {
        **front_chart_values("router", "round_robin"),
        **pd_chart_values("decode", 1),
        "probes.readiness.periodSeconds": 1,
    }
    pools = {p: chart_pod(CHART, sets=sets, helm=helm_path(), pool=p) for p in PD_POOLS}
    port = free_port()
    workers = [_Worker(p, f"127.0.0.{2 + i}", port) for i, p in enumerate(pools)]
    slots = [Slot(i, port, port, f"127.0.0.{2 + i}") for i in range(2)]
    front = open_front(
        "router",
        tmp_path,
        slots,
        {0, 1},
        pools["decode"],
        discovery="kube-api",
        slot_labels={0: pools["prefill"].pod_labels},
    )
    watcher = StateWatcher(front, interval=0.1).start()
    try:
        assert watcher.wait_for(lambda s: s == {"slot0": "UP", "slot1": "UP"}, 30)
        listed = httpx.get(f"{front.url}/workers", timeout=10).json()["workers"]
        kinds = {w["url"]: w["worker_type"] for w in listed}
        assert kinds == {
            f"http://127.0.0.2:{port}": "prefill",
            f"http://127.0.0.3:{port}": "decode",
        }
    finally:
        watcher.stop()
        front.stop()
        for w in workers:
            w.server.shutdown()
