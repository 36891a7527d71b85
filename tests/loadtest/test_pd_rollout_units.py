"""The rollout's prefill/decode mode (`rollout --front router --pd-pool ...`) without an
engine: each pool's pod as the chart renders it, where each pool's pods run, the local pod's
NIXL environment on its own loopback address, each pool's NIXL counts and the warm-up
through the router. (`--pd-pool`'s command-line checks and the router's pairing of the pools
are in test_router_front.py, the report's `pool` per pod in test_loadtest_units.py.)"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from ministream_loadtest.chart_pod import ChartPod, chart_pod
from ministream_loadtest.fleet import Pod, PodTemplate, ProcessFleet, loopback_address
from ministream_loadtest.fronts import front_chart_values
from ministream_loadtest.pd_pools import (
    FIXED_POOL_REPLICAS,
    NIXL_EXPIRED,
    NIXL_FAILED,
    NIXL_READ_LATE,
    NIXL_TRANSFERS,
    PD_POOLS,
    REQUEST_SUCCESS,
    NixlSampler,
    PDPool,
    nixl_counts,
    nixl_report,
    other_pool,
    paired_count,
    pd_chart_values,
    pool_slots,
    running_pd_pods,
    warm_up,
)
from ministream_observability import catalog
from ministream_testkit.helm import helm_path
from ministream_testkit.pd import POOL_LABEL

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "ministream"


def _pools(rolled: PDPool = "decode", replicas: int = 2) -> dict[PDPool, ChartPod]:
    sets = {**front_chart_values("router"), **pd_chart_values(rolled, replicas)}
    return {pool: chart_pod(CHART, sets=sets, helm=helm_path(), pool=pool) for pool in PD_POOLS}


def _selector(args: tuple[str, ...], flag: str) -> dict[str, str]:
    """The label pairs after `flag` in the router's arguments, up to the next flag."""
    pairs = []
    for arg in args[args.index(flag) + 1 :]:
        if arg.startswith("--"):
            break
        pairs.append(arg)
    return dict(p.split("=", 1) for p in pairs)


def test_each_pool_is_its_rendered_deployment_and_the_routers_selector_finds_it() -> None:
    pools = _pools()
    for pool, pod in pools.items():
        assert pod.pool == pool and pod.pod_labels[POOL_LABEL] == pool
        assert "--kv-transfer-config" in pod.vllm_args  # the connector, as rendered
        assert {"UCX_TLS", "UCX_TCP_PORT_RANGE"} <= set(pod.vllm_env)
        # NIXL's side-channel host is the pod's IP: the cluster's, not a literal.
        assert "VLLM_NIXL_SIDE_CHANNEL_HOST" in pod.pod_ip_env
        assert "VLLM_NIXL_SIDE_CHANNEL_HOST" not in pod.vllm_env
    router = pools["decode"].router_args
    assert "--vllm-pd-disaggregation" in router and router == pools["prefill"].router_args
    for pool, pod in pools.items():
        own = _selector(router, f"--{pool}-selector")
        other = _selector(router, f"--{other_pool(pool)}-selector")
        assert own.items() <= pod.pod_labels.items()
        assert not other.items() <= pod.pod_labels.items()


def test_a_render_without_disaggregation_has_no_pool_and_no_nixl() -> None:
    pod = chart_pod(CHART, sets=front_chart_values("router"), helm=helm_path())
    assert pod.pool is None and pod.vllm_env == {} and pod.pod_ip_env == ()


def test_the_fixed_pool_comes_first_then_the_rolled_pools_slots() -> None:
    slots = pool_slots("prefill", 3)
    assert slots.fixed == tuple(range(FIXED_POOL_REPLICAS))
    assert slots.rolling == tuple(range(FIXED_POOL_REPLICAS, FIXED_POOL_REPLICAS + 3))
    assert slots.count == FIXED_POOL_REPLICAS + 3
    assert other_pool("prefill") == "decode" and other_pool("decode") == "prefill"
    with pytest.raises(ValueError, match="at least one slot"):
        pool_slots("decode", 0)
    values = pd_chart_values("decode", 2)
    assert values["disaggregation.enabled"] is True
    assert values["disaggregation.decode.replicas"] == 2
    assert values["disaggregation.prefill.replicas"] == FIXED_POOL_REPLICAS


def test_loopback_slots_share_one_api_port_and_keep_the_sidecar_on_localhost() -> None:
    slots = ProcessFleet(loopback=True).slots(3)
    assert len({s.api_port for s in slots}) == 1
    assert (
        [s.host for s in slots]
        == [loopback_address(i) for i in range(3)]
        == [
            "127.0.0.2",
            "127.0.0.3",
            "127.0.0.4",
        ]
    )
    assert all(s.sidecar_url == f"http://127.0.0.1:{s.sidecar_port}" for s in slots)
    assert len({s.sidecar_port for s in slots}) == 3
    plain = ProcessFleet().slots(1)[0]
    assert plain.host == "127.0.0.1" and plain.sidecar_url.startswith("http://127.0.0.1:")


def test_a_local_pd_pod_runs_its_pools_nixl_environment_on_its_own_address(
    tmp_path: Path,
) -> None:
    pods = _pools()
    slot = ProcessFleet(loopback=True).slots(2)[1]
    template = PodTemplate("model", "served", (), pods["prefill"], tmp_path)
    pod = Pod("prefill-v1-0", slot, template)
    env = pod.chart_env()
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == slot.host == "127.0.0.3"
    assert {k: env[k] for k in pods["prefill"].vllm_env} == pods["prefill"].vllm_env
    command = pod.vllm_command()
    assert command[command.index("--host") + 1] == slot.host
    assert "--kv-transfer-config" in command


