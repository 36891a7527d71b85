"""The rolling-restart experiment's report, built from what a run observed: a pure function.

`RolloutFacts` is everything the run hands over once the load has ended and the front has
stopped (HAProxy's access log flushed, the router's counters read): the load engine's records,
HAProxy's access log (none behind vLLM's router, which logs no request), the pods' event
times, the replacements, the front's state changes and the run's settings. `build_report`
turns them into the JSON report; it starts and stops nothing, so its rules (a failure belongs
to the pod its endpoint stood for; without an access log, to the pods shutting down while it
ran; the restart window split per replacement) are tested on hand-made facts.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .haproxy import AccessLogEntry
from .records import RequestRecord, failure_counts, failure_examples, latency_summary
from .rollout_plan import Replacement, pod_at

POD_EVENTS = ("created", "ready", "terminating", "endpoint_removed", "sigterm", "exited")


@dataclass(frozen=True)
class PodSnapshot:
    """One pod as the report sees it, after the run."""

    name: str
    server: str  # its slot's load-balancer server
    events: Mapping[str, float]  # POD_EVENTS on the engine's clock
    prestop: dict[str, Any] | None = None
    exit_code: int | None = None
    killed: bool = False
    pool: str | None = None  # P/D: prefill or decode


@dataclass(frozen=True)
class RolloutFacts:
    records: Sequence[RequestRecord]
    access: Mapping[str, AccessLogEntry] | None  # HAProxy's access log by request id; None:
    # the front keeps none (vLLM's router), failures are traced by time
    pods: Sequence[PodSnapshot]
    replacements: Sequence[Replacement]
    t0: float  # the engine's first send: every *_s figure is seconds after it
    t_start: float  # the first replacement began
    t_end: float  # the last replacement's old pod is gone
    lb_changes: Sequence[tuple[float, str, str, str]]  # (t, server, from, to)
    engine_result: Mapping[str, Any]  # the load engine's totals (completed, failed, duration)
    load: Mapping[str, Any]  # the load's settings (engine, rate, tokens, max requests, ...)
    settings: Mapping[str, Any]  # rollout mode, replicas, restarts, controls, endpoint lag
    cold_start_s: float
    extra: Mapping[str, Any] = field(default_factory=dict)  # chart pod, runtime, config, dirs
    front: Mapping[str, Any] = field(default_factory=lambda: {"name": "haproxy"})


def _rel(facts: RolloutFacts, t: float | None) -> float | None:
    return None if t is None else round(t - facts.t0, 3)


def _window(records: Sequence[RequestRecord]) -> dict[str, Any]:
    return {
        "sent": len(records),
        "succeeded": sum(r.ok for r in records),
        "failed": sum(not r.ok for r in records),
        "failures_by_cause": failure_counts(list(records)),
        **latency_summary(list(records)),
    }


def shutting_down(pods: Sequence[PodSnapshot], start: float, end: float) -> list[str]:
    """The pods whose shutdown (terminating to exited) overlapped [start, end]: where a failure
    may come from when no access log says which pod took the request. (The engine records
    no duration for a failed request: its [start, end] is its send time.)"""
    return [
        p.name
        for p in pods
        if "terminating" in p.events
        and p.events["terminating"] <= end
        and p.events.get("exited", math.inf) >= start
    ]


def _failures_by_time(facts: RolloutFacts) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Failed requests per pod shutting down while they ran ("none" when no pod was, a
    comma-joined key when several were), and each failure with those pods."""
    by_pod: dict[str, int] = {}
    failures = []
    for r in (r for r in facts.records if not r.ok):
        pods = shutting_down(facts.pods, r.start, r.end)
        key = ",".join(pods) or "none"
        by_pod[key] = by_pod.get(key, 0) + 1
        failures.append(
            {
                "request_id": r.request_id,
                "sent_s": _rel(facts, r.start),
                "ended_s": _rel(facts, r.end),
                "cause": r.cause,
                "pods_shutting_down": pods,
            }
        )
    return dict(sorted(by_pod.items())), failures


