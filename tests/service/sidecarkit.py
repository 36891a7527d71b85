"""Helpers of the sidecar tests (a unique module name, like tests/charts/chartkit.py).

`SidecarThread` runs the real app under uvicorn on a free port, so tests talk HTTP to it.
`FakeVLLM` is an httpx transport that answers like vLLM; it stands in for vLLM only where
a test exercises the sidecar's own HTTP surface (auth, fuzzing, exposition, timing rules)
and says so. Behaviour against vLLM itself is tested against the real CPU engine.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from ministream_sidecar.app import create_app
from ministream_sidecar.settings import SidecarSettings
from ministream_testkit.net import free_port
from ministream_testkit.waiting import wait_until

FAST_WARMUP: dict[str, Any] = {
    "warmup_requests": 4,
    "warmup_concurrency": 2,
    "warmup_prompt_tokens": 32,
    "warmup_max_tokens": 8,
    "warmup_backoff_initial_seconds": 0.1,
    "warmup_backoff_max_seconds": 0.2,
    "health_interval_seconds": 0.5,
    "drain_poll_interval_seconds": 0.2,
}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Parse Prometheus text into {(sample name, sorted labels): value}."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def sample(text: str, name: str, **labels: str) -> float:
    return samples(text)[(name, tuple(sorted(labels.items())))]


class SidecarThread:
    """The sidecar app under a real uvicorn server in a background thread."""

    def __init__(self, settings: SidecarSettings, **app_kwargs: Any) -> None:
        self.settings = settings
        self.port = settings.port
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = create_app(settings, **app_kwargs)
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            log_config=None,
            access_log=False,
            lifespan="on",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> SidecarThread:
        self.thread.start()
        wait_until(lambda: self.server.started, 20, 0.02, what=f"sidecar startup on {self.url}")
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.get(self.url + path, timeout=kwargs.pop("timeout", 10), **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.post(self.url + path, timeout=kwargs.pop("timeout", 300), **kwargs)

    def metrics(self) -> str:
        return self.get("/metrics").text

    def ready(self) -> bool:
        return self.get("/readyz").status_code == 200


@dataclass
class FakeVLLM:
    """Answers /health, /v1/models, /v1/completions, /metrics and /load like vLLM 0.32 does
    (/load as with --enable-server-load-tracking; `in_flight=None`: a vLLM without /load)."""

    model: str = "fake-model"
    healthy: bool = True
    completion_status: int = 200
    running: int = 0
    waiting: int = 0
    in_flight: int | None = 0
    completions: int = 0
    metrics_polls: int = 0  # answers to /metrics (what the drain polls)
    # /health times out (a saturated or a stopped server); with `generating`, every /metrics
    # answer shows 100 more generated tokens than the last (saturated), without it none (hung).
    health_stalls: bool = False
    generating: bool = False
    generated_tokens: float = 0.0
    seen_auth: list[str | None] = field(default_factory=list)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self._handle)

    async def _handle(self, request: httpx.Request) -> httpx.Response:
        self.seen_auth.append(request.headers.get("authorization"))
        await asyncio.sleep(0)
        path = request.url.path
        if path == "/health":
            if self.health_stalls:
                raise httpx.ReadTimeout("no answer within the timeout", request=request)
            return httpx.Response(200 if self.healthy else 503)
        if not self.healthy:
            raise httpx.ConnectError("connection refused", request=request)
        if path == "/v1/models":
            return httpx.Response(
                200,
                json={
                    "object": "list",
                    "data": [{"id": self.model, "object": "model", "max_model_len": 512}],
                },
            )
        if path == "/v1/completions":
            self.completions += 1
            body = json.loads(request.content)
            if self.completion_status != 200 or body["model"] != self.model:
                status = self.completion_status if self.completion_status != 200 else 404
                return httpx.Response(
                    status, json={"error": {"message": "rejected", "code": status}}
                )
            return httpx.Response(
                200,
                json={
                    "choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
                    "usage": {
                        "prompt_tokens": len(body["prompt"]),
                        "completion_tokens": body["max_tokens"],
                    },
                },
            )
        if path == "/load" and self.in_flight is not None:
            return httpx.Response(200, json={"server_load": self.in_flight})
        if path == "/metrics":
            self.metrics_polls += 1
            if self.generating:
                self.generated_tokens += 100
            labels = f'engine="0",model_name="{self.model}"'
            return httpx.Response(
                200,
                text=(
                    "# HELP vllm:num_requests_running Number of requests in model execution.\n"
                    "# TYPE vllm:num_requests_running gauge\n"
                    f"vllm:num_requests_running{{{labels}}} {float(self.running)}\n"
                    "# HELP vllm:num_requests_waiting Number of requests waiting.\n"
                    "# TYPE vllm:num_requests_waiting gauge\n"
                    f"vllm:num_requests_waiting{{{labels}}} {float(self.waiting)}\n"
                    "# HELP vllm:generation_tokens_total Number of generation tokens processed.\n"
                    "# TYPE vllm:generation_tokens_total counter\n"
                    f"vllm:generation_tokens_total{{{labels}}} {self.generated_tokens}\n"
                ),
            )
        return httpx.Response(404)


def fake_settings(**overrides: Any) -> SidecarSettings:
    values: dict[str, Any] = {
        **FAST_WARMUP,
        "vllm_url": "http://fake-vllm:8000",
        "port": free_port(),
        "drain_idle_polls": 1,
    }
    values.update(overrides)
    return SidecarSettings(**values)


# What the `start_sidecar` and `sidecar_for_vllm` fixtures (conftest.py) return.
SidecarFactory = Callable[..., SidecarThread]
