"""The overload scenario's parts that need no engine: the kubelet's probe rules (ProbeLog), the
probes read from the rendered chart, a Prober against a stand-in sidecar, the report table.

The scenario itself (`ministream-loadtest overload`, `make bench-overload`) drives a real vLLM
for minutes; its figures are in docs/benchmarks.md, not in CI.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from ministream_loadtest.chart_pod import ProbeSpec, chart_pod, render_deployment
from ministream_loadtest.overload import goal_met, table
from ministream_loadtest.probes import BODY_LIMIT, PodProbes, ProbeLog, http_probe
from ministream_testkit.helm import helm_path
from ministream_testkit.stand_in_sidecar import stand_in_sidecar
from ministream_testkit.waiting import wait_until

CHART = Path(__file__).resolve().parents[2] / "charts" / "ministream"
LIVENESS = ProbeSpec("liveness", "/livez", "sidecar", 10, 5, failure_threshold=3)
READINESS = ProbeSpec(
    "readiness", "/readyz", "sidecar", 5, 3, failure_threshold=2, success_threshold=2
)


def feed(log: ProbeLog, outcomes: str) -> ProbeLog:
    for i, c in enumerate(outcomes):
        log.record(float(i), c == "+", 0.001, "200" if c == "+" else "timeout")
    return log


@pytest.mark.parametrize(
    ("outcomes", "restarts"),
    [("++--+--+", 0), ("+---", 1), ("------", 2), ("--+---+--", 1)],
)
def test_liveness_restarts_at_each_full_failure_streak(outcomes: str, restarts: int) -> None:
    log = feed(ProbeLog(LIVENESS), outcomes)
    assert log.restarts == restarts
    assert log.summary()["failures"] == outcomes.count("-")


@pytest.mark.parametrize(
    ("outcomes", "flips", "ready"),
    [
        ("--", 0, False),  # a pod starts unready: nothing to flip
        ("+", 0, False),  # one success is not enough to become ready (successThreshold 2)
        ("++-+-+", 0, True),  # never two failures in a row
        ("++--", 1, False),
        ("++--+", 1, False),  # one success is not enough to come back
        ("++--++", 1, True),
        ("++--++--", 2, False),
        ("++----", 1, False),  # unready stays one flip
    ],
)
def test_readiness_flips_by_thresholds(outcomes: str, flips: int, ready: bool) -> None:
    log = feed(ProbeLog(READINESS), outcomes)
    assert (log.flips, log.ready) == (flips, ready)


def test_summary_counts_a_window() -> None:
    log = feed(ProbeLog(READINESS), "++--++--")  # flips at t=3 and t=7
    assert log.summary(0, 4)["flips"] == 1 and log.summary(4, 8)["flips"] == 1
    assert log.summary(4, 6)["probes"] == 2 and log.summary(4, 6)["failures"] == 0


def test_probes_are_the_rendered_ones() -> None:
    deployment = render_deployment(CHART, (), {"accelerator.type": "cpu"}, helm_path())
    pod = deployment["spec"]["template"]["spec"]
    (vllm,) = [c for c in pod["containers"] if c["name"] == "vllm"]
    sidecar_ports = {
        p["containerPort"] for c in pod.get("initContainers", []) for p in c.get("ports", [])
    }
    chart = chart_pod(CHART, helm=helm_path())
    assert [p.kind for p in chart.probes] == ["startup", "liveness", "readiness"]
    for spec in chart.probes:
        rendered = vllm[f"{spec.kind}Probe"]
        assert spec.path == rendered["httpGet"]["path"]
        assert spec.period_seconds == rendered["periodSeconds"]
        assert spec.timeout_seconds == rendered["timeoutSeconds"]
        assert spec.failure_threshold == rendered["failureThreshold"]
        assert spec.success_threshold == rendered.get("successThreshold", 1)
        assert spec.initial_delay_seconds == rendered.get("initialDelaySeconds", 0)
        on_sidecar = rendered["httpGet"]["port"] in sidecar_ports
        assert spec.target == ("sidecar" if on_sidecar else "api")
    assert chart.startup_probe.target == "api"  # vLLM's own /health
    assert chart.readiness_probe.target == chart.liveness_probe.target == "sidecar"


@contextmanager
def dripping_server(head_seconds: float, body: bytes = b"ok") -> Iterator[str]:
    """An HTTP server that sends a 200 answer's status line and headers one byte at a time
    over `head_seconds` (each gap far shorter than any probe timeout), then `body` at once,
    then holds the connection open for a while."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(4096)
                try:
                    for i in range(len(head)):
                        conn.sendall(head[i : i + 1])
                        time.sleep(head_seconds / len(head))
                    conn.sendall(body)
                    stop.wait(2)
                except OSError:
                    pass  # the prober gave up and closed

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/readyz"
    finally:
        stop.set()
        listener.close()


