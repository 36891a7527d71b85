"""The real sidecar (`ministream-sidecar`, the console script users run) as a subprocess in
front of a vLLM server, configured the way the tests need it (fast health polls, a small
warmup, warmup on start off unless asked)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ministream_testkit.net import answers, free_port
from ministream_testkit.processes import stop_group
from ministream_testkit.waiting import wait_until

# Environment a test's sidecar must not inherit from the caller's.
_HOST_ONLY = {"KUBERNETES_SERVICE_HOST", "POD_NAME", "POD_NAMESPACE", "POD_UID"}


@dataclass
class SidecarProcess:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.get(self.url + path, timeout=kwargs.pop("timeout", 30), **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.post(self.url + path, timeout=kwargs.pop("timeout", 120), **kwargs)

    def stop(self) -> None:
        stop_group(self.process)


def start_sidecar(
    vllm_url: str, served_name: str, log_path: Path, env: Mapping[str, str] | None = None
) -> SidecarProcess:
    """Start it and wait until /livez answers; `env` overrides the defaults below."""
    port = free_port()
    script = Path(sys.executable).with_name("ministream-sidecar")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "ministream_sidecar"]
    full = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MINISTREAM_SIDECAR_") and k not in _HOST_ONLY
    }
    full.update(
        {
            "MINISTREAM_SIDECAR_HOST": "127.0.0.1",
            "MINISTREAM_SIDECAR_PORT": str(port),
            "MINISTREAM_SIDECAR_VLLM_URL": vllm_url,
            "MINISTREAM_SIDECAR_MODEL_NAME": served_name,
            "MINISTREAM_SIDECAR_WARMUP_ON_START": "false",
            "MINISTREAM_SIDECAR_WARMUP_REQUESTS": "4",
            "MINISTREAM_SIDECAR_WARMUP_CONCURRENCY": "2",
            "MINISTREAM_SIDECAR_WARMUP_PROMPT_TOKENS": "32",
            "MINISTREAM_SIDECAR_WARMUP_MAX_TOKENS": "8",
            "MINISTREAM_SIDECAR_HEALTH_INTERVAL_SECONDS": "0.5",
            "MINISTREAM_SIDECAR_DRAIN_POLL_INTERVAL_SECONDS": "0.2",
            "MINISTREAM_SIDECAR_INFO_REVISION": "test",
            "MINISTREAM_SIDECAR_LOG_LEVEL": "WARNING",
            **(env or {}),
        }
    )
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=full, start_new_session=True
        )
    sidecar = SidecarProcess(f"http://127.0.0.1:{port}", proc, log_path)

    def live() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"sidecar exited {proc.returncode}:\n{log_path.read_text()}")
        return answers(f"{sidecar.url}/livez")

    try:
        wait_until(live, 60, 0.2, what="the sidecar live", detail=log_path.read_text)
    except BaseException:
        sidecar.stop()
        raise
    return sidecar
