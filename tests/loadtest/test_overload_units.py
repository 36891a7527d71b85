"""The overload scenario's parts that need no engine: the kubelet's probe rules (ProbeLog), the
probes read from the rendered chart, a Prober against a stand-in sidecar, the report table.

The scenario itself (`ministream-loadtest overload`, `make bench-overload`) drives a real vLLM
for minutes; its figures are in docs/benchmarks.md, not in CI.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ministream_loadtest.chart_pod import chart_pod, render_deployment
from ministream_loadtest.overload import goal_met, table
from ministream_loadtest.probes import ProbeLog, Prober, ProbeSpec, chart_probes
from ministream_testkit.helm import helm_path
from ministream_testkit.stand_in_sidecar import stand_in_sidecar
from ministream_testkit.waiting import wait_until

CHART = Path(__file__).resolve().parents[2] / "charts" / "ministream"
LIVENESS = ProbeSpec("liveness", "/livez", 10, 5, failure_threshold=3)
READINESS = ProbeSpec("readiness", "/readyz", 5, 3, failure_threshold=2, success_threshold=2)


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
        ("+-+-+", 0, True),  # never two failures in a row
        ("--", 1, False),
        ("--+", 1, False),  # one success is not enough to come back (successThreshold 2)
        ("--++", 1, True),
        ("--++--", 2, False),
        ("----", 1, False),  # unready stays one flip
    ],
)
def test_readiness_flips_by_thresholds(outcomes: str, flips: int, ready: bool) -> None:
    log = feed(ProbeLog(READINESS), outcomes)
    assert (log.flips, log.ready) == (flips, ready)


def test_probes_are_the_rendered_ones() -> None:
    deployment = render_deployment(CHART, (), {"accelerator.type": "cpu"}, helm_path())
    (vllm,) = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"
    ]
    liveness, readiness = chart_probes(chart_pod(CHART, helm=helm_path()))
    for spec, rendered in ((liveness, vllm["livenessProbe"]), (readiness, vllm["readinessProbe"])):
        assert spec.path == rendered["httpGet"]["path"]
        assert spec.period_seconds == rendered["periodSeconds"]
        assert spec.timeout_seconds == rendered["timeoutSeconds"]
        assert spec.failure_threshold == rendered["failureThreshold"]


@pytest.mark.network
def test_prober_sees_a_sidecar_turn_unready() -> None:
    fast = ProbeSpec("readiness", "/readyz", 0.05, 1, failure_threshold=2)
    with stand_in_sidecar() as sidecar:
        prober = Prober(sidecar.url, fast).start()
        try:
            wait_until(lambda: len(prober.log.results) >= 3, 10, what="three probes")
            sidecar.status = 503
            wait_until(lambda: prober.log.flips == 1, 10, what="a readiness flip")
        finally:
            log = prober.stop()
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
            "readiness": {"flips": flips, "latency_ms": percentiles},
        },
        "sidecar": {"upstream_busy_checks": 3.0},
        "vllm_health_after": health,
    }


def test_goal_and_table() -> None:
    assert goal_met(_level(0, 0))
    assert not goal_met(_level(1, 0)) and not goal_met(_level(0, 1))
    assert not goal_met(_level(0, 0, health=503))
    text = table({"levels": [_level(0, 0)]})
    assert "| 5x (10.00/s) | 100 | 90 | 10 | 0 | 1.0 / 2.0 | 0 (0) | 0 | 2.0 / 2.0 | 3 |" in text