@pytest.mark.network
def test_an_answer_dripping_past_the_deadline_fails_though_every_read_is_quick() -> None:
    with dripping_server(head_seconds=2.5) as url:
        # A per-read timeout (the replay's former httpx call) passes it: every gap is short.
        assert httpx.get(url, timeout=1.0).status_code == 200
        # The same answer, whole after 2.5 s, is a timeout here: the deadline ended it.
        assert http_probe(url, timeout=1.0) == (False, "timeout")


@pytest.mark.network
def test_an_answer_just_inside_the_deadline_passes() -> None:
    with dripping_server(head_seconds=0.6) as url:
        assert http_probe(url, timeout=1.5) == (True, "200")


@pytest.mark.network
def test_the_probe_reads_at_most_10_kib_of_body() -> None:
    # The server declares more body than it sends and then waits: only a reader that stops
    # at 10 KiB, as the kubelet does, finishes before the deadline.
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
            conn.sendall(b"x" * (BODY_LIMIT + 10))
            time.sleep(3)

    threading.Thread(target=serve, daemon=True).start()
    try:
        assert http_probe(f"http://127.0.0.1:{listener.getsockname()[1]}/", 2.0) == (True, "200")
    finally:
        listener.close()


@pytest.mark.network
def test_probe_outcomes_name_errors_and_statuses() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    assert http_probe(f"http://127.0.0.1:{closed}/", 1.0) == (False, "ConnectionRefusedError")
    with stand_in_sidecar() as sidecar:
        sidecar.status = 503
        assert http_probe(sidecar.url + "/readyz", 2.0) == (False, "503")


def test_liveness_and_readiness_wait_for_the_startup_probe() -> None:
    startup = ProbeSpec("startup", "/health", "api", 0.02, 1, failure_threshold=2)
    liveness = ProbeSpec("liveness", "/livez", "sidecar", 0.02, 1, 3, initial_delay_seconds=0.1)
    readiness = ProbeSpec("readiness", "/readyz", "sidecar", 0.02, 1, failure_threshold=2)
    answers = {"startup": iter([False, False, False, True])}

    def probe(url: str, timeout: float) -> tuple[bool, str]:
        kind = "startup" if url.endswith("/health") else "other"
        passed = next(answers["startup"]) if kind == "startup" else True
        return passed, "200" if passed else "503"

    probes = PodProbes(
        (startup, liveness, readiness),
        {"api": "http://api", "sidecar": "http://sidecar"},
        started_at=time.perf_counter(),
        probe=probe,
    ).start()
    try:
        wait_until(lambda: probes.logs["readiness"].ready, 10, what="readiness")
        wait_until(lambda: len(probes.logs["liveness"].results) >= 2, 10, what="liveness")
    finally:
        logs = probes.stop()
    started = logs["startup"].results[-1][0]
    assert [r[1] for r in logs["startup"].results] == [False, False, False, True]
    assert logs["startup"].restarts == 1  # two failures in a row: the kubelet restarts
    assert all(r[0] >= started for r in logs["readiness"].results)
    assert logs["liveness"].results[0][0] >= max(started, 0.1)  # and its initial delay


@pytest.mark.network
def test_pod_probes_see_a_sidecar_turn_unready() -> None:
    fast = ProbeSpec("readiness", "/readyz", "sidecar", 0.05, 1, failure_threshold=2)
    with stand_in_sidecar() as sidecar:
        probes = PodProbes((fast,), {"sidecar": sidecar.url}, time.perf_counter()).start()
        log = probes.logs["readiness"]
        try:
            wait_until(lambda: len(log.results) >= 3, 10, what="three probes")
            sidecar.status = 503
            wait_until(lambda: log.flips == 1, 10, what="a readiness flip")
        finally:
            probes.stop()
    assert [p for _, _, _, p in log.results[:3]] == ["200"] * 3
    assert "503" in log.summary()["outcomes"]
    assert log.summary()["latency_ms"]["p99"] is not None


def _level(liveness_failures: int, flips: int, health: int = 200) -> dict[str, object]:
    percentiles = {"p50": 1.0, "p99": 2.0}
    return {
        "multiple": 5.0,
        "rate_per_s": 10.0,
        "sent": 100,
        "succeeded": 90,
        "timed_out": 10,
        "rejected": 0,
        "latency": {"ttft_ms": percentiles},
        "probes": {
            "liveness": {"failures": liveness_failures, "restarts": 0, "latency_ms": percentiles},
            "readiness": {"failures": flips, "flips": flips, "latency_ms": percentiles},
        },
        "sidecar": {"upstream_busy_checks": 3.0},
        "vllm_health_after": health,
    }


def test_goal_and_table() -> None:
    assert goal_met(_level(0, 0))
    assert not goal_met(_level(1, 0)) and not goal_met(_level(0, 1))
    assert not goal_met(_level(0, 0, health=503))
    text = table({"levels": [_level(0, 0)]})
    assert (
        "| 5x (10.00/s) | 100 | 90 | 10 | 0 | 1.0 / 2.0 | 0 (0) | 0 (0) | 2.0 / 2.0 | 3 |" in text
    )
