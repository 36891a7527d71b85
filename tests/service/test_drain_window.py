"""The window between the drain's idle test and vLLM's shutdown, reproduced by construction on
the real vLLM CPU engine (docs/sidecar.md#what-the-drain-counts).

A rolling restart once lost a request: it reached vLLM in the endpoint-lag window
while the machine was starved (a new pod starting on the same cores), vLLM's engine gauges
said 0 running and 0 waiting, the drain ended, and the SIGTERM that followed answered the
request `200` with an empty stream. Here the starved engine core is a stopped one (SIGSTOP):
vLLM's HTTP server has accepted a streamed request that the engine core has not taken in yet,
which is exactly what the engine gauges cannot see and GET /load (vLLM's
`--enable-server-load-tracking`) can.

1. The drain does not call such a pod idle (without GET /load it did: the test's first
   assertion on the drain fails on the old drain), and once the engine core runs again it
   returns only after the stream has been answered in full.
2. vLLM's own behaviour, which makes the drain necessary: SIGTERM while such a request is
   held answers it `200` with no token (its usage chunk: 0 completion tokens). If this ever
   changes, docs/sidecar.md says otherwise.

This test owns its vLLM (it stops it); the session's shared server is left alone.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from sidecarkit import SidecarFactory

from ministream_sidecar.engine_client import LOAD_PATH, LOAD_TRACKING_FLAG
from ministream_testkit.vllm_server import (
    TINY_ENGINE_ARGS,
    VLLMServer,
    engine_core,
    request_counts,
)
from ministream_testkit.waiting import wait_until
from tests.conftest import TINY_SERVED_NAME

pytestmark = [pytest.mark.engine, pytest.mark.network]

MAX_TOKENS = 32
# Printed by vLLM's API server when it forwards SIGTERM to its engine core (vLLM 0.32,
# vllm/v1/engine/utils.py): from then on the stopped engine core has the signal pending.
SIGTERM_FORWARDED = "send sigterm to process EngineCore"


@pytest.fixture(scope="module")
def own_vllm(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VLLMServer]:
    server = VLLMServer(
        model=str(tiny_model_dir),
        served_name=TINY_SERVED_NAME,
        log_path=tmp_path_factory.mktemp("drain-window") / "vllm.log",
        args=[*TINY_ENGINE_ARGS, "--shutdown-timeout", "30", LOAD_TRACKING_FLAG],
    )
    with server.running():
        yield server


def in_flight(server: VLLMServer) -> int:
    return int(httpx.get(server.url + LOAD_PATH, timeout=10).json()["server_load"])


class StreamedRequest(threading.Thread):
    """One streamed completion; keeps every `data:` line it received."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.status: int | None = None
        self.lines: list[str] = []
        self.error: str | None = None

    def run(self) -> None:
        payload: dict[str, Any] = {
            "model": TINY_SERVED_NAME,
            "prompt": "hello",
            "max_tokens": MAX_TOKENS,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        try:
            with httpx.stream(
                "POST", f"{self.url}/v1/completions", json=payload, timeout=120
            ) as response:
                self.status = response.status_code
                self.lines = [line for line in response.iter_lines() if line.startswith("data:")]
        except httpx.HTTPError as exc:
            self.error = repr(exc)

    @property
    def token_chunks(self) -> int:
        return sum(1 for line in self.lines if '"text"' in line)

    @property
    def completion_tokens(self) -> int | None:
        """What vLLM's closing usage chunk says it generated (a chunk may carry several)."""
        for line in self.lines:
            if line.startswith("data: {") and '"usage"' in line:
                usage = json.loads(line.removeprefix("data: ")).get("usage")
                if usage:
                    return int(usage["completion_tokens"])
        return None


def held_while_engine_core_stopped(server: VLLMServer, core: psutil.Process) -> StreamedRequest:
    """Stop the engine core, send a streamed request, return once vLLM's HTTP server holds it."""
    core.suspend()
    request = StreamedRequest(server.url)
    request.start()
    wait_until(lambda: in_flight(server) == 1, 60, what="vLLM's GET /load counting the request")
    return request


def test_drain_waits_for_a_request_the_engine_gauges_miss_and_sigterm_cuts_it(
    own_vllm: VLLMServer, start_sidecar: SidecarFactory
) -> None:
    sidecar = start_sidecar(
        vllm_url=own_vllm.url,
        model_name=TINY_SERVED_NAME,
        warmup_on_start=False,
        drain_poll_interval_seconds=0.1,
        drain_min_seconds=0,
    )
    core = engine_core(own_vllm)
    try:
        request = held_while_engine_core_stopped(own_vllm, core)
        # The blind spot: the engine gauges report what the engine core last published.
        assert request_counts(own_vllm.url).idle

        held = sidecar.post("/drain", params={"timeout_seconds": 1.5}).json()
        assert held["outcome"] == "timeout", (
            f"the drain called a pod idle that holds a request: {held}"
        )
        assert (held["running"], held["waiting"], held["in_flight"]) == (0, 0, 1)

        core.resume()
        done = sidecar.post("/drain", params={"timeout_seconds": 120}).json()
        request.join(60)
        assert done["outcome"] == "idle" and done["in_flight"] == 0, done
        # The drain ended after the response had been written: the client has every token.
        assert not request.is_alive() and request.error is None, request.error
        assert request.status == 200 and request.token_chunks > 0, request.lines[-3:]
        assert request.completion_tokens == MAX_TOKENS, request.lines[-3:]

        # What SIGTERM does to such a request when nothing waits for it (vLLM 0.32).
        cut = held_while_engine_core_stopped(own_vllm, core)
        assert own_vllm.process is not None
        own_vllm.process.send_signal(signal.SIGTERM)  # the API server only, as a kubelet does
        wait_until(
            lambda: SIGTERM_FORWARDED in own_vllm.log_path.read_text(errors="replace"),
            60,
            what="vLLM forwarding SIGTERM to its engine core",
            detail=own_vllm.log_tail,
        )
        core.resume()
        cut.join(120)
        assert not cut.is_alive(), "the cut request never ended"
        assert own_vllm.wait_exit(120) == 0, own_vllm.log_tail()
        assert cut.status == 200 and cut.token_chunks == 0, (cut.status, cut.lines, cut.error)
        # vLLM's closing usage chunk says it: nothing was generated for this request.
        assert cut.completion_tokens == 0 and cut.lines[-1] == "data: [DONE]", cut.lines
    finally:
        if core.is_running() and core.status() == psutil.STATUS_STOPPED:
            os.kill(core.pid, signal.SIGCONT)
