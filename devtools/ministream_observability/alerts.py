"""Alert rules, as a plain Prometheus rule file (the chart's PrometheusRule embeds it).

Every selector carries `namespace=~".*"` (ALL_NAMESPACES): it matches every series, so the
file works as it is for users who load it into Prometheus directly; the chart's PrometheusRule
replaces that exact matcher with its own release's namespace and pods.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

from . import catalog as m
from .promql import agg, increase, quantile, rate, rate_ratio, sel

ALL_NAMESPACES = 'namespace=~".*"'
# Workload-level series (kube-state-metrics) carry the object's name, not a pod's: the chart
# replaces these exact matchers (before ALL_NAMESPACES) with its own Deployment's and
# LeaderWorkerSet's names.
ALL_DEPLOYMENTS = f'{ALL_NAMESPACES}, deployment=~".*"'
ALL_STATEFULSETS = f'{ALL_NAMESPACES}, statefulset=~".*"'
_ROLLOUT_CHANGE_WINDOW = "5m"
# vLLM's router pods (`<release>-router-<hash>-<id>`): the chart replaces this exact matcher
# (before ALL_NAMESPACES) with its own namespace and router pods.
ALL_ROUTERS = f'{ALL_NAMESPACES}, pod=~".+-router-.+"'
_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


@dataclass(frozen=True)
class AlertParams:
    """The knobs of the alerts (`python -m ministream_observability --help` sets each one).

    Defaults fit a GPU fleet serving interactive traffic; see docs/observability.md.
    """

    # p95 time to first token above which MiniStreamTTFTAboveSLO fires (seconds).
    ttft_p95_slo_seconds: float = 2.0
    # How long the p95 must stay above the SLO.
    ttft_for: str = "10m"
    # Longest time from sidecar start to vLLM /health OK (weights loaded, engine up). Keep it
    # at least the chart's startupProbe budget (probes.startup: baseSeconds + size x per-GiB).
    loading_budget: str = "15m"
    # How long a pod that was ready once may stay unready (not draining) before alerting.
    not_ready_for: str = "5m"
    # Window in which one failed warmup run (all attempts used up) fires MiniStreamWarmupFailing.
    warmup_window: str = "15m"
    # KV-cache usage (0-1) above which MiniStreamKVCacheNearlyFull fires, and for how long.
    kv_cache_usage_threshold: float = 0.9
    kv_cache_for: str = "5m"
    # Window of the waiting-queue trend, and how long it must keep growing.
    queue_trend_window: str = "10m"
    queue_for: str = "5m"
    # How long preemptions must go on before MiniStreamPreempting fires.
    preemption_for: str = "10m"
    # Share of failed requests (HTTP 5xx or engine errors) that fires MiniStreamRequestErrors.
    error_ratio_threshold: float = 0.05
    errors_for: str = "5m"
    # A drain still going after this long fires MiniStreamDrainTimingOut while the pod is still
    # there to be scraped (the timeout counter moves only at the drain's end). Set it to the
    # sidecar's drain timeout (chart: sidecar.drainTimeoutSeconds, default 60 s).
    drain_budget: str = "1m"
    # How long a LeaderWorkerSet's group rollout may make no progress before
    # MiniStreamRolloutStalled fires (a Deployment says so itself, at its progressDeadlineSeconds;
    # a LeaderWorkerSet has no deadline); the alert fires up to 5 min (the change window) later.
    # Keep it near the chart's progressDeadlineSeconds: the startup budget + 10 min (920 s at
    # the chart's defaults).
    rollout_stall_budget: str = "15m"
    # Window in which one failed P/D KV transfer fires MiniStreamKVTransfersFailing, and one
    # read after the KV's lease expired fires MiniStreamKVReadAfterLeaseExpired.
    kv_transfer_failure_window: str = "10m"
    # How long a configured LoRA adapter may be missing before MiniStreamLoraAdapterNotLoaded.
    lora_not_loaded_for: str = "1m"
    # How long the router's health check may find a replica unhealthy before
    # MiniStreamRouterWorkerUnhealthy (the chart checks every 10 s, 3 failures to mark it).
    router_unhealthy_for: str = "2m"
    # How long a router may have no replica at all before MiniStreamRouterNoWorkers.
    router_no_workers_for: str = "2m"
    # Where the runbooks live; each alert links to <base>#<alert name in lower case>.
    runbook_base_url: str = "docs/observability.md"

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "str" and f.name != "runbook_base_url" and not _DURATION.match(value):
                raise ValueError(f"{f.name} must be a Prometheus duration like 5m, got {value!r}")
        if not 0 < self.kv_cache_usage_threshold <= 1:
            raise ValueError("kv_cache_usage_threshold must be in (0, 1]")
        if not 0 < self.error_ratio_threshold < 1:
            raise ValueError("error_ratio_threshold must be in (0, 1)")
        if self.ttft_p95_slo_seconds <= 0:
            raise ValueError("ttft_p95_slo_seconds must be > 0")


@dataclass(frozen=True)
class Alert:
    name: str
    group: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str
    runbook: str  # the first thing to do; the docs section holds the whole runbook
    # Extra labels; two rules of one alert need them, or their ALERTS series would collide.
    labels: tuple[tuple[str, str], ...] = ()

    def to_rule(self, params: AlertParams) -> dict[str, Any]:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity, **dict(self.labels)},
            "annotations": {
                "summary": self.summary,
                "description": self.description,
                "runbook": self.runbook,
                "runbook_url": f"{params.runbook_base_url}#{self.name.lower()}",
            },
        }


def eq(label: str, value: str) -> str:
    return f'{label}="{value}"'


def api_error_ratio(selector: str, window: str, vllm_selector: str | None = None) -> str:
    """5xx share of OpenAI API responses, counted only on pods that run vLLM (other apps in
    the namespace may export `http_requests_total` too)."""
    pods = sel(m.RUNNING, vllm_selector if vllm_selector is not None else selector)
    handlers = 'handler=~"/v1/.+"'

    def part(*extra: str) -> str:
        return agg(
            "sum",
            ("namespace",),
            f"{rate(m.HTTP_REQUESTS, selector, window, *extra)} and on (namespace, pod) {pods}",
        )

    # `or ... * 0`: no 5xx series exists until the first 5xx; show 0 %, not "No data".
    errors = f"({part(handlers, eq('status', '5xx'))}\nor\n{part(handlers)} * 0)"
    return f"{errors}\n/\n{part(handlers)}"


def engine_error_ratio(selector: str, window: str) -> str:
    """Share of finished requests vLLM ended with finished_reason="error" (catches streamed
    requests too, whose HTTP status was already 200 when the error came)."""
    return rate_ratio(
        m.REQUEST_SUCCESS,
        m.REQUEST_SUCCESS,
        selector,
        window,
        ("namespace", "model_name"),
        num_extra=eq("finished_reason", "error"),
    )


# Shared by the serving pods' alert families below.
_PER_POD = ("namespace", "pod")
_PER_ENGINE = ("namespace", "pod", "model_name")
_WHERE = "{{ $labels.namespace }}/{{ $labels.pod }}"
_FLEET, _SERVING = "ministream.fleet", "ministream.serving"


def serving_alerts(p: AlertParams) -> tuple[Alert, ...]:
    """The serving pods' (vLLM and the sidecar)."""
    return (
        *_pod_health_alerts(p),
        *_saturation_alerts(p),
        *_failure_alerts(p),
        *_drain_alerts(p),
        *_rollout_alerts(p),
    )


