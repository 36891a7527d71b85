"""The kubelet's readiness and liveness probes of one pod, replayed against its sidecar.

The probe settings come from the chart's rendered Deployment (`ChartPod`): each probe is an
HTTP GET every `periodSeconds`, a failure when it gets no 2xx-3xx answer within
`timeoutSeconds`. What the kubelet does with the results (Kubernetes' prober semantics):

- liveness: `failureThreshold` consecutive failures restart the container;
- readiness: `failureThreshold` consecutive failures take the pod out of its Service's
  endpoints, `successThreshold` consecutive successes put it back.

`ProbeLog` holds those rules (pure, unit-tested); `Prober` runs one probe in a thread and
feeds it. Every probe opens a new connection, as the kubelet's does.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from .chart_pod import ChartPod
from .records import percentiles_ms


@dataclass(frozen=True)
class ProbeSpec:
    kind: str  # "liveness" | "readiness"
    path: str
    period_seconds: float
    timeout_seconds: float
    failure_threshold: int
    success_threshold: int = 1


def chart_probes(chart: ChartPod) -> tuple[ProbeSpec, ProbeSpec]:
    """The chart's liveness and readiness probes of the vLLM container (on the sidecar)."""
    return (
        ProbeSpec(
            "liveness",
            "/livez",
            chart.liveness_period_seconds,
            chart.liveness_timeout_seconds,
            chart.liveness_failure_threshold,
        ),
        ProbeSpec(
            "readiness",
            "/readyz",
            chart.readiness_period_seconds,
            chart.readiness_timeout_seconds,
            chart.readiness_failure_threshold,
            chart.readiness_success_threshold,
        ),
    )


@dataclass
class ProbeLog:
    """The outcomes of one probe and what the kubelet made of them."""

    spec: ProbeSpec
    results: list[tuple[float, bool, float, str]] = field(default_factory=list)
    # (seconds since start, passed, latency seconds, "200" | "503" | "timeout" | error name)
    restarts: int = 0  # liveness: times the failure streak reached failureThreshold
    flips: int = 0  # readiness: ready -> unready transitions
    ready: bool = True  # readiness as the endpoints controller sees it (the pod starts ready)
    _failures: int = 0
    _successes: int = 0

    def record(self, at: float, passed: bool, latency: float, outcome: str) -> None:
        self.results.append((at, passed, latency, outcome))
        if passed:
            self._failures, self._successes = 0, self._successes + 1
            if not self.ready and self._successes >= self.spec.success_threshold:
                self.ready = True
            return
        self._failures, self._successes = self._failures + 1, 0
        if self._failures == self.spec.failure_threshold:
            if self.spec.kind == "liveness":
                self.restarts += 1
                self._failures = 0  # the kubelet restarts and counts afresh
            elif self.ready:
                self.ready, self.flips = False, self.flips + 1

    def summary(self) -> dict[str, Any]:
        failed = [r for r in self.results if not r[1]]
        outcomes: dict[str, int] = {}
        for _, _, _, outcome in self.results:
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        out: dict[str, Any] = {
            "probes": len(self.results),
            "failures": len(failed),
            "outcomes": dict(sorted(outcomes.items())),
            "latency_ms": percentiles_ms([r[2] for r in self.results], (50, 99)),
        }
        if self.spec.kind == "liveness":
            out["restarts"] = self.restarts
        else:
            out["flips"] = self.flips
        return out


class Prober:
    """Probes `base_url + spec.path` every period in a thread until `stop()`."""

    def __init__(self, base_url: str, spec: ProbeSpec) -> None:
        self.url = base_url.rstrip("/") + spec.path
        self.log = ProbeLog(spec)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"probe-{spec.kind}", daemon=True)
        self._t0 = 0.0

    def start(self) -> Prober:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> ProbeLog:
        self._stop.set()
        self._thread.join(self.log.spec.timeout_seconds + 5)
        return self.log

    def probe_once(self) -> None:
        spec = self.log.spec
        began = time.monotonic()
        try:
            response = httpx.get(self.url, timeout=spec.timeout_seconds)
            passed, outcome = 200 <= response.status_code < 400, str(response.status_code)
        except httpx.TimeoutException:
            passed, outcome = False, "timeout"
        except httpx.HTTPError as exc:
            passed, outcome = False, type(exc).__name__
        self.log.record(began - self._t0, passed, time.monotonic() - began, outcome)

    def _run(self) -> None:
        period = self.log.spec.period_seconds
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.probe_once()
            next_at += period
            self._stop.wait(max(0.0, next_at - time.monotonic()))
