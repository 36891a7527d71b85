"""Oversized bodies and header floods against the real sidecar process: refused
(413, or 400 and a closed connection), with the process's RSS staying bounded.

The sidecar runs as `python -m ministream_sidecar` (the chart's entry point, with its uvicorn
options), pointed at a closed port: no vLLM is needed to be flooded.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from ministream_testkit.net import free_port
from ministream_testkit.waiting import wait_until

pytestmark = pytest.mark.network

# RSS growth allowed across all floods of one test; each flood sends 20-1000x this.
RSS_BUDGET_KB = 12 * 1024


@dataclass
class SidecarProcess:
    proc: subprocess.Popen[bytes]
    port: int

    def rss_kb(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            return int(f.read().split("VmRSS:")[1].split()[0])

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        return sock


@pytest.fixture(scope="module")
def sidecar() -> Iterator[SidecarProcess]:
    port = free_port()
    env = {
        **os.environ,
        "MINISTREAM_SIDECAR_PORT": str(port),
        "MINISTREAM_SIDECAR_HOST": "127.0.0.1",
        "MINISTREAM_SIDECAR_VLLM_URL": f"http://127.0.0.1:{free_port()}",
        "MINISTREAM_SIDECAR_LOG_LEVEL": "ERROR",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "ministream_sidecar"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def up() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/livez", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, 30, 0.1, what="sidecar process")
        yield SidecarProcess(proc, port)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _status_or_closed(sock: socket.socket) -> int | None:
    """The HTTP status the server answered, or None when it closed without one."""
    try:
        head = sock.recv(200)
    except (ConnectionResetError, TimeoutError, OSError):
        return None
    if not head:
        return None
    return int(head.split(b" ", 2)[1])


def _header_flood(sidecar: SidecarProcess, total_bytes: int) -> int | None:
    sock = sidecar.connect()
    try:
        sock.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n")
        line = b"X-Flood: " + b"a" * 1000 + b"\r\n"
        for _ in range(total_bytes // len(line)):
            sock.sendall(line)
        sock.sendall(b"\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server gave up on us mid-flood: what we want
    status = _status_or_closed(sock)
    sock.close()
    return status


def test_header_flood_is_refused_and_memory_stays_flat(sidecar: SidecarProcess) -> None:
    before = sidecar.rss_kb()
    for _ in range(3):
        status = _header_flood(sidecar, 32 * 1024 * 1024)
        assert status in (400, 431, None), status
    assert sidecar.rss_kb() - before < RSS_BUDGET_KB
    assert httpx.get(f"http://127.0.0.1:{sidecar.port}/livez", timeout=5).status_code == 200


def test_many_small_headers_are_refused_too(sidecar: SidecarProcess) -> None:
    sock = sidecar.connect()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        sock.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n" + b"A: b\r\n" * 100_000 + b"\r\n")
    assert _status_or_closed(sock) in (400, 431, None)
    sock.close()


@pytest.mark.parametrize("path", ["/drain", "/warmup", "/livez"])
def test_declared_huge_body_is_413_before_it_is_sent(sidecar: SidecarProcess, path: str) -> None:
    sock = sidecar.connect()
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {10**12}\r\n\r\n".encode())
    assert _status_or_closed(sock) == 413
    sock.close()


def test_streamed_bodies_keep_memory_bounded(sidecar: SidecarProcess) -> None:
    """64 MiB of chunked body to an endpoint that reads none: refused or flow-controlled,
    never buffered."""
    before = sidecar.rss_kb()
    sock = sidecar.connect()
    sock.settimeout(5)
    chunk = b"a" * 65536
    frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    sent = 0
    try:
        sock.sendall(b"POST /livez HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        while sent < 64 * 1024 * 1024:
            sock.sendall(frame)
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError, TimeoutError):
        pass  # closed or no longer read: both bound what the server holds
    sock.close()
    assert sidecar.rss_kb() - before < RSS_BUDGET_KB
    assert httpx.get(f"http://127.0.0.1:{sidecar.port}/livez", timeout=5).status_code == 200


def test_small_bodies_still_work(sidecar: SidecarProcess) -> None:
    r = httpx.post(
        f"http://127.0.0.1:{sidecar.port}/warmup", content=b"{}", timeout=10
    )  # vLLM is down: 503, but not 413
    assert r.status_code == 503
