"""Fixtures of the sidecar tests. The real vLLM server is the session's `vllm_server`
(tests/conftest.py); sidecars are cheap and start per test against it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sidecarkit import FAST_WARMUP, SidecarFactory, SidecarThread

from ministream_sidecar.settings import SidecarSettings
from ministream_testkit.net import free_port


@pytest.fixture
def start_sidecar() -> Iterator[SidecarFactory]:
    """Start sidecars (real uvicorn, free port) with FAST_WARMUP plus overrides; stop them."""
    started: list[SidecarThread] = []

    def start(*, app_kwargs: dict[str, Any] | None = None, **overrides: Any) -> SidecarThread:
        settings = SidecarSettings(**{**FAST_WARMUP, "port": free_port(), **overrides})
        sidecar = SidecarThread(settings, **(app_kwargs or {})).start()
        started.append(sidecar)
        return sidecar

    yield start
    for sidecar in started:
        sidecar.stop()


@pytest.fixture
def sidecar_for_vllm(vllm_server: Any, start_sidecar: SidecarFactory) -> SidecarFactory:
    """Like `start_sidecar`, pointed at the session's real vLLM server."""

    def start(**overrides: Any) -> SidecarThread:
        return start_sidecar(vllm_url=vllm_server.url, **overrides)

    return start
