"""The rolling-restart experiment's plan: pure rules, no processes.

Which replacements drain and which are the paired control, how long a terminating pod's
endpoint lingers, which pod a load-balancer server stood for at an instant, and how long the
load must be able to last. `rollout.py` runs the plan; `rollout_report.py` reads it back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from .chart_pod import ChartPod


@dataclass
class Replacement:
    """One pod replaced by another: the old pod's drain, its endpoint lag, and when the
    replacement began (on the engine's clock)."""

    old: str
    new: str
    drain: bool
    endpoint_lag: float  # inf: the endpoint is never removed by time, only by readiness
    start: float


class PodEvents(Protocol):
    """What the plan needs of a pod: its name, its slot's server and its event times."""

    @property
    def name(self) -> str: ...

    @property
    def server(self) -> str: ...

    @property
    def events(self) -> Mapping[str, float]: ...


def replacement_plan(
    restarts: int, controls: int, endpoint_lag: float, control_endpoint_lag: float | None
) -> list[tuple[bool, float]]:
    """(drain, endpoint lag) of each replacement: the last `controls` ones are the paired
    control, which skips the drain and may have an endpoint lag of its own."""
    control_lag = endpoint_lag if control_endpoint_lag is None else control_endpoint_lag
    return [
        (True, endpoint_lag) if i < restarts - controls else (False, control_lag)
        for i in range(restarts)
    ]


def pod_at(pods: Sequence[PodEvents], server: str, t: float) -> str | None:
    """The pod behind the load balancer's `server` at `t`: the slot's latest pod created by then.

    A pod owns its slot's endpoint from its creation until the next pod takes the slot, which
    is after the endpoint's removal, not at its exit: a pod that exits before its endpoint goes
    (no drain) still has requests routed to it, and they fail as its own.
    """
    owners = [p for p in pods if p.server == server and p.events.get("created", math.inf) <= t]
    return max(owners, key=lambda p: p.events["created"]).name if owners else None


def max_load_seconds(
    chart: ChartPod, restarts: int, startup_timeout: float, lead_in: float, tail: float
) -> float:
    """A cap on the load that no rollout within its own timeouts can outlast: each replaced
    pod may take its whole startup timeout, and its predecessor the whole grace period. The
    load itself ends `tail` seconds after the rollout (the engine's SIGUSR1 hook)."""
    per_pod = (
        startup_timeout
        + chart.termination_grace_period_seconds
        + 2 * chart.readiness_probe.period_seconds
    )
    return lead_in + restarts * per_pod + tail


def drain_summary(restarts: int, controls: int) -> str:
    """How a run's replacements stop their old pods, for logs and plot titles."""
    if controls == 0:
        return "with preStop /drain"
    if controls == restarts:
        return "WITHOUT drain (control)"
    return f"{restarts - controls} with preStop /drain, {controls} WITHOUT (paired control)"
