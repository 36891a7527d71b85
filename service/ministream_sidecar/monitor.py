"""The background loop that watches vLLM /health and starts warmup when it first turns OK."""

from __future__ import annotations

import asyncio
import logging

from ministream import startup_log

from . import startup_phases
from .context import SidecarContext
from .engine_client import Health
from .errors import ModelUnknown, SidecarError
from .state import HealthTransition, WarmupState
from .warmup import WarmupRunner

log = logging.getLogger(__name__)


class ModelResolver:
    """The served model name: configured, or the first one vLLM lists under /v1/models."""

    def __init__(self, ctx: SidecarContext) -> None:
        self._ctx = ctx
        if ctx.settings.model_name:
            self._adopt(ctx.settings.model_name)
        else:
            self._publish_info("")

    async def __call__(self) -> str:
        if self._ctx.state.model:
            return self._ctx.state.model
        models = await self._ctx.client.served_models()
        if not models:
            raise ModelUnknown("vLLM lists no model under /v1/models")
        self._adopt(models[0].name)
        log.info(
            "served model discovered",
            extra={"model": models[0].name, "max_model_len": models[0].max_model_len},
        )
        return models[0].name

    def _adopt(self, name: str) -> None:
        self._ctx.state.model = name
        self._publish_info(name)

    def _publish_info(self, model: str) -> None:
        s = self._ctx.settings
        self._ctx.metrics.set_info(
            model=model,
            revision=s.info_revision,
            load_format=s.info_load_format,
            tensor_parallel_size=s.info_tensor_parallel_size,
        )


class HealthMonitor:
    def __init__(
        self, ctx: SidecarContext, *, warmup: WarmupRunner, resolve_model: ModelResolver
    ) -> None:
        self._ctx = ctx
        self._warmup = warmup
        self._resolve_model = resolve_model

    async def run(self) -> None:
        while True:
            try:
                await self.check_once()
            except Exception:  # the loop is the sidecar's heartbeat: it must survive bugs
                log.exception("health check crashed")
            await asyncio.sleep(self._ctx.settings.health_interval_seconds)

    async def check_once(self) -> HealthTransition:
        ok = await self._ctx.client.health() is Health.OK
        if not ok and self._ctx.state.upstream_ever_up and await self._progressing():
            transition = self._ctx.state.record_busy()
            self._log(transition)
            return transition
        transition = self._ctx.state.record_health(ok)
        self._log(transition)
        if not ok:
            return transition
        if transition is HealthTransition.FIRST_UP and self._ctx.settings.startup_log:
            self._record_engine_phases(self._ctx.settings.startup_log)
        if not self._ctx.state.model:
            try:
                await self._resolve_model()
            except SidecarError as exc:
                log.warning("could not discover the served model", extra={"error": exc.message})
        if self._ctx.settings.warmup_on_start and self._ctx.state.warmup is WarmupState.PENDING:
            self._warmup.trigger()
        return transition

    def _record_engine_phases(self, path: str) -> None:
        """vLLM is up: its startup log holds every phase up to its API server listening."""
        lines = startup_log.read(path)
        if lines is None:
            log.warning("no vLLM startup log", extra={"path": path})
            return
        phases = startup_phases.parse(lines)["phases"]
        self._ctx.state.record_engine_phases(phases)
        log.info(
            "vLLM start, by phase",
            extra={k: round(v, 3) for k, v in phases.items() if v is not None},
        )

    async def _progressing(self) -> bool:
        """Busy, not hung: vLLM's token counters grew over the progress window.

        A saturated vLLM can miss the /health timeout (its API server shares one event loop
        with the requests) while it generates at full speed; restarting it then would move
        its queue to the other pods and cascade. A hung one (stopped, deadlocked) answers
        neither /health nor /metrics, or answers with counters that stand still."""
        s = self._ctx.settings
        before = await self._ctx.client.tokens_processed(s.progress_timeout_seconds)
        if before is None:
            return False
        await asyncio.sleep(s.progress_window_seconds)
        after = await self._ctx.client.tokens_processed(s.progress_timeout_seconds)
        return after is not None and after > before

    def _log(self, transition: HealthTransition) -> None:
        s = self._ctx.state
        if transition is HealthTransition.FIRST_UP:
            log.info(
                "vLLM healthy",
                extra={
                    "engine_start_seconds": round((s.engine_ready_at or 0.0) - s.process_start, 3)
                },
            )
        elif transition is HealthTransition.WENT_DOWN:
            log.warning("vLLM /health failing")
        elif transition is HealthTransition.DIED:
            log.error(
                "vLLM considered dead", extra={"consecutive_failures": s.consecutive_failures}
            )
        elif transition is HealthTransition.CAME_BACK:
            log.info("vLLM /health OK again")
        elif transition is HealthTransition.BUSY:
            log.warning("vLLM /health failed but tokens are flowing: busy, not counted")
        elif transition is HealthTransition.RESTARTED:
            log.warning("vLLM came back after being dead: warming up again")