def _failures(facts: RolloutFacts) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Failed requests per pod, and each failure with where HAProxy sent it."""
    if facts.access is None:
        return _failures_by_time(facts)
    by_pod: dict[str, int] = {}
    failures = []
    for r in (r for r in facts.records if not r.ok):
        entry = facts.access.get(r.request_id)
        pod = pod_at(facts.pods, entry.server, r.start) if entry else None
        by_pod[pod or "none"] = by_pod.get(pod or "none", 0) + 1
        failures.append(
            {
                "request_id": r.request_id,
                "sent_s": _rel(facts, r.start),
                "cause": r.cause,
                "haproxy_server": entry.server if entry else None,
                "haproxy_status": entry.status if entry else None,
                "pod": pod,
            }
        )
    return dict(sorted(by_pod.items())), failures


def _replacement_windows(facts: RolloutFacts) -> list[dict[str, Any]]:
    """Each request of the restart window belongs to the replacement under way when it was
    sent: from that replacement's start to the next one's (the last: to the rollout's end)."""
    inside = [r for r in facts.records if facts.t_start <= r.start <= facts.t_end]
    starts = [rep.start for rep in facts.replacements]
    by_replacement: list[list[RequestRecord]] = [[] for _ in starts]
    for r in inside:
        by_replacement[max(0, bisect.bisect_right(starts, r.start) - 1)].append(r)
    ends = [*starts[1:], facts.t_end]
    return [
        {
            "old": rep.old,
            "new": rep.new,
            "drain": rep.drain,
            "endpoint_lag_s": None if math.isinf(rep.endpoint_lag) else rep.endpoint_lag,
            "window": {
                "start_s": _rel(facts, rep.start),
                "end_s": _rel(facts, end),
                **_window(sent),
            },
        }
        for rep, end, sent in zip(facts.replacements, ends, by_replacement, strict=True)
    ]


def _access_log_check(facts: RolloutFacts) -> dict[str, Any] | None:
    if facts.access is None:
        return None
    access = facts.access
    matched = [r for r in facts.records if r.request_id in access]
    # HAProxy logs each request it parsed: these never reached it as requests.
    unlogged = [r for r in facts.records if r.request_id not in access]
    return {
        "records": len(facts.records),
        "matched": len(matched),
        "status_disagreements": [
            r.request_id for r in matched if not r.agrees_with_status(access[r.request_id].status)
        ][:20],
        "unlogged": [
            {"request_id": r.request_id, "sent_s": _rel(facts, r.start), "cause": r.cause}
            for r in unlogged
        ],
    }


def _pod_report(facts: RolloutFacts, pod: PodSnapshot) -> dict[str, Any]:
    ev = pod.events
    return {
        "name": pod.name,
        **({"pool": pod.pool} if pod.pool else {}),
        "slot": pod.server,
        **{f"{k}_s": _rel(facts, ev.get(k)) for k in POD_EVENTS},
        "cold_start_s": round(ev["ready"] - ev["created"], 1) if "ready" in ev else None,
        "prestop": pod.prestop,
        "vllm_exit_code": pod.exit_code,
        "sigkilled": pod.killed,
    }


def build_report(facts: RolloutFacts) -> dict[str, Any]:
    records = facts.records
    by_pod, failures = _failures(facts)
    inside = [r for r in records if facts.t_start <= r.start <= facts.t_end]
    last_send = max((r.start for r in records), default=facts.t0)
    result = facts.engine_result
    return {
        "sent": len(records),
        "succeeded": sum(r.ok for r in records),
        "failed": sum(not r.ok for r in records),
        "failures_by_cause": failure_counts(list(records)),
        "failure_examples": failure_examples(list(records)),
        "front": dict(facts.front),
        "failures_by_pod": by_pod,
        "restart_window": {
            "start_s": _rel(facts, facts.t_start),
            "end_s": _rel(facts, facts.t_end),
            "duration_s": round(facts.t_end - facts.t_start, 3),
            **_window(inside),
        },
        "replacements": _replacement_windows(facts),
        "before_window": _window([r for r in records if r.start < facts.t_start]),
        "after_window": _window([r for r in records if r.start > facts.t_end]),
        "load_covered_rollout": last_send >= facts.t_end,
        # Every *_s figure is seconds after this instant: the engine's first send, on the
        # engine's clock (perf_counter, CLOCK_MONOTONIC), so raw `start_times` map onto the
        # window as start_time - t0.
        "t0_perf_counter": facts.t0,
        **facts.settings,
        "load": {
            **facts.load,
            "engine_completed": int(result["completed"]),
            "engine_failed": int(result["failed"]),
            "engine_duration_s": round(float(result["duration"]), 3),
        },
        "access_log_check": _access_log_check(facts),
        "cold_start_s": round(facts.cold_start_s, 1),
        "pods": [_pod_report(facts, p) for p in facts.pods],
        "lb_events": [
            {"t_s": _rel(facts, t), "server": s, "from": a, "to": b}
            for t, s, a, b in facts.lb_changes
            if t >= facts.t0
        ],
        "failures": failures[:200],
        **facts.extra,
    }
