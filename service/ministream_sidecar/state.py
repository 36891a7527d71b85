"""What the sidecar knows about its pod, as enums and booleans, and the gauges that mirror it.

Every mutation goes through a method here, so `ministream_ready`, `ministream_draining`,
`ministream_upstream_up` and the cold-start phases can never disagree with /readyz.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .metrics import ColdStartPhase, SidecarMetrics


class WarmupState(str, enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class NotReadyReason(str, enum.Enum):
    UPSTREAM_UNHEALTHY = "upstream_unhealthy"
    WARMUP_PENDING = "warmup_pending"
    WARMUP_RUNNING = "warmup_running"
    WARMUP_FAILED = "warmup_failed"
    DRAINING = "draining"


class HealthTransition(enum.Enum):
    """What one background health check changed."""

    NONE = enum.auto()
    FIRST_UP = enum.auto()  # vLLM healthy for the first time: the engine has started
    WENT_DOWN = enum.auto()
    CAME_BACK = enum.auto()  # healthy again after a blip: same process, keep the warmup
    RESTARTED = enum.auto()  # healthy again after being known dead: a new, cold process
    DIED = enum.auto()  # the failure that crossed LIVENESS_FAILURE_THRESHOLD
    BUSY = enum.auto()  # /health failed while tokens were flowing: saturated, not hung


_WARMUP_REASON = {
    WarmupState.PENDING: NotReadyReason.WARMUP_PENDING,
    WarmupState.RUNNING: NotReadyReason.WARMUP_RUNNING,
    WarmupState.FAILED: NotReadyReason.WARMUP_FAILED,
}


# Measured by the sidecar itself; the rest come from vLLM's startup log.
_OWN_PHASES = frozenset({ColdStartPhase.ENGINE_START, ColdStartPhase.WARMUP, ColdStartPhase.TOTAL})


@dataclass
class ServingState:
    """Readiness, liveness and cold-start bookkeeping for one sidecar."""

    metrics: SidecarMetrics
    process_start: float  # epoch seconds
    liveness_failure_threshold: int
    clock: Callable[[], float] = time.time

    upstream_up: bool = False
    upstream_ever_up: bool = False
    known_dead: bool = False
    consecutive_failures: int = 0
    warmup: WarmupState = WarmupState.PENDING
    draining: bool = False
    model: str = ""
    # Configured LoRA adapters: warmed (vLLM lists them, warmup answered) and missing.
    adapters_warmed: tuple[str, ...] = ()
    adapters_missing: tuple[str, ...] = ()

    engine_ready_at: float | None = None
    warmup_done_at: float | None = None
    ready_at: float | None = None
    phases: dict[ColdStartPhase, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._refresh()

    # --- queries -------------------------------------------------------------------------
    def not_ready_reasons(self) -> list[NotReadyReason]:
        reasons: list[NotReadyReason] = []
        if not self.upstream_up:
            reasons.append(NotReadyReason.UPSTREAM_UNHEALTHY)
        if self.warmup in _WARMUP_REASON:
            reasons.append(_WARMUP_REASON[self.warmup])
        if self.draining:
            reasons.append(NotReadyReason.DRAINING)
        return reasons

    @property
    def ready(self) -> bool:
        return not self.not_ready_reasons()

    @property
    def alive(self) -> bool:
        # vLLM going away during a drain is the plan, not a death: no restart for that.
        return self.draining or not self.known_dead

    # --- mutations -----------------------------------------------------------------------
    def record_health(self, ok: bool) -> HealthTransition:
        """Fold one background /health result in; counts towards the liveness threshold."""
        was_up, was_dead = self.upstream_up, self.known_dead
        transition = HealthTransition.NONE
        if ok:
            self.consecutive_failures = 0
            self.known_dead = False
            self.upstream_up = True
            if not self.upstream_ever_up:
                self.upstream_ever_up = True
                self.engine_ready_at = self.clock()
                self._set_phase(ColdStartPhase.ENGINE_START, self.engine_ready_at)
                transition = HealthTransition.FIRST_UP
            elif was_dead:
                # A new vLLM process (container restart): its caches are cold again.
                self.warmup = WarmupState.PENDING
                transition = HealthTransition.RESTARTED
            elif not was_up:
                transition = HealthTransition.CAME_BACK
        else:
            self.metrics.upstream_health_failures.inc()
            self.consecutive_failures += 1
            self.upstream_up = False
            if was_up:
                transition = HealthTransition.WENT_DOWN
            if (
                self.upstream_ever_up
                and not self.known_dead
                and self.consecutive_failures >= self.liveness_failure_threshold
            ):
                self.known_dead = True
                transition = HealthTransition.DIED
        self._refresh()
        return transition

    def record_busy(self) -> HealthTransition:
        """A failed /health during which vLLM processed tokens: the engine is saturated, not
        hung: it counts as up (serving), and the failure streak ends, as progress proves the
        process alive. Only `ministream_upstream_busy_checks_total` tells it apart."""
        self.metrics.upstream_busy_checks.inc()
        self.consecutive_failures = 0
        if not self.known_dead:
            self.upstream_up = True
        self._refresh()
        return HealthTransition.BUSY

    def record_probe_failure(self) -> None:
        """A /readyz-time health check failed: unready at once, no liveness count."""
        self.metrics.upstream_health_failures.inc()
        self.upstream_up = False
        self._refresh()

    def set_warmup(self, warmup: WarmupState) -> None:
        self.warmup = warmup
        if warmup is WarmupState.SUCCEEDED and self.warmup_done_at is None:
            self.warmup_done_at = self.clock()
            start = self.engine_ready_at if self.engine_ready_at is not None else self.process_start
            self._record_phase(ColdStartPhase.WARMUP, self.warmup_done_at - start)
        self._refresh()

    def record_engine_phases(self, phases: dict[str, float | None]) -> None:
        """vLLM's own phases (startup_phases.parse), once: the first start's log."""
        for phase in ColdStartPhase:
            seconds = phases.get(phase.value)
            if phase not in self.phases and phase not in _OWN_PHASES and seconds is not None:
                self._record_phase(phase, seconds)

    def record_adapters(self, warmed: tuple[str, ...], missing: tuple[str, ...]) -> None:
        self.adapters_warmed, self.adapters_missing = warmed, missing
        for name in warmed:
            self.metrics.lora_adapter_loaded.labels(name).set(1)
        for name in missing:
            self.metrics.lora_adapter_loaded.labels(name).set(0)

    def start_drain(self) -> None:
        self.draining = True
        self._refresh()

    # --- internals -----------------------------------------------------------------------
    def _set_phase(self, phase: ColdStartPhase, at: float) -> None:
        self._record_phase(phase, at - self.process_start)

    def _record_phase(self, phase: ColdStartPhase, seconds: float) -> None:
        self.phases[phase] = seconds
        self.metrics.set_phase(phase, seconds)

    def _refresh(self) -> None:
        ready = self.ready
        if ready and self.ready_at is None:
            self.ready_at = self.clock()
            self._set_phase(ColdStartPhase.TOTAL, self.ready_at)
        self.metrics.ready.set(1 if ready else 0)
        self.metrics.draining.set(1 if self.draining else 0)
        self.metrics.upstream_up.set(1 if self.upstream_up else 0)
