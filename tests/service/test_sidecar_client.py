"""`ministream_sidecar.client`, the stdlib client the chart's preStop hook, `ministream up` and
the rollout experiment share, against a stand-in sidecar (a local HTTP server): what it sends,
what it reports, and how it fails. The real sidecar is behind it in test_sidecar_launcher.py
and the rollout tests."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from ministream_sidecar import client
from ministream_testkit.net import free_port
from ministream_testkit.stand_in_sidecar import StandInSidecar, stand_in_sidecar


@pytest.fixture
def sidecar() -> Iterator[StandInSidecar]:
    with stand_in_sidecar() as stand_in:
        yield stand_in


def test_drain_posts_with_the_token_and_returns_the_answer(sidecar: StandInSidecar) -> None:
    result = client.drain(sidecar.url, timeout=5, token="t0k")
    assert result.ok and result.body == {"outcome": "idle"} and result.error is None
    assert sidecar.seen == [("POST", "/drain", "Bearer t0k")]


def test_drain_reports_an_http_error(sidecar: StandInSidecar) -> None:
    sidecar.status = 401
    result = client.drain(sidecar.url, timeout=5)
    assert not result.ok and result.status == 401 and "unauthorized" in (result.error or "")


def test_drain_reports_a_refused_connection() -> None:
    result = client.drain(f"http://127.0.0.1:{free_port()}", timeout=1)
    assert result.status is None and not result.ok and result.error


def test_ready_follows_readyz(sidecar: StandInSidecar) -> None:
    assert client.ready(sidecar.url)
    sidecar.status = 503
    assert not client.ready(sidecar.url)
    assert not client.ready(f"http://127.0.0.1:{free_port()}")


def test_module_entry_point_reads_port_and_token_from_the_environment(
    sidecar: StandInSidecar,
) -> None:
    """`python3 -m ministream_sidecar.client drain`: what the preStop hook runs."""
    env = {"MINISTREAM_SIDECAR_PORT": str(sidecar.port), "MINISTREAM_SIDECAR_TOKEN": "abc"}
    ok = _run_module(["drain", "--timeout", "5"], env)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["drain"]["body"] == {"outcome": "idle"}
    assert sidecar.seen[-1] == ("POST", "/drain", "Bearer abc")
    sidecar.status = 503
    failed = _run_module(["drain", "--timeout", "5"], env)
    assert failed.returncode == 1  # a FailedPreStopHook event, not a silent success
    assert _run_module(["ready"], env).returncode == 1


def test_default_port_is_the_charts() -> None:
    assert client.sidecar_url({}) == f"http://127.0.0.1:{client.DEFAULT_PORT}"
    assert client.sidecar_url({"MINISTREAM_SIDECAR_PORT": "9"}) == "http://127.0.0.1:9"


def _run_module(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ministream_sidecar.client", *args],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