def _pod_health_alerts(p: AlertParams) -> tuple[Alert, ...]:
    """A pod that is not ready, still loading, failing its warmup or missing an adapter."""
    t, where = ALL_NAMESPACES, _WHERE
    not_draining = f"unless on (namespace, pod) ({sel(m.DRAINING, t)} == 1)"
    ready = agg("max", _PER_POD, sel(m.READY, t))
    was_ready = sel(m.COLD_START, t, eq("phase", "total"))
    upstream_up = agg("max", _PER_POD, sel(m.UPSTREAM_UP, t))
    engine_started = sel(m.COLD_START, t, eq("phase", "engine_start"))
    warmup_failures = agg(
        "sum", _PER_POD, increase(m.WARMUP_RUNS, t, p.warmup_window, eq("outcome", "failure"))
    )
    adapter_loaded = agg("min", ("namespace", "pod", "adapter"), sel(m.LORA_ADAPTER_LOADED, t))
    return (
        Alert(
            "MiniStreamPodNotReady",
            _FLEET,
            f"({ready} == 0)\nand on (namespace, pod) {was_ready}\n{not_draining}",
            p.not_ready_for,
            "warning",
            f"MiniStream pod {where} is not ready",
            f"{where} was ready once, and its sidecar has reported not ready (without "
            f"draining) for {p.not_ready_for}: vLLM /health fails, or vLLM restarted and "
            "has not warmed up again. The Service sends it no traffic.",
            "Read the reason in the sidecar's /readyz body and the vllm container's logs "
            "and restarts.",
        ),
        Alert(
            "MiniStreamLoadingStuck",
            _FLEET,
            f"({upstream_up} == 0)\nunless on (namespace, pod) {engine_started}\n{not_draining}",
            p.loading_budget,
            "warning",
            f"MiniStream pod {where} has been loading for more than {p.loading_budget}",
            f"vLLM in {where} has not answered /health OK since its sidecar started "
            f"{p.loading_budget} ago: weights still loading (slow storage or S3), the engine "
            "crashing in a loop, or the startupProbe killing it before it is done.",
            "Look at the vllm container's logs and restarts; compare the load time with the "
            "chart's startup budget.",
        ),
        Alert(
            "MiniStreamWarmupFailing",
            _FLEET,
            f"{warmup_failures} > 0",
            "0m",
            "warning",
            f"Warmup failed in {where}",
            f"A warmup run in {where} used up all its attempts in the last {p.warmup_window}: "
            "the pod stays unready. vLLM answers /health but cannot complete requests.",
            "Read the sidecar's warmup log lines (last_error) and send one completion by hand.",
        ),
        Alert(
            "MiniStreamLoraAdapterNotLoaded",
            _FLEET,
            f"{adapter_loaded} == 0",
            p.lora_not_loaded_for,
            "warning",
            "LoRA adapter {{ $labels.adapter }} is not served by " + where,
            "vLLM in " + where + " does not serve the configured LoRA adapter "
            "{{ $labels.adapter }}: the fetch-adapters init container refused it (manifest, "
            "base model, rank, targets or values) or could not load it. Requests naming it "
            "get 404; the base model and the other adapters are served.",
            "Read the reason in the fetch-adapters container's log (kubectl logs POD -c "
            "fetch-adapters), fix or re-convert the adapter, then restart the pod.",
        ),
    )


