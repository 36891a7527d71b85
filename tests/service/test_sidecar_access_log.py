"""The real sidecar process's access log: probes and scrapes that went well are left out by
default; a failed one (503 `/readyz` while vLLM is down) and a slow one still show, and
`MINISTREAM_SIDECAR_ACCESS_LOG_PROBES=true` logs them all.

The sidecar runs as `python -m ministream_sidecar` (the chart's entry point) pointed at a
closed port, so `/readyz` answers 503 and `/livez`, `/metrics` and `/openapi.json` 200.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import httpx
import pytest

from ministream_testkit.net import free_port
from ministream_testkit.waiting import wait_until

pytestmark = pytest.mark.network


def _run_sidecar(**env: str) -> list[dict[str, Any]]:
    """Start the sidecar, ask each path once, stop it; its JSON log lines."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ministream_sidecar"],
        env={
            **os.environ,
            "MINISTREAM_SIDECAR_PORT": str(port),
            "MINISTREAM_SIDECAR_HOST": "127.0.0.1",
            "MINISTREAM_SIDECAR_VLLM_URL": f"http://127.0.0.1:{free_port()}",
            "MINISTREAM_SIDECAR_PREFETCH_PATHS": "",
            **env,
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def listening() -> bool:
            try:
                return httpx.get(f"{url}/openapi.json", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(listening, 30, 0.1, what="sidecar process")
        assert httpx.get(f"{url}/livez", timeout=5).status_code == 200
        assert httpx.get(f"{url}/metrics", timeout=5).status_code == 200
        assert httpx.get(f"{url}/readyz", timeout=5).status_code == 503
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    return [json.loads(line) for line in err.splitlines() if line.startswith("{")]


def _access_paths(lines: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(x["path"], x["status"]) for x in lines if x["logger"] == "uvicorn.access"]


def test_probes_that_went_well_are_not_access_logged_by_default() -> None:
    lines = _run_sidecar()
    logged = _access_paths(lines)
    assert ("/readyz", 503) in logged  # a failed probe still shows
    assert ("/openapi.json", 200) in logged  # anything else too
    assert not [p for p, _ in logged if p in ("/livez", "/metrics")], logged
    assert not [x for x in lines if x["message"] == "slow probe"]


def test_a_slow_probe_is_logged_with_its_duration() -> None:
    lines = _run_sidecar(MINISTREAM_SIDECAR_SLOW_PROBE_SECONDS="0")  # every answer is "slow"
    slow = {x["path"]: x for x in lines if x["message"] == "slow probe"}
    assert set(slow) == {"/livez", "/metrics", "/readyz"}
    assert slow["/livez"]["status"] == 200 and slow["/livez"]["level"] == "WARNING"
    assert slow["/livez"]["seconds"] >= 0


def test_access_log_probes_logs_them_all() -> None:
    logged = _access_paths(_run_sidecar(MINISTREAM_SIDECAR_ACCESS_LOG_PROBES="true"))
    assert {("/livez", 200), ("/metrics", 200), ("/readyz", 503)} <= set(logged)
