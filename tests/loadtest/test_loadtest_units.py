"""ministream_loadtest without a vLLM engine: scenarios, the chart's rendered pod, the engine's
flags (parsed by vLLM's own `vllm bench serve` parser), records and failure causes, and the
real HAProxy following readiness in front of toy backends."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from ministream_loadtest.chart_pod import ChartError, ChartPod, chart_pod
from ministream_loadtest.engine import engine_args
from ministream_loadtest.fleet import cpu_binding, tensor_parallel_size
from ministream_loadtest.haproxy import (
    AccessLogEntry,
    HAProxy,
    Slot,
    StateWatcher,
    find_haproxy,
    render_config,
)
from ministream_loadtest.records import RequestRecord, classify_error, latency_summary, load_records
from ministream_loadtest.rollout_plan import (
    Replacement,
    drain_summary,
    max_load_seconds,
    pod_at,
    replacement_plan,
)
from ministream_loadtest.rollout_report import PodSnapshot, RolloutFacts, build_report
from ministream_loadtest.scenarios import load_scenario, resolve_scenario, shipped_scenarios
from ministream_loadtest.slo import point_report
from ministream_sidecar.engine_client import LOAD_TRACKING_FLAG
from ministream_testkit.helm import helm_path

# The demo model is served with --max-model-len 2048 (Makefile `serve`, `bench-serve`).
DEMO_MAX_MODEL_LEN = 2048


# --- scenarios ------------------------------------------------------------------------------
def test_the_four_scenarios_ship_and_fit_the_demo_model() -> None:
    names = {p.stem: load_scenario(p) for p in shipped_scenarios()}
    assert {"short-chat", "long-prompt", "long-generation", "mixed"} <= set(names)
    for name, sc in names.items():
        assert sc.name == name
        assert sc.max_tokens_per_request <= DEMO_MAX_MODEL_LEN - 64, name  # chat template room
        assert sc.slo.as_dict(), f"{name} has no SLO"
    assert {sc.sweep.mode for sc in names.values()} == {"rate", "concurrency"}
    assert resolve_scenario("mixed") == Path(names["mixed"].path)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"bogus": 1}, "unknown keys"),
        ({"sweep": {"mode": "rps", "values": [1]}}, "sweep.mode"),
        ({"sweep": {"mode": "concurrency", "values": [1.5]}}, "whole numbers"),
        ({"range_ratio": 1.0}, "range_ratio"),
        ({"slo": {"ttft": 5}}, "slo keys"),
        ({"api": "embeddings"}, "api"),
    ],
)
def test_bad_scenarios_are_refused(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    data = yaml.safe_load(resolve_scenario("short-chat").read_text()) | change
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=message):
        load_scenario(path)


def test_engine_flags_parse_with_vllms_own_parser(tmp_path: Path) -> None:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    sc = load_scenario(resolve_scenario("mixed"))
    spec = sc.load_spec(1.0, base_url="http://127.0.0.1:9", model="m", tokenizer="/tok")
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(engine_args(spec, tmp_path / "r.json"))
    assert (args.backend, args.endpoint) == ("openai", "/v1/completions")
    assert args.dataset_name == "random" and args.request_rate == 1.0
    assert json.loads(args.random_range_ratio) == {"input": 0.9, "output": 0.9}
    assert args.save_detailed and args.result_filename == "r.json"
    assert args.metric_percentiles == "50,95,99"
    assert set(args.percentile_metrics.split(",")) == {"ttft", "tpot", "itl", "e2el"}
    assert sorted(args.goodput) == ["e2el:60000", "tpot:200", "ttft:2000"]
    chat = load_scenario(resolve_scenario("long-prompt")).load_spec(
        2, base_url="u", model="m", tokenizer="t"
    )
    args = parser.parse_args(engine_args(chat, tmp_path / "c.json"))
    assert args.max_concurrency == 2 and args.request_rate == float("inf")


# --- the chart's rendered pod -----------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "ministream"


def rendered_pod(**sets: Any) -> ChartPod:
    sets = {k.replace("__", "."): v for k, v in sets.items()}
    return chart_pod(CHART, sets=sets, helm=helm_path())


def test_local_pods_pass_the_rendered_vllm_arguments_but_not_the_wiring() -> None:
    base = rendered_pod()
    flags = list(base.vllm_args)
    assert flags[flags.index("--shutdown-timeout") + 1] == str(base.vllm_shutdown_timeout_seconds)
    assert LOAD_TRACKING_FLAG in flags  # what the pods' drain counts with
    pod = rendered_pod(
        vllm__maxQueuedRequests=40, vllm__maxModelLen=256, vllm__extraArgs=["--seed=3"]
    )
    args = list(pod.vllm_args)
    assert args[args.index("--max-num-queued-reqs") + 1] == "40"
    assert args[args.index("--max-model-len") + 1] == "256"
    assert "--seed=3" in args
    assert not {"--model", "--port", "--host", "--tensor-parallel-size"} & set(args)


def test_the_experiment_takes_its_pod_from_helm_template() -> None:
    """Values reach the experiment only through the chart's templates: change two timeouts
    and the rollout mode, and the hook, the grace period and the strategy follow."""
    base = rendered_pod()
    pod = rendered_pod(
        sidecar__drainTimeoutSeconds=90,
        vllm__shutdownTimeoutSeconds=40,
        rollout__mode="inPlace",
        probes__readiness__periodSeconds=1,
    )
    assert pod.drain_timeout_seconds == 90 and pod.vllm_shutdown_timeout_seconds == 40
    hook = list(pod.prestop_command)
    assert hook[hook.index("--timeout") + 1] == "90"
    # The grace period grows with the two timeouts (the chart's arithmetic, not ours).
    assert pod.termination_grace_period_seconds - base.termination_grace_period_seconds == (
        (90 - base.drain_timeout_seconds) + (40 - base.vllm_shutdown_timeout_seconds)
    )
    assert (base.rollout_mode, base.max_surge, base.max_unavailable) == ("surge", 1, 0)
    assert (pod.rollout_mode, pod.max_surge, pod.max_unavailable) == ("inPlace", 0, 1)
    assert pod.readiness_probe.period_seconds == 1 and pod.readiness_probe.success_threshold == 1
    # Timing settings pass to the sidecar; each local pod wires host, port and URL itself.
    assert pod.setting("drain_timeout_seconds") == "90"
    assert "MINISTREAM_SIDECAR_WARMUP_REQUESTS" in pod.sidecar_settings
    assert not {"MINISTREAM_SIDECAR_PORT", "MINISTREAM_SIDECAR_VLLM_URL"} & set(
        pod.sidecar_settings
    )


def test_a_grace_period_the_chart_refuses_is_refused() -> None:
    with pytest.raises(ChartError, match="terminationGracePeriodSeconds=10 is too short"):
        rendered_pod(terminationGracePeriodSeconds=10)


def test_a_missing_chart_says_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(ChartError, match="pass --chart PATH"):
        chart_pod(tmp_path)


def test_the_load_cap_outlasts_any_rollout_within_its_timeouts() -> None:
    t = rendered_pod()
    one = max_load_seconds(t, 1, startup_timeout=600, lead_in=10, tail=10)
    two = max_load_seconds(t, 2, startup_timeout=600, lead_in=10, tail=10)
    assert two - one == one - 20 >= 600 + t.termination_grace_period_seconds


PODS = [
    PodSnapshot("v1-0", "s0", {"created": 0.0, "exited": 50.0, "endpoint_removed": 54.0}),
    PodSnapshot("v1-1", "s1", {"created": 0.0, "ready": 20.0}),
    PodSnapshot("v2-0", "s0", {"created": 55.0}),
]


def test_a_failure_belongs_to_the_pod_whose_endpoint_it_was_sent_to() -> None:
    """Without a drain a pod can exit while its endpoint is still in HAProxy: requests sent
    there then fail as that pod's (a 503), until the slot's next pod is created."""
    assert pod_at(PODS, "s0", 10.0) == "v1-0"
    assert pod_at(PODS, "s0", 52.0) == "v1-0"  # exited, endpoint not yet removed
    assert pod_at(PODS, "s0", 56.0) == "v2-0"
    assert pod_at(PODS, "s1", 56.0) == "v1-1"
    assert pod_at(PODS, "s0", -1.0) is None and pod_at(PODS, "s9", 10.0) is None


@pytest.mark.parametrize(
    ("restarts", "controls", "control_lag", "plan"),
    [
        (2, 0, None, [(True, 2.0), (True, 2.0)]),
        (2, 1, 6.0, [(True, 2.0), (False, 6.0)]),
        (3, 2, None, [(True, 2.0), (False, 2.0), (False, 2.0)]),
        (1, 1, math.inf, [(False, math.inf)]),
    ],
)
def test_a_paired_control_is_the_last_replacements(
    restarts: int, controls: int, control_lag: float | None, plan: list[tuple[bool, float]]
) -> None:
    assert replacement_plan(restarts, controls, 2.0, control_lag) == plan
    assert drain_summary(restarts, controls).startswith(
        "with preStop" if controls == 0 else "WITHOUT" if controls == restarts else "1 with"
    )


def _record(i: int, start: float, ok: bool = True) -> RequestRecord:
    return RequestRecord(
        index=i,
        request_id=f"rollout-{i}",
        start=start,
        success=ok,
        error="" if ok else "Server disconnected",
        ttft=0.1 if ok else 0.0,
        itl=(0.01,) if ok else (),
        latency=0.5,
        input_len=8,
        output_len=4 if ok else 0,
        expected_output_len=4,
    )


def test_without_an_access_log_failures_are_traced_by_time() -> None:
    """Behind the router: a failure is put on the pods that were shutting down while it ran."""
    pods = [
        PodSnapshot("v1-0", "slot0", {"created": 0.0, "terminating": 50.0, "exited": 60.0}),
        PodSnapshot("v1-1", "slot1", {"created": 0.0}, pool="decode"),  # P/D: its pool
    ]
    records = [
        _record(0, 30.0, ok=False),  # before any shutdown
        _record(1, 49.8, ok=False),  # in flight when v1-0's shutdown began
        _record(2, 55.0),
    ]
    report = build_report(
        RolloutFacts(
            records=records,
            access=None,
            pods=pods,
            replacements=[Replacement("v1-0", "v2-0", False, 2.0, 50.0)],
            t0=0.0,
            t_start=50.0,
            t_end=70.0,
            lb_changes=[],
            engine_result={"completed": 1, "failed": 2, "duration": 80.0},
            load={},
            settings={},
            cold_start_s=1.0,
            front={"name": "router"},
        )
    )
    assert report["failures_by_pod"] == {"none": 1, "v1-0": 1}
    assert report["failures"][1]["pods_shutting_down"] == ["v1-0"]
    assert report["access_log_check"] is None and report["front"] == {"name": "router"}
    assert report["pods"][1]["pool"] == "decode" and "pool" not in report["pods"][0]


def test_the_report_traces_failures_to_pods_and_splits_the_window_per_replacement() -> None:
    """build_report on hand-made facts: a drained replacement (v1-0 -> v2-0) and a control
    (v1-1 -> v2-1); the control's request sent while its endpoint lingered fails as v1-1's."""
    pods = [
        PodSnapshot("v1-0", "s0", {"created": 100.0, "ready": 120.0, "exited": 150.0}),
        PodSnapshot("v1-1", "s1", {"created": 100.0, "ready": 121.0, "exited": 181.0}),
        PodSnapshot("v2-0", "s2", {"created": 130.0, "ready": 140.0}),
        PodSnapshot("v2-1", "s0", {"created": 160.0, "ready": 175.0}),
    ]
    records = [
        _record(0, 125.0),  # before the rollout
        _record(1, 135.0),  # during the drained replacement
        _record(2, 170.0),  # during the control
        _record(3, 182.0, ok=False),  # the control's old endpoint, after its exit
        _record(4, 195.0),  # after the rollout
    ]
    access = {
        r.request_id: AccessLogEntry(r.request_id, server, status, 500, "----")
        for r, server, status in zip(
            records, ["s0", "s2", "s1", "s1", "s2"], [200, 200, 200, 503, 200], strict=True
        )
    }
    facts = RolloutFacts(
        records=records,
        access=access,
        pods=pods,
        replacements=[
            Replacement("v1-0", "v2-0", True, 2.0, 130.0),
            Replacement("v1-1", "v2-1", False, 6.0, 160.0),
        ],
        t0=120.0,
        t_start=130.0,
        t_end=185.0,
        lb_changes=[(110.0, "s0", "", "UP"), (150.5, "s0", "UP", "MAINT")],
        engine_result={"completed": 4, "failed": 1, "duration": 80.0},
        load={"request_rate": 2.0},
        settings={"control_restarts": 1, "restarts": 2},
        cold_start_s=20.4,
    )
    report = build_report(facts)
    assert (report["sent"], report["succeeded"], report["failed"]) == (5, 4, 1)
    assert report["failures_by_pod"] == {"v1-1": 1}
    assert report["failures"][0]["pod"] == "v1-1" and report["failures"][0]["sent_s"] == 62.0
    drained, control = report["replacements"]
    assert (drained["window"]["sent"], drained["window"]["failed"]) == (1, 0)
    assert (control["window"]["sent"], control["window"]["failed"]) == (2, 1)
    assert control["endpoint_lag_s"] == 6.0 and not control["drain"]
    assert report["before_window"]["sent"] == 1 and report["after_window"]["sent"] == 1
    assert report["restart_window"]["duration_s"] == 55.0
    assert report["load_covered_rollout"] and report["load"]["engine_failed"] == 1
    assert [e["t_s"] for e in report["lb_events"]] == [30.5]  # before t0: not reported
    assert report["pods"][2]["cold_start_s"] == 10.0 and report["pods"][3]["created_s"] == 40.0
    assert report["access_log_check"]["matched"] == 5


def test_each_pod_gets_cores_of_its_own() -> None:
    assert [cpu_binding(i, 1, [0, 1]) for i in range(3)] == ["0", "1", "nobind"]
    assert [cpu_binding(i, 2, [0, 1, 2, 3]) for i in range(3)] == ["0|1", "2|3", "nobind"]
    assert cpu_binding(1, 1, [4, 6]) == "6"  # the CPUs this process may use, not 0..n-1
    with pytest.raises(ValueError, match="no CPUs"):
        cpu_binding(0, 1, [])


@pytest.mark.parametrize(
    ("args", "tp"),
    [
        ([], 1),
        (["--tensor-parallel-size", "2"], 2),
        (["--tensor-parallel-size=4"], 4),
        (["--dtype", "float32", "-tp", "2"], 2),
        (["-tp=2"], 2),
    ],
)
def test_tensor_parallel_size_from_vllm_args(args: list[str], tp: int) -> None:
    assert tensor_parallel_size(args) == tp


# --- records --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "error, cause",
    [
        ("Internal Server Error", "http_500"),
        ("Service Unavailable", "http_503"),
        ("", "http_error_without_reason"),
        (
            "Traceback (most recent call last):\n  ...\n"
            "aiohttp.client_exceptions.ClientConnectorError: Cannot connect to host 127.0.0.1:1",
            "connection_refused",
        ),
        (
            "Traceback (most recent call last):\naiohttp.client_exceptions.ClientPayloadError: "
            "Response payload is not completed",
            "stream_interrupted",
        ),
        ("Traceback (most recent call last):\nValueError: boom", "value_error"),
        ("Never received a valid chunk to calculate TTFT.", "no_tokens"),
    ],
)
def test_failure_causes(error: str, cause: str) -> None:
    assert classify_error(error) == cause


def engine_like_result() -> dict[str, Any]:
    """Shaped like `vllm bench serve --save-detailed` output: 3 good requests, 1 failure."""
    return {
        "duration": 4.0,
        "completed": 3,
        "failed": 1,
        "total_input_tokens": 30,
        "total_output_tokens": 11,
        "request_throughput": 0.75,
        "request_goodput": 0.5,
        "output_throughput": 2.75,
        "total_token_throughput": 10.25,
        "start_times": [10.0, 10.5, 11.0, 11.5],
        "ttfts": [0.1, 0.2, 0.0, 0.3],
        "itls": [[0.05] * 3, [0.06] * 3, [], [0.07]],
        "latencies": [0.25, 0.38, 0.0, 0.37],
        "input_lens": [10, 10, 10, 10],
        "output_lens": [4, 4, 0, 2],
        "errors": ["", "", "Internal Server Error", ""],
        **{
            f"{k}_{m}_ms": 1.0
            for m in ("ttft", "tpot", "itl", "e2el")
            for k in ("mean", "p50", "p95", "p99")
        },
    }


def test_records_follow_the_engine_and_catch_truncation() -> None:
    result = engine_like_result()
    records = load_records(result, request_id_prefix="x-", expected_output_len=4)
    assert [r.request_id for r in records] == ["x-0", "x-1", "x-2", "x-3"]
    assert [r.cause for r in records] == [None, None, "http_500", "truncated_stream"]
    summary = latency_summary(records)
    assert summary["ttft_ms"]["count"] == 2
    assert summary["ttft_ms"]["p50"] == pytest.approx(np.percentile([100, 200], 50))
    assert summary["itl_ms"]["count"] == 6
    with pytest.raises(ValueError, match="completed=2"):
        load_records({**result, "completed": 2})


def test_a_proxy_status_agrees_with_stream_failures_after_the_200() -> None:
    result = engine_like_result()
    result["errors"][2] = "Never received a valid chunk to calculate TTFT."
    good, _, no_tokens, truncated = load_records(result, expected_output_len=4)
    assert good.agrees_with_status(200) and not good.agrees_with_status(500)
    assert no_tokens.agrees_with_status(200) and no_tokens.agrees_with_status(502)
    assert truncated.agrees_with_status(200)
    result["errors"][2] = "Internal Server Error"
    http_500 = load_records(result)[2]
    assert http_500.agrees_with_status(500) and not http_500.agrees_with_status(200)
    with pytest.raises(ValueError, match="save-detailed"):
        load_records({"completed": 1})


def test_point_report_takes_the_engines_figures(tmp_path: Path) -> None:
    sc = load_scenario(resolve_scenario("short-chat"))
    result = engine_like_result() | {"p99_ttft_ms": 123.0, "p50_e2el_ms": 456.0}
    point = point_report(
        result, scenario=sc, value=1.0, raw_file=tmp_path / "raw" / "p.json", report_dir=tmp_path
    )
    assert point["raw"] == "raw/p.json"
    assert point["ttft_ms"]["p99"] == 123.0 and point["e2el_ms"]["p50"] == 456.0
    assert point["requests"] == {"sent": 4, "completed": 3, "failed": 1}
    assert point["errors"] == {"http_500": 1}
    assert point["goodput"]["good_requests"] == 2  # 0.5 req/s x 4 s
    assert point["goodput"]["attainment"] == 0.5 and point["goodput"]["passed"] is False


# --- HAProxy follows readiness --------------------------------------------------------------
class _Backend:
    """A toy pod: /readyz answers 200 or 503 as told; anything else answers its name."""

    def __init__(self, name: str) -> None:
        self.name, self.ready, self.hits = name, True, 0
        backend = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/readyz":
                    code = 200 if backend.ready else 503
                else:
                    code, backend.hits = 200, backend.hits + 1
                body = backend.name.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def toy_fleet(tmp_path: Path) -> Iterator[tuple[HAProxy, StateWatcher, list[_Backend]]]:
    find_haproxy()  # fails with the install hint when HAProxy is missing
    probe = rendered_pod(probes__readiness__periodSeconds=1)
    backends = [_Backend("a"), _Backend("b"), _Backend("c")]
    # API and probe on one port here; slot 2 starts outside the endpoints (a surge slot).
    slots = [Slot(i, b.port, b.port) for i, b in enumerate(backends)]
    haproxy = HAProxy(tmp_path, slots, {0, 1}, probe).start()
    watcher = StateWatcher(haproxy, interval=0.1).start()
    try:
        yield haproxy, watcher, backends
    finally:
        watcher.stop()
        haproxy.stop()
        for b in backends:
            b.server.shutdown()


def _get(url: str, rid: str) -> str:
    req = urllib.request.Request(url, headers={"x-request-id": rid})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return str(resp.read().decode())


def test_haproxy_config_is_accepted(tmp_path: Path) -> None:
    probe = rendered_pod()
    cfg = tmp_path / "h.cfg"
    cfg.write_text(
        render_config(
            frontend_port=1,
            socket_path=tmp_path / "s",
            slots=[Slot(0, 2, 3), Slot(1, 4, 5)],
            enabled={0},
            probe=probe,
        )
    )
    text = cfg.read_text()
    assert (
        f"inter {probe.readiness_probe.period_seconds:g}s fall "
        f"{probe.readiness_probe.failure_threshold} rise 1" in text
    )
    assert f"timeout check {probe.readiness_probe.timeout_seconds:g}s" in text
    check = subprocess.run([find_haproxy(), "-c", "-f", str(cfg)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_haproxy_routes_by_readiness_like_a_service(toy_fleet: Any) -> None:
    haproxy, watcher, (a, b, c) = toy_fleet
    assert watcher.wait_for(
        lambda s: s["slot0"] == s["slot1"] == "UP" and s["slot2"] == "MAINT", 10
    )
    served = Counter(_get(f"{haproxy.url}/x", f"r{i}") for i in range(6))
    assert served == {"a": 3, "b": 3}

    # A pod that turns unready leaves the rotation after failureThreshold probes.
    b.ready = False
    assert watcher.wait_for(lambda s: s["slot1"] == "DOWN", 10)
    assert {_get(f"{haproxy.url}/x", f"s{i}") for i in range(4)} == {"a"}

    # A new pod joins not ready, and takes traffic only after a passing probe.
    c.ready = False
    haproxy.add_endpoint(Slot(2, c.port, c.port))
    assert watcher.current["slot2"] != "UP"
    # Its first checks fail: it goes DOWN, never UP, while /readyz says no.
    assert watcher.wait_for(lambda s: s["slot2"] == "DOWN", 10)
    c.ready = True
    assert watcher.wait_for(lambda s: s["slot2"] == "UP", 10)

    # A terminating pod leaves the endpoints at once, whatever its probe says.
    haproxy.remove_endpoint(Slot(0, a.port, a.port))
    assert watcher.wait_for(lambda s: s["slot0"] == "DRAIN", 5)
    hits_a = a.hits
    assert {_get(f"{haproxy.url}/x", f"t{i}") for i in range(4)} == {"c"}
    assert a.hits == hits_a

    # No ready endpoint: HAProxy answers 503 itself, and the access log says so.
    c.ready = False
    assert watcher.wait_for(lambda s: s["slot2"] == "DOWN", 10)
    with pytest.raises(urllib.error.HTTPError) as err:
        _get(f"{haproxy.url}/x", "u0")
    assert err.value.code == 503
    haproxy.stop()
    log = haproxy.access_log()
    assert log["r0"].status == 200 and log["u0"].status == 503
    assert log["u0"].server == "<NOSRV>"
    assert {log[f"t{i}"].server for i in range(4)} == {"slot2"}


def _loadtest(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ministream_loadtest", *args], capture_output=True, text=True
    )


def test_cli_refuses_nonsense() -> None:
    run = _loadtest("rollout", "--replicas", "0", "--output", "x.json", "--model", "m")
    assert run.returncode != 0 and "--replicas" in run.stderr
    run = _loadtest(
        *("rollout", "--replicas", "2", "--output", "x.json", "--model", "m"),
        *("--no-drain", "--control-restarts", "1"),
    )
    assert run.returncode != 0 and "drop --control-restarts" in run.stderr
    run = _loadtest(
        *("run", "--scenario", "nope", "--model", "m", "--tokenizer", "t", "--output-dir", "o")
    )
    assert run.returncode == 2 and "bundled scenarios" in run.stderr