def _saturation_alerts(p: AlertParams) -> tuple[Alert, ...]:
    """An engine with more work than it keeps up with: slow first tokens, a full KV cache,
    a growing queue, preemptions."""
    t, where = ALL_NAMESPACES, _WHERE
    ttft_p95 = quantile(0.95, m.TTFT, t, "5m", ("namespace", "model_name"))
    kv_usage = agg("max", _PER_ENGINE, sel(m.KV_CACHE_USAGE, t))
    waiting = agg("sum", _PER_ENGINE, sel(m.WAITING, t))
    waiting_trend = agg("sum", _PER_ENGINE, f"deriv({sel(m.WAITING, t)}[{p.queue_trend_window}])")
    preemptions = agg("sum", _PER_ENGINE, rate(m.PREEMPTIONS, t, "5m"))
    return (
        Alert(
            "MiniStreamTTFTAboveSLO",
            _SERVING,
            f"{ttft_p95}\n> {p.ttft_p95_slo_seconds:g}",
            p.ttft_for,
            "warning",
            f"Time to first token p95 of {{{{ $labels.model_name }}}} above its SLO "
            f"({p.ttft_p95_slo_seconds:g} s)",
            "p95 time to first token of {{ $labels.model_name }} in {{ $labels.namespace }} "
            "is {{ $value | humanizeDuration }}, above the SLO of "
            f"{p.ttft_p95_slo_seconds:g} s for {p.ttft_for}.",
            "Check queueing (running/waiting), KV-cache usage and preemptions on the Serving "
            "dashboard; add replicas if the fleet is saturated.",
        ),
        Alert(
            "MiniStreamKVCacheNearlyFull",
            _SERVING,
            f"{kv_usage}\n> {p.kv_cache_usage_threshold:g}",
            p.kv_cache_for,
            "warning",
            f"KV cache of {where} above {p.kv_cache_usage_threshold:.0%}",
            f"KV-cache usage of {where} is {{{{ $value | humanizePercentage }}}} "
            f"(threshold {p.kv_cache_usage_threshold:.0%}) for {p.kv_cache_for}: new requests "
            "will wait and running ones may be preempted.",
            "Spread load over more replicas, lower max_num_seqs / max_model_len, or give the "
            "KV cache more memory.",
        ),
        Alert(
            "MiniStreamQueueGrowing",
            _SERVING,
            f"({waiting} > 0)\nand on (namespace, pod, model_name)\n({waiting_trend} > 0)",
            p.queue_for,
            "warning",
            f"Request queue of {where} keeps growing",
            f"{where} has {{{{ $value }}}} waiting requests, and the queue has grown over the "
            f"last {p.queue_trend_window} for {p.queue_for}: requests arrive faster than the "
            "pod serves them.",
            "Scale out, or find why throughput dropped (preemptions, KV cache, a slow pod).",
        ),
        Alert(
            "MiniStreamPreempting",
            _SERVING,
            f"{preemptions} > 0",
            p.preemption_for,
            "warning",
            f"vLLM in {where} keeps preempting requests",
            f'{where} has preempted {{{{ printf "%.2f" $value }}}} requests per second for '
            f"{p.preemption_for}: the KV cache is too small for the concurrent load, and "
            "preempted requests are computed again (latency and wasted compute).",
            "Lower max_num_seqs, raise the KV-cache memory, or add replicas.",
        ),
    )


