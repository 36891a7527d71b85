"""`ministream_sidecar.client`, the stdlib client the chart's preStop hook, `ministream up` and
the rollout experiment share, against a stand-in sidecar (a local HTTP server): what it sends,
what it reports, and how it fails. The real sidecar is behind it in test_sidecar_launcher.py
and the rollout tests."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from ministream_sidecar import client
from ministream_testkit.net import free_port


class _Sidecar(BaseHTTPRequestHandler):
    status: ClassVar[int] = 200
    seen: ClassVar[list[tuple[str, str, str | None]]] = []

    def _answer(self, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        self.seen.append(("POST", self.path, self.headers.get("Authorization")))
        self._answer({"outcome": "idle"} if self.status == 200 else {"error": "unauthorized"})

    def do_GET(self) -> None:
        self.seen.append(("GET", self.path, None))
        self._answer({"ready": self.status == 200})

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def sidecar() -> Iterator[str]:
    _Sidecar.status, _Sidecar.seen = 200, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sidecar)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_drain_posts_with_the_token_and_returns_the_answer(sidecar: str) -> None:
    result = client.drain(sidecar, timeout=5, token="t0k")
    assert result.ok and result.body == {"outcome": "idle"} and result.error is None
    assert _Sidecar.seen == [("POST", "/drain", "Bearer t0k")]


def test_drain_reports_an_http_error(sidecar: str) -> None:
    _Sidecar.status = 401
    result = client.drain(sidecar, timeout=5)
    assert not result.ok and result.status == 401 and "unauthorized" in (result.error or "")


def test_drain_reports_a_refused_connection() -> None:
    result = client.drain(f"http://127.0.0.1:{free_port()}", timeout=1)
    assert result.status is None and not result.ok and result.error


def test_ready_follows_readyz(sidecar: str) -> None:
    assert client.ready(sidecar)
    _Sidecar.status = 503
    assert not client.ready(sidecar)
    assert not client.ready(f"http://127.0.0.1:{free_port()}")


def test_module_entry_point_reads_port_and_token_from_the_environment(sidecar: str) -> None:
    """`python3 -m ministream_sidecar.client drain`: what the preStop hook runs."""
    port = sidecar.rsplit(":", 1)[1]
    env = {"MINISTREAM_SIDECAR_PORT": port, "MINISTREAM_SIDECAR_TOKEN": "abc"}
    ok = _run_module(["drain", "--timeout", "5"], env)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["drain"]["body"] == {"outcome": "idle"}
    assert _Sidecar.seen[-1] == ("POST", "/drain", "Bearer abc")
    _Sidecar.status = 503
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
