"""The app factory. All objects are built in the lifespan and hung on `app.state`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import httpx
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ministream.startup_log import process_start_time

from . import __version__
from .access_log import SlowProbeLog
from .api import build_router
from .api.errors import install_error_handlers
from .context import SidecarContext
from .drain import Drainer
from .engine_client import VLLMClient
from .events import EventRecorder, build_event_recorder
from .metrics import SidecarMetrics
from .monitor import HealthMonitor, ModelResolver
from .prefetch import PrefetchResult, start_prefetch
from .settings import SidecarSettings
from .state import ServingState
from .warmup import WarmupRunner

log = logging.getLogger(__name__)


def create_app(
    settings: SidecarSettings | None = None,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    event_recorder: EventRecorder | None = None,
    run_monitor: bool = True,
) -> FastAPI:
    """Build the sidecar app.

    `transport` replaces the HTTP transport to vLLM and `event_recorder` the Kubernetes
    events (tests use both); `run_monitor=False` leaves the background health loop off.
    """
    app_settings = settings if settings is not None else SidecarSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ctx = _build_context(app_settings, transport, event_recorder)
        monitor = _install(app, ctx)
        _log_started(app_settings)
        start_prefetch(app_settings.prefetch_paths, partial(_record_prefetch, ctx.metrics))
        monitor_task = asyncio.create_task(monitor.run()) if run_monitor else None
        try:
            yield
        finally:
            await _stop(app, monitor_task)

    app = FastAPI(
        title="MiniStream sidecar",
        version=__version__,
        description="Health, readiness, warmup gate, drain and cold-start metrics around "
        "`vllm serve` (docs/architecture.md §1.5).",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=app_settings.max_request_body_bytes)
    if not app_settings.access_log_probes:
        app.add_middleware(SlowProbeLog, slow_seconds=app_settings.slow_probe_seconds)
    app.include_router(
        build_router(
            guarded=app_settings.token is not None,
            local_only=not app_settings.control_from_network,
        )
    )
    return app


def _build_context(
    settings: SidecarSettings,
    transport: httpx.AsyncBaseTransport | None,
    event_recorder: EventRecorder | None,
) -> SidecarContext:
    """The metrics, serving state, vLLM client and event recorder the workers share."""
    metrics = SidecarMetrics()
    state = ServingState(
        metrics=metrics,
        process_start=settings.process_start_time or process_start_time(),
        liveness_failure_threshold=settings.liveness_failure_threshold,
    )
    client = VLLMClient(
        settings.vllm_url,
        api_key=settings.api_key.get_secret_value() if settings.api_key else None,
        health_timeout=settings.health_timeout_seconds,
        transport=transport,
    )
    events = event_recorder or build_event_recorder(settings, metrics)
    return SidecarContext(settings, client, state, metrics, events)


def _install(app: FastAPI, ctx: SidecarContext) -> HealthMonitor:
    """Build the workers around `ctx` and hang everything the endpoints reach on `app.state`
    (api/deps.py); return the monitor, whose loop the lifespan runs."""
    resolver = ModelResolver(ctx)
    warmup = WarmupRunner(ctx, resolve_model=resolver)
    drainer = Drainer(ctx)
    monitor = HealthMonitor(ctx, warmup=warmup, resolve_model=resolver)
    app.state.settings = ctx.settings
    app.state.metrics = ctx.metrics
    app.state.serving = ctx.state
    app.state.vllm = ctx.client
    app.state.events = ctx.events
    app.state.warmup = warmup
    app.state.drainer = drainer
    app.state.monitor = monitor
    return monitor


def _log_started(settings: SidecarSettings) -> None:
    log.info(
        "sidecar started",
        extra={
            "vllm_url": settings.vllm_url,
            "model": settings.model_name or None,
            "token_configured": settings.token is not None,
            "control_from_network": settings.control_from_network,
            "version": __version__,
        },
    )


async def _stop(app: FastAPI, monitor_task: asyncio.Task[None] | None) -> None:
    """Stop the monitor's loop, then close the workers and the clients `_install` hung on
    `app.state`, in that order."""
    if monitor_task is not None:
        monitor_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await monitor_task
    await app.state.warmup.aclose()
    await app.state.drainer.aclose()
    await app.state.events.aclose()
    await app.state.vllm.aclose()
    log.info("sidecar stopped")


def _record_prefetch(metrics: SidecarMetrics, result: PrefetchResult) -> None:
    metrics.prefetch_bytes.set(result.bytes_read)
    metrics.prefetch_seconds.set(result.seconds)


# A header block larger than this is refused (h11 answers 400 and closes) instead of being
# buffered: uvicorn's default httptools parser keeps every header of a flood in memory
# (measured: 20 MB of headers grew the sidecar's RSS by 24 MB).
MAX_HEADER_BYTES = 16 * 1024


def server_options() -> dict[str, Any]:
    """uvicorn options that bound what one client can make the sidecar hold."""
    return {"http": "h11", "h11_max_incomplete_event_size": MAX_HEADER_BYTES}


class _BodyTooLarge(Exception):
    pass


class BodyLimit:
    """ASGI middleware: 413 for a request body above `max_bytes` (no endpoint takes one).
    A declared Content-Length is refused before a byte of the body is read; a chunked body
    is counted as the app reads it."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for key, value in scope["headers"]:
            if key == b"content-length":
                declared = int(value) if value.isdigit() else -1
                if not 0 <= declared <= self.max_bytes:
                    await self._reject(send)
                    return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _BodyTooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _BodyTooLarge:
            if not started:
                await self._reject(send)

    async def _reject(self, send: Send) -> None:
        body = json.dumps(
            {
                "error": {
                    "type": "body_too_large",
                    "message": f"request bodies are limited to {self.max_bytes} bytes",
                    "details": {},
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