def _failure_alerts(p: AlertParams) -> tuple[Alert, ...]:
    """Requests that fail: P/D KV transfers (failed, or read after their lease), and HTTP or
    engine errors."""
    t, where = ALL_NAMESPACES, _WHERE
    errors = p.error_ratio_threshold
    kv_transfer_failures = agg(
        "sum", _PER_ENGINE, increase(m.NIXL_FAILED, t, p.kv_transfer_failure_window)
    )
    late_reads = agg(
        "sum", _PER_ENGINE, increase(m.NIXL_LATE_READ, t, p.kv_transfer_failure_window)
    )
    return (
        Alert(
            "MiniStreamKVTransfersFailing",
            _SERVING,
            f"{kv_transfer_failures} > 0",
            "0m",
            "warning",
            f"KV-cache transfers fail in decode pod {where}",
            f'{where} failed {{{{ printf "%.0f" $value }}}} NIXL KV transfers from prefill pods '
            f"in the last {p.kv_transfer_failure_window}: each such request was failed or "
            "recomputed on the decode pod (disaggregation.kvLoadFailurePolicy).",
            "Check that the prefill pods run, that the NetworkPolicy admits NIXL's side channel "
            "and UCX's ports between the pools, and the decode pod's log (NIXL handshake).",
        ),
        Alert(
            "MiniStreamKVReadAfterLeaseExpired",
            _SERVING,
            f"{late_reads} > 0",
            "0m",
            "critical",
            f"Decode pods used KV that prefill pod {where} had released",
            f'{where} got {{{{ printf "%.0f" $value }}}} notices from decode pods about KV it had '
            f"already released (its lease expired) in the last {p.kv_transfer_failure_window}: "
            "mostly reads that finished late, whose answers may come from blocks other requests "
            "reused, served with no error (vLLM only logs it).",
            "Find why pulls outlast the lease: KV transfer time on the Serving dashboard, the "
            "pools' CPU (NIXL's progress thread takes a core of each pod), the transport.",
        ),
        Alert(
            "MiniStreamRequestErrors",
            _SERVING,
            f"(\n{api_error_ratio(t, '5m')}\n) > {errors:g}\n"
            f"or\n(\n{engine_error_ratio(t, '5m')}\n) > {errors:g}",
            p.errors_for,
            "critical",
            "MiniStream requests failing in {{ $labels.namespace }}",
            "{{ $value | humanizePercentage }} of requests in {{ $labels.namespace }} failed "
            "(HTTP 5xx from the OpenAI API, or finished by vLLM with an error) for "
            f"{p.errors_for}; threshold {errors:.0%}.",
            "Read vLLM's logs for the errors; check engine restarts and recent rollouts.",
        ),
    )


