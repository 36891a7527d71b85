"""Drain: unready at once, then wait until vLLM holds no request at all.

Designed for a `preStop` hook: Kubernetes stops routing to an unready pod, the requests
already inside vLLM finish, and only then does the kubelet send SIGTERM, which vLLM meets
with `--shutdown-timeout` (docs/architecture.md §3). terminationGracePeriodSeconds must cover
DRAIN_TIMEOUT_SECONDS + vLLM's shutdown timeout + a margin.

Idleness is what vLLM itself reports, on DRAIN_IDLE_POLLS consecutive polls, no sooner than
DRAIN_MIN_SECONDS after going unready (the endpoint propagation lag: requests routed here
before the load balancers saw the pod leave still arrive until then): 0 on the engine
gauges `vllm:num_requests_running` and `vllm:num_requests_waiting`, and 0 requests in flight
in vLLM's HTTP server (GET /load, with `--enable-server-load-tracking`). The gauges alone miss
a request that vLLM has accepted but its engine core has not scheduled yet, and a response
still being written; SIGTERM then cuts such a request (docs/sidecar.md#what-the-drain-counts).
A pod whose vLLM never came up (a bad release) has nothing to wait for: the drain ends at the
first scrape that fails, instead of holding the pod's slot for the whole timeout.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .context import SidecarContext
from .engine_client import RequestCounts
from .errors import SidecarError
from .events import EventReason, EventType
from .metrics import DrainOutcome

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DrainResult:
    outcome: DrainOutcome
    duration_seconds: float  # from the first moment of the drain
    running: int | None  # last counts seen; None if vLLM's metrics were never readable
    waiting: int | None
    in_flight: int | None  # vLLM's GET /load; None if never read or not served
    polls: int
    scrape_errors: int
    last_error: str | None


class Drainer:
    def __init__(
        self,
        ctx: SidecarContext,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._ctx = ctx
        self._sleep = sleep
        self._task: asyncio.Task[DrainResult] | None = None
        self._started: float | None = None  # monotonic time of the first drain call

    async def drain(self, timeout_seconds: float | None = None) -> DrainResult:
        """Go unready now; wait for idle or the timeout. Concurrent calls share one wait."""
        if not self._ctx.state.draining:
            self._ctx.state.start_drain()  # readiness flips before anything is awaited
            self._started = time.monotonic()
            log.info("drain started")
            self._ctx.events.emit(EventReason.DRAIN_STARTED, "drain started: pod is unready")
        if self._task is None or self._task.done():
            timeout = timeout_seconds or self._ctx.settings.drain_timeout_seconds
            self._task = asyncio.get_running_loop().create_task(self._wait_idle(timeout))
        return await asyncio.shield(self._task)

    async def aclose(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _wait_idle(self, timeout: float) -> DrainResult:
        s = self._ctx.settings
        assert self._started is not None
        began = time.monotonic()
        deadline = began + timeout
        not_before = self._started + s.drain_min_seconds
        model = self._ctx.state.model or s.model_name or None
        last: RequestCounts | None = None
        last_error: str | None = None
        polls = errors = idle_streak = 0
        while True:
            try:
                last = await self._ctx.client.request_counts(model)
            except SidecarError as exc:
                errors += 1
                idle_streak = 0
                last_error = exc.message
                if not self._ctx.state.upstream_ever_up:
                    outcome = DrainOutcome.NEVER_UP
                    break
            else:
                polls += 1
                idle_streak = idle_streak + 1 if last.idle else 0
            now = time.monotonic()
            if idle_streak >= s.drain_idle_polls and now >= not_before:
                outcome = DrainOutcome.IDLE
                break
            if now >= deadline:
                outcome = DrainOutcome.TIMEOUT
                break
            await self._sleep(min(s.drain_poll_interval_seconds, deadline - now))
        result = DrainResult(
            outcome=outcome,
            duration_seconds=round(time.monotonic() - self._started, 3),
            running=last.running if last else None,
            waiting=last.waiting if last else None,
            in_flight=last.in_flight if last else None,
            polls=polls,
            scrape_errors=errors,
            last_error=last_error,
        )
        self._ctx.metrics.drains.labels(outcome.value).inc()
        self._ctx.metrics.drain_duration_seconds.observe(result.duration_seconds)
        fields = {
            "outcome": outcome.value,
            "duration_seconds": result.duration_seconds,
            "running": result.running,
            "waiting": result.waiting,
            "in_flight": result.in_flight,
            "polls": polls,
            "scrape_errors": errors,
        }
        if outcome is DrainOutcome.IDLE:
            log.info("drain finished", extra=fields)
            self._ctx.events.emit(
                EventReason.DRAIN_FINISHED,
                f"vLLM idle after {result.duration_seconds:.1f}s of drain",
            )
        elif outcome is DrainOutcome.NEVER_UP:
            log.info("drain finished: vLLM never came up", extra={**fields, "error": last_error})
            self._ctx.events.emit(
                EventReason.DRAIN_FINISHED,
                "vLLM never came up: nothing to drain",
            )
        else:
            log.warning("drain timed out", extra={**fields, "error": last_error})
            self._ctx.events.emit(
                EventReason.DRAIN_TIMED_OUT,
                f"drain timed out after {result.duration_seconds:.1f}s with "
                f"{result.running} running, {result.waiting} waiting and "
                f"{result.in_flight} in-flight requests",
                EventType.WARNING,
            )
        return result