METRICS = f"""# TYPE vllm:nixl_xfer_time_seconds histogram
{NIXL_TRANSFERS}{{engine="0",model_name="m"}} 7.0
vllm:nixl_xfer_time_seconds_sum{{engine="0",model_name="m"}} 0.3
# TYPE vllm:nixl_num_failed_transfers counter
{NIXL_FAILED}{{engine="0",model_name="m"}} 2.0
# TYPE vllm:nixl_num_kv_expired_reqs counter
{NIXL_EXPIRED}{{engine="0",model_name="m"}} 4.0
# TYPE vllm:nixl_num_notifications_after_expiry counter
{NIXL_READ_LATE}{{engine="0",model_name="m"}} 3.0
# TYPE vllm:request_success counter
vllm:request_success_total{{engine="0",finished_reason="length",model_name="m"}} 5.0
vllm:request_success_total{{engine="0",finished_reason="stop",model_name="m"}} 1.0
"""


def test_the_metric_names_are_the_catalogs() -> None:
    assert catalog.NIXL_XFER_TIME.name + "_count" == NIXL_TRANSFERS
    assert catalog.NIXL_FAILED.name == NIXL_FAILED
    assert catalog.NIXL_KV_EXPIRED.name == NIXL_EXPIRED
    assert catalog.NIXL_LATE_READ.name == NIXL_READ_LATE
    assert catalog.REQUEST_SUCCESS.name == REQUEST_SUCCESS


def test_nixl_counts_and_what_each_pod_gained() -> None:
    assert nixl_counts(METRICS, "decode") == {"transfers": 7.0, "failed": 2.0}
    assert nixl_counts(METRICS, "prefill") == {"expired": 4.0, "read_late": 3.0}
    assert paired_count("decode", METRICS) == 7.0  # KV pulls
    assert paired_count("prefill", METRICS) == 6.0  # finished requests
    assert paired_count("decode", None) == 0.0
    report = nixl_report(
        {
            "decode-v1-0": {"transfers": 3.0, "failed": 1.0},
            "prefill-v1-0": {"expired": 1.0, "read_late": 0.0},
        },
        {
            "decode-v1-0": {"transfers": 10.0, "failed": 1.0},
            "decode-v2-0": {"transfers": 4.0, "failed": 2.0},  # new: counted from 0
            "prefill-v1-0": {"expired": 3.0, "read_late": 2.0},
        },
        {"decode-v1-0": "decode", "decode-v2-0": "decode", "prefill-v1-0": "prefill"},
    )
    assert report["per_decode_pod"] == {
        "decode-v1-0": {"transfers": 7, "failed": 0},
        "decode-v2-0": {"transfers": 4, "failed": 2},
    }
    assert report["per_prefill_pod"] == {"prefill-v1-0": {"expired": 2, "read_late": 2}}
    assert (report["transfers"], report["failed"]) == (11, 2)
    assert (report["expired"], report["read_late"]) == (2, 2)


@contextlib.contextmanager
def _served(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """A local HTTP server of `handler` on a free port, for the block: its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


@dataclass
class _FakePod:
    name: str
    api_url: str
    pool: str | None
    exited: bool = False


@pytest.fixture
def decode_metrics() -> Iterator[tuple[str, list[int]]]:
    """One address's /metrics, its NIXL transfer count set by the test (`count[0]`)."""
    count = [0]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = f'{NIXL_TRANSFERS}{{engine="0"}} {count[0]}.0\n{NIXL_FAILED} 0.0\n'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: Any) -> None:
            pass

    with _served(Handler) as url:
        yield url, count


def test_a_replacement_on_the_same_address_is_not_counted_as_the_pod_it_replaced(
    decode_metrics: tuple[str, list[int]],
) -> None:
    """inPlace: the new pod takes the old one's slot, so its address; the old pod keeps the
    reading it had when it exited, and the new one counts from its own start."""
    url, count = decode_metrics
    old, new = _FakePod("decode-v1-0", url, "decode"), _FakePod("decode-v2-0", url, "decode")
    pods: list[_FakePod] = [_FakePod("prefill-v1-0", "http://127.0.0.1:9", "prefill"), old]
    sampler = NixlSampler(lambda: running_pd_pods(pods))
    count[0] = 5
    sampler.baseline()
    count[0] = 12
    sampler.sample()
    old.exited = True
    pods.append(new)
    count[0] = 3  # the replacement's own counter
    report = sampler.stop()
    assert report["per_decode_pod"] == {
        "decode-v1-0": {"transfers": 7, "failed": 0},
        "decode-v2-0": {"transfers": 3, "failed": 0},
    }
    assert report["per_prefill_pod"] == {}  # never answered: no reading to count
    assert running_pd_pods(pods) == [
        ("prefill-v1-0", "http://127.0.0.1:9", "prefill"),
        ("decode-v2-0", url, "decode"),
    ]


@pytest.fixture
def flaky_router() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A stand-in router: the first completion fails (a NIXL handshake missed), the rest
    answer; the bodies it got are kept."""
    bodies: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            code = 500 if len(bodies) == 1 else 200
            self.send_response(code)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    with _served(Handler) as url:
        yield url, bodies


def test_the_warm_up_asks_again_until_every_pod_served(
    flaky_router: tuple[str, list[dict[str, Any]]],
) -> None:
    url, bodies = flaky_router
    result = warm_up(url, "m", 160, lambda: len(bodies) >= 3, attempts=5)
    assert (result["sent"], result["failed"]) == (3, 1) and "HTTP 500" in result["failures"][0]
    prompts = [b["prompt"] for b in bodies]
    assert all(len(p) == 160 for p in prompts) and len({tuple(p) for p in prompts}) == 3
    with pytest.raises(RuntimeError, match="not warm after 2 requests"):
        warm_up(url, "m", 16, lambda: False, attempts=2)