def _drain_alerts(p: AlertParams) -> tuple[Alert, ...]:
    """A drain that timed out, or is taking longer than its budget."""
    t, where = ALL_NAMESPACES, _WHERE
    drain_timeouts = agg("sum", _PER_POD, increase(m.DRAINS, t, "30m", eq("outcome", "timeout")))
    # `for:` on the instant gauge, not min_over_time(): a pod that finished draining and went
    # away leaves only draining=1 samples in any window, but its series turns stale at once.
    draining = agg("max", _PER_POD, sel(m.DRAINING, t))
    drain_fix = (
        "Raise sidecar.drainTimeoutSeconds (and the grace period) above the longest "
        "request, or cap max_tokens."
    )
    return (
        Alert(
            "MiniStreamDrainTimingOut",
            _FLEET,
            f"{drain_timeouts} > 0",
            "0m",
            "warning",
            f"Drain of {where} timed out",
            f"{where} gave up waiting for vLLM to finish its requests (drain outcome timeout) "
            "in the last 30m: requests still running were cut off when vLLM stopped.",
            drain_fix,
            labels=(("reason", "timeout"),),
        ),
        # Same alert, seen during the drain: the counter above moves only at its end, and the
        # pod may be gone before the next scrape.
        Alert(
            "MiniStreamDrainTimingOut",
            _FLEET,
            f"{draining} == 1",
            p.drain_budget,
            "warning",
            f"Drain of {where} is taking longer than {p.drain_budget}",
            f"{where} has been draining for more than {p.drain_budget}: vLLM still has "
            "running or waiting requests, and they will be cut off when the drain times out.",
            drain_fix,
            labels=(("reason", "over_budget"),),
        ),
    )


def _rollout_alerts(p: AlertParams) -> tuple[Alert, ...]:
    """A rollout that makes no progress: a Deployment's, or a LeaderWorkerSet's."""
    deployments, leader_sets = ALL_DEPLOYMENTS, ALL_STATEFULSETS
    stalled_deployment = agg(
        "max",
        ("namespace", "deployment"),
        sel(
            m.DEPLOYMENT_CONDITION,
            deployments,
            eq("condition", "Progressing"),
            eq("status", "false"),
        ),
    )
    # Pods still on the old revision (the current revision is not the update revision), fewer
    # pods updated than wanted, and that count unchanged for the whole budget.
    old_revision = agg(
        "max",
        ("namespace", "statefulset"),
        f"{sel(m.STS_CURRENT_REVISION, leader_sets)}\n"
        f"unless on (namespace, statefulset, revision)\n"
        f"{sel(m.STS_UPDATE_REVISION, leader_sets)}",
    )
    updated, wanted = sel(m.STS_UPDATED, leader_sets), sel(m.STS_REPLICAS, leader_sets)
    behind = f"{updated}\n< on (namespace, statefulset)\n{wanted}"
    # No change within the window, held for the budget (`for:`), as kubernetes-mixin's
    # KubeStatefulSetUpdateNotRolledOut does: a window as long as the budget alone would fire
    # on a fresh series (too few samples to show a change), e.g. after Prometheus restarts.
    unchanged = f"changes({updated}[{_ROLLOUT_CHANGE_WINDOW}]) == 0"
    rollout_fix = (
        "`helm rollback` the release (or fix the values and upgrade again), then read the new "
        "pod's vllm container log and restarts for the cause."
    )
    return (
        Alert(
            "MiniStreamRolloutStalled",
            _FLEET,
            f"{stalled_deployment} == 1",
            "0m",
            "critical",
            "Rollout of Deployment {{ $labels.namespace }}/{{ $labels.deployment }} stalled",
            "The Deployment {{ $labels.namespace }}/{{ $labels.deployment }} made no progress "
            "within its progressDeadlineSeconds (Progressing=False): its new pods do not turn "
            "ready (model location, shard set, engine flags or image of the new release). The "
            "old pods keep serving; the rollout stays stuck until it is rolled back or fixed.",
            rollout_fix,
            labels=(("kind", "Deployment"),),
        ),
        # Same alert for a multi-node release: its LeaderWorkerSet's leader StatefulSet.
        Alert(
            "MiniStreamRolloutStalled",
            _FLEET,
            f"{old_revision}\nand on (namespace, statefulset)\n({behind})\n"
            f"and on (namespace, statefulset)\n({unchanged})",
            p.rollout_stall_budget,
            "critical",
            "Rollout of LeaderWorkerSet {{ $labels.namespace }}/{{ $labels.statefulset }} stalled",
            "The LeaderWorkerSet {{ $labels.namespace }}/{{ $labels.statefulset }} has groups on "
            "the old revision and has updated no further group for at least "
            f"{p.rollout_stall_budget}: the new groups do not turn ready. The old groups keep "
            "serving; the rollout stays stuck until it is rolled back or fixed.",
            rollout_fix,
            labels=(("kind", "LeaderWorkerSet"),),
        ),
    )


