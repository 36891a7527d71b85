"""A real vLLM stopped, then killed, under the sidecar.

Stopped (SIGSTOP, the control of the busy-or-hung rule): /health and /metrics stop answering,
so the failures count and /livez fails after the threshold; resumed, it is warmed again.
Killed: /readyz fails at the very next probe, /livez after the threshold.

Destructive, so the module runs its own real vLLM server (not the session's shared one); the
stop test runs first and leaves it serving again.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sidecarkit import SidecarFactory, sample

from ministream_testkit.vllm_server import TINY_ENGINE_ARGS, VLLMServer
from ministream_testkit.waiting import wait_until
from tests.conftest import TINY_SERVED_NAME

pytestmark = [pytest.mark.engine, pytest.mark.network]

INTERVAL = 0.5
THRESHOLD = 4


@pytest.fixture(scope="module")
def victim_vllm(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VLLMServer]:
    server = VLLMServer(
        model=str(tiny_model_dir),
        served_name=TINY_SERVED_NAME,
        log_path=tmp_path_factory.mktemp("victim") / "vllm-victim.log",
        args=TINY_ENGINE_ARGS,
    )
    with server.running():  # stopping is a no-op once a test killed it
        yield server


def test_vllm_stopped_is_hung_not_busy(
    start_sidecar: SidecarFactory, victim_vllm: VLLMServer
) -> None:
    sidecar = start_sidecar(
        vllm_url=victim_vllm.url,
        health_interval_seconds=INTERVAL,
        health_timeout_seconds=0.5,
        liveness_failure_threshold=THRESHOLD,
        progress_window_seconds=0.2,
        progress_timeout_seconds=1.0,
    )
    wait_until(sidecar.ready, 120, what="ready")
    assert victim_vllm.process is not None
    group = victim_vllm.process.pid
    os.killpg(group, signal.SIGSTOP)  # the server, its engine core: nothing runs, nothing dies
    try:
        wait_until(lambda: sidecar.get("/livez").status_code == 503, 60, 0.1, what="livez 503")
        text = sidecar.metrics()
        assert sample(text, "ministream_upstream_busy_checks_total") == 0
        assert sample(text, "ministream_upstream_health_failures_total") >= THRESHOLD
        assert sidecar.get("/readyz").status_code == 503
    finally:
        os.killpg(group, signal.SIGCONT)
    # Resumed: the same process answers again; as after a restart, it is warmed up again.
    wait_until(sidecar.ready, 120, what="ready after SIGCONT")
    assert sidecar.get("/livez").status_code == 200


def test_vllm_killed(start_sidecar: SidecarFactory, victim_vllm: VLLMServer) -> None:
    sidecar = start_sidecar(
        vllm_url=victim_vllm.url,
        health_interval_seconds=INTERVAL,
        liveness_failure_threshold=THRESHOLD,
    )
    wait_until(sidecar.ready, 120, what="ready")
    livez = sidecar.get("/livez")
    assert livez.status_code == 200
    assert livez.json()["consecutive_upstream_failures"] == 0

    assert victim_vllm.process is not None
    # The clock starts at the kill, not when the process is reaped: a health check in flight
    # can fail at the kill itself, before wait() returns.
    killed = time.monotonic()
    os.killpg(victim_vllm.process.pid, signal.SIGKILL)  # the server and its engine core
    victim_vllm.process.wait(10)

    readyz = sidecar.get("/readyz")  # the very next probe, before any background check
    assert readyz.status_code == 503
    assert "upstream_unhealthy" in readyz.json()["reasons"]

    livez_seen: list[tuple[float, int, int]] = []

    def livez_failed() -> bool:
        response = sidecar.get("/livez")
        body = response.json()
        livez_seen.append(
            (time.monotonic() - killed, response.status_code, body["consecutive_upstream_failures"])
        )
        return response.status_code == 503

    wait_until(livez_failed, THRESHOLD * INTERVAL + 10, 0.05, what="livez 503")
    # Alive until the threshold-th consecutive failure, dead from it on.
    for _, status, failures in livez_seen:
        assert (status == 503) == (failures >= THRESHOLD), livez_seen
    # Every counted failure came after the kill, one interval apart at least.
    assert livez_seen[-1][0] >= (THRESHOLD - 1) * INTERVAL, livez_seen
    text = sidecar.metrics()
    assert sample(text, "ministream_upstream_up") == 0
    assert sample(text, "ministream_ready") == 0
    assert sample(text, "ministream_upstream_health_failures_total") >= THRESHOLD
