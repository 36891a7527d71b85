"""The rollout and shutdown timing of the Helm chart, read from charts/ministream/values.yaml.

The rolling-restart experiment must restart replicas exactly as the chart does, so every
number here comes from the chart's values file at run time (never copied), and derived
values follow the chart's own templates (`templates/_helpers.tpl`):

- terminationGracePeriodSeconds = sidecar.drainTimeoutSeconds + vllm.shutdownTimeoutSeconds
  + shutdown.marginSeconds when null (`ministream.minGracePeriodSeconds`);
- the preStop hook's POST /drain waits up to sidecar.drainTimeoutSeconds + 5 s
  (`ministream.preStopDrain`);
- the readiness probe (periodSeconds, timeoutSeconds, failureThreshold; successThreshold is
  Kubernetes' default 1) asks the sidecar's /readyz;
- rollout.mode `surge` is maxSurge 1 / maxUnavailable 0, `inPlace` is maxSurge 0 /
  maxUnavailable 1 (`templates/deployment.yaml`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_VALUES = REPO_ROOT / "charts" / "ministream" / "values.yaml"
# `ministream.preStopDrain`: urlopen(timeout=drainTimeoutSeconds + 5).
PRESTOP_HTTP_SLACK_SECONDS = 5
# Kubernetes' default readiness successThreshold (the chart does not set one).
READINESS_SUCCESS_THRESHOLD = 1

RolloutMode = Literal["surge", "inPlace"]


@dataclass(frozen=True)
class ChartTimings:
    values_file: str
    rollout_mode: RolloutMode
    min_ready_seconds: int
    drain_timeout_seconds: int
    drain_min_seconds: float
    vllm_shutdown_timeout_seconds: int
    shutdown_margin_seconds: int
    termination_grace_period_seconds: int
    readiness_period_seconds: int
    readiness_timeout_seconds: int
    readiness_failure_threshold: int
    readiness_success_threshold: int
    health_interval_seconds: float
    liveness_failure_threshold: int
    warmup_requests: int
    warmup_concurrency: int
    warmup_prompt_tokens: int
    warmup_max_tokens: int

    @property
    def prestop_http_timeout_seconds(self) -> int:
        return self.drain_timeout_seconds + PRESTOP_HTTP_SLACK_SECONDS

    @property
    def max_surge(self) -> int:
        return 1 if self.rollout_mode == "surge" else 0

    def sidecar_env(self) -> dict[str, str]:
        """The sidecar's MINISTREAM_SIDECAR_* timing variables, as the chart's pod sets them."""
        return {
            "MINISTREAM_SIDECAR_WARMUP_REQUESTS": str(self.warmup_requests),
            "MINISTREAM_SIDECAR_WARMUP_CONCURRENCY": str(self.warmup_concurrency),
            "MINISTREAM_SIDECAR_WARMUP_PROMPT_TOKENS": str(self.warmup_prompt_tokens),
            "MINISTREAM_SIDECAR_WARMUP_MAX_TOKENS": str(self.warmup_max_tokens),
            "MINISTREAM_SIDECAR_DRAIN_TIMEOUT_SECONDS": str(self.drain_timeout_seconds),
            "MINISTREAM_SIDECAR_DRAIN_GRACE_SECONDS": str(self.drain_min_seconds),
            "MINISTREAM_SIDECAR_LIVENESS_FAILURE_THRESHOLD": str(self.liveness_failure_threshold),
            "MINISTREAM_SIDECAR_HEALTH_INTERVAL_SECONDS": str(self.health_interval_seconds),
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "prestop_http_timeout_seconds": self.prestop_http_timeout_seconds,
            "max_surge": self.max_surge,
        }


def _get(values: dict[str, Any], dotted: str) -> Any:
    node: Any = values
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ValueError(f"chart values have no {dotted!r}")
        node = node[part]
    return node


def load_chart_timings(
    values_file: Path = DEFAULT_VALUES, overrides: dict[str, Any] | None = None
) -> ChartTimings:
    """Read the timing values; `overrides` maps dotted value names to values (like --set)."""
    if not values_file.is_file():
        raise ValueError(
            f"chart values file {values_file} not found: pass --chart-values "
            "charts/ministream/values.yaml from a checkout of the project"
        )
    values = yaml.safe_load(values_file.read_text())
    for dotted, value in (overrides or {}).items():
        node = values
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value

    mode = _get(values, "rollout.mode")
    if mode not in ("surge", "inPlace"):
        raise ValueError(f"rollout.mode must be surge or inPlace, got {mode!r}")
    drain = int(_get(values, "sidecar.drainTimeoutSeconds"))
    shutdown = int(_get(values, "vllm.shutdownTimeoutSeconds"))
    margin = int(_get(values, "shutdown.marginSeconds"))
    minimum = drain + shutdown + margin
    grace = _get(values, "terminationGracePeriodSeconds")
    if grace is None:
        grace = minimum
    elif int(grace) < minimum:
        raise ValueError(
            f"terminationGracePeriodSeconds={grace} is below drain + shutdown + margin "
            f"= {minimum}; the chart refuses it"
        )
    warmup = _get(values, "sidecar.warmup")
    return ChartTimings(
        values_file=str(values_file),
        rollout_mode=mode,
        min_ready_seconds=int(_get(values, "rollout.minReadySeconds")),
        drain_timeout_seconds=drain,
        drain_min_seconds=float(_get(values, "sidecar.drainMinSeconds")),
        vllm_shutdown_timeout_seconds=shutdown,
        shutdown_margin_seconds=margin,
        termination_grace_period_seconds=int(grace),
        readiness_period_seconds=int(_get(values, "probes.readiness.periodSeconds")),
        readiness_timeout_seconds=int(_get(values, "probes.readiness.timeoutSeconds")),
        readiness_failure_threshold=int(_get(values, "probes.readiness.failureThreshold")),
        readiness_success_threshold=READINESS_SUCCESS_THRESHOLD,
        health_interval_seconds=float(_get(values, "sidecar.healthIntervalSeconds")),
        liveness_failure_threshold=int(_get(values, "sidecar.livenessFailureThreshold")),
        warmup_requests=int(warmup["requests"]),
        warmup_concurrency=int(warmup["concurrency"]),
        warmup_prompt_tokens=int(warmup["promptTokens"]),
        warmup_max_tokens=int(warmup["maxTokens"]),
    )