def router_alerts(p: AlertParams) -> tuple[Alert, ...]:
    """vLLM's router (router.enabled): a replica ejected by its breaker or its health check,
    and a router with nothing to route to."""
    r = ALL_ROUTERS
    group = "ministream.router"
    per_worker = ("namespace", "pod", "worker")
    where = _WHERE
    opened = agg("sum", per_worker, increase(m.ROUTER_CB_TRANSITIONS, r, "10m", eq("to", "open")))
    # With no replica left MiniStreamRouterNoWorkers speaks; this one stays quiet then.
    unhealthy = agg("min", per_worker, sel(m.ROUTER_WORKER_HEALTH, r))
    active = agg("max", _PER_POD, sel(m.ROUTER_ACTIVE_WORKERS, r))
    return (
        Alert(
            "MiniStreamRouterWorkerEjected",
            group,
            f"{opened} > 0",
            "0m",
            "warning",
            "Router {{ $labels.pod }} opened the circuit breaker of {{ $labels.worker }}",
            f"The router {where} stopped sending requests to the replica "
            "{{ $labels.worker }} after consecutive failures (router.circuitBreaker) in the "
            "last 10m; it tries it again after the breaker's timeout.",
            "Read that replica's vLLM logs and its sidecar's /readyz; compare with "
            "MiniStreamRequestErrors.",
        ),
        Alert(
            "MiniStreamRouterWorkerUnhealthy",
            group,
            f"({unhealthy} == 0)\nand on (namespace, pod) ({active} > 0)",
            p.router_unhealthy_for,
            "warning",
            "Router {{ $labels.pod }} finds {{ $labels.worker }} unhealthy",
            f"The router {where} has found the replica {{{{ $labels.worker }}}} failing "
            f"its /health checks for {p.router_unhealthy_for} and routes nothing to it. "
            "vllm-router 0.1.17 keeps exporting a removed replica's last health value until "
            "it restarts: if that pod is gone, this alert is stale.",
            "Read that replica's vLLM logs and its sidecar's /readyz. If the pod no longer "
            "exists, restart the router pods to clear the stale series.",
        ),
        Alert(
            "MiniStreamRouterNoWorkers",
            group,
            f"{active} == 0",
            p.router_no_workers_for,
            "critical",
            "Router {{ $labels.pod }} has no replica to route to",
            f"The router {where} has had no Ready serving pod for {p.router_no_workers_for}: "
            "every request gets 503 (no_available_workers).",
            "Check the serving pods' readiness, the router's Role (pods get/list/watch) and "
            "its --selector against the pods' labels (router logs: 'Adding pod').",
        ),
    )


def alerts(p: AlertParams) -> tuple[Alert, ...]:
    return (*serving_alerts(p), *router_alerts(p))


def rule_groups(params: AlertParams) -> list[dict[str, Any]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for alert in alerts(params):
        groups.setdefault(alert.group, []).append(alert.to_rule(params))
    return [{"name": name, "rules": rules} for name, rules in groups.items()]
