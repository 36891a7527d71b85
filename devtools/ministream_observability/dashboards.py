"""The Grafana dashboards: Serving (vLLM's own metrics), Fleet & rollout (sidecar and
kube-state-metrics) and Router (vLLM's router, router.enabled). Every query goes through
`promql`, thresholds come from `AlertParams`, so the red lines on the panels are the alert
thresholds."""

from __future__ import annotations

from . import catalog as m
from .alerts import AlertParams, api_error_ratio, engine_error_ratio
from .autoscaling import REQUESTS
from .grafana import Dashboard, Panel, Row, Target, Variable
from .promql import agg, increase, quantile, rate, rate_ratio, sel

W = "$__rate_interval"  # Grafana: at least four scrape intervals, so rate() always has samples
QUANTILES = (0.5, 0.95, 0.99)

# Label filters of the variables. vLLM labels its model `model_name`; the sidecar's info
# metric calls it `model`; `pod` and `namespace` come from the ServiceMonitor/PodMonitor.
VLLM = 'namespace=~"$namespace", model_name=~"$model", pod=~"$pod"'
POD = 'namespace=~"$namespace", pod=~"$pod"'  # series without a model label (HTTP, sidecar)
NAMESPACE = 'namespace=~"$namespace"'
V1_HANDLERS = 'handler=~"/v1/.+"'  # the OpenAI API, not /health or /metrics
# The workload a serving pod belongs to, from its name: a Deployment's pods are
# <deployment>-<replicaset hash>-<5-character id>, a LeaderWorkerSet's leaders <lws>-<group
# index>. The shortest name that leaves one of those tails (label_replace anchors the regex).
READY = 'condition="true"'  # kube_pod_status_ready's series of a true Ready condition
POD_TO_WORKLOAD = '"workload", "$1", "pod", "(.+?)-(?:[a-z0-9]+-[a-z0-9]{5}|[0-9]+)"'

LINKS = (
    {
        "title": "MiniStream",
        "type": "dashboards",
        "tags": ["ministream"],
        "asDropdown": True,
        "includeVars": True,
        "keepTime": True,
    },
)


def _percentiles(
    metric: m.Metric, selector: str, labels: tuple[str, ...] = ()
) -> tuple[Target, ...]:
    return tuple(
        Target(quantile(q, metric, selector, W, labels), f"p{round(q * 100)}") for q in QUANTILES
    )


def _rate_by(
    title: str, description: str, metric: m.Metric, selector: str, label: str, *extra: str
) -> Panel:
    """Per second of `metric`, one stacked series for each value of `label`."""
    target = Target(agg("sum", (label,), rate(metric, selector, W, *extra)), f"{{{{{label}}}}}")
    return Panel(title, description, (target,), unit="reqps", stack=True)


def prefix_cache_hit_rate(selector: str, window: str, labels: tuple[str, ...] = ()) -> str:
    return rate_ratio(m.PREFIX_HITS, m.PREFIX_QUERIES, selector, window, labels)


def offload_hit_rate(selector: str, window: str) -> str:
    """Of the tokens the accelerator's cache missed, the share the KV connector (the host-memory
    offload tier) held."""
    return rate_ratio(m.EXTERNAL_PREFIX_HITS, m.EXTERNAL_PREFIX_QUERIES, selector, window)


def _serving_latency(params: AlertParams) -> Row:
    return Row(
        "Latency (selected pods together)",
        (
            Panel(
                "Time to first token",
                "Arrival to first output token; the red line is the p95 "
                "SLO of the MiniStreamTTFTAboveSLO alert.",
                _percentiles(m.TTFT, VLLM),
                unit="s",
                threshold=params.ttft_p95_slo_seconds,
            ),
            Panel(
                "Inter-token latency",
                "Time between consecutive output tokens of a request.",
                _percentiles(m.ITL, VLLM),
                unit="s",
            ),
            Panel(
                "End-to-end request latency",
                "Arrival to last token.",
                _percentiles(m.E2E, VLLM),
                unit="s",
            ),
        ),
    )


def _serving_throughput(params: AlertParams) -> Row:
    return Row(
        "Throughput and outcomes",
        (
            Panel(
                "Tokens per second",
                "Prefill (prompt) and decode (generation) throughput.",
                (
                    Target(agg("sum", (), rate(m.PROMPT_TOKENS, VLLM, W)), "prompt"),
                    Target(agg("sum", (), rate(m.GENERATION_TOKENS, VLLM, W)), "generation"),
                ),
                unit="short",
            ),
            _rate_by(
                "Finished requests by reason",
                "stop / length: normal; abort: the client left; "
                "error: the engine failed the request.",
                m.REQUEST_SUCCESS,
                VLLM,
                "finished_reason",
            ),
            Panel(
                "Request errors",
                "5xx share of OpenAI API responses and share of requests the "
                "engine finished with an error; the red line is the MiniStreamRequestErrors "
                "threshold.",
                (
                    Target(api_error_ratio(POD, W, VLLM), "HTTP 5xx {{namespace}}"),
                    Target(engine_error_ratio(VLLM, W), "engine error {{model_name}}"),
                ),
                unit="percentunit",
                threshold=params.error_ratio_threshold,
            ),
        ),
    )


def _serving_saturation(params: AlertParams) -> Row:
    return Row(
        "Saturation",
        (
            Panel(
                "Requests running and waiting",
                "Waiting requests are queued for lack of batch slots or KV cache. "
                "Per replica: waiting + running per pod, averaged over pods: the signal the "
                "chart's autoscaling scales on (autoscaling.target.requestsPerReplica).",
                (
                    Target(agg("sum", (), sel(m.RUNNING, VLLM)), "running"),
                    Target(agg("sum", (), sel(m.WAITING, VLLM)), "waiting"),
                    Target(REQUESTS.per_replica(VLLM), "per replica (autoscaling signal)"),
                ),
            ),
            Panel(
                "KV-cache usage",
                "Per pod; the red line is the MiniStreamKVCacheNearlyFull threshold.",
                (Target(agg("max", ("pod",), sel(m.KV_CACHE_USAGE, VLLM)), "{{pod}}"),),
                unit="percentunit",
                max=1,
                threshold=params.kv_cache_usage_threshold,
            ),
            Panel(
                "Preemptions per second",
                "Requests evicted from the KV cache and recomputed "
                "later: the cache is too small for the load.",
                (Target(agg("sum", (), rate(m.PREEMPTIONS, VLLM, W)), "preemptions"),),
            ),
            Panel(
                "Prefix-cache hit rate",
                "rate(hits) / rate(queries), in tokens; the offload tier's line: of the tokens "
                "the accelerator's cache missed, those the host-memory tier held "
                "(vllm.kvOffload; empty without it).",
                (
                    Target(prefix_cache_hit_rate(VLLM, W), "hit rate"),
                    Target(offload_hit_rate(VLLM, W), "offload tier hit rate"),
                ),
                unit="percentunit",
                max=1,
            ),
            Panel(
                "KV offload traffic",
                "Bytes per second of KV blocks stored to and loaded from host memory "
                "(vllm.kvOffload, GPU only).",
                (
                    Target(agg("sum", (), rate(m.KV_OFFLOAD_STORE_BYTES, VLLM, W)), "stored"),
                    Target(agg("sum", (), rate(m.KV_OFFLOAD_LOAD_BYTES, VLLM, W)), "loaded"),
                ),
                unit="Bps",
            ),
            Panel(
                "Queue time",
                "Time requests spent waiting before their first schedule.",
                _percentiles(m.QUEUE_TIME, VLLM),
                unit="s",
            ),
            _rate_by(
                "OpenAI API responses by status",
                "HTTP responses of vLLM's /v1 endpoints.",
                m.HTTP_REQUESTS,
                POD,
                "status",
                V1_HANDLERS,
            ),
        ),
    )


def _serving_per_pod(params: AlertParams) -> Row:
    return Row(
        "Per pod",
        (
            Panel(
                "Generation tokens per second by pod",
                "Uneven bars mean uneven load balancing.",
                (Target(agg("sum", ("pod",), rate(m.GENERATION_TOKENS, VLLM, W)), "{{pod}}"),),
            ),
            Panel(
                "Time to first token p95 by pod",
                "One slow pod hides in the fleet percentile.",
                (Target(quantile(0.95, m.TTFT, VLLM, W, ("pod",)), "{{pod}}"),),
                unit="s",
                threshold=params.ttft_p95_slo_seconds,
            ),
            Panel(
                "Requests running and waiting by pod",
                "Queues per replica.",
                (
                    Target(agg("sum", ("pod",), sel(m.RUNNING, VLLM)), "running {{pod}}"),
                    Target(agg("sum", ("pod",), sel(m.WAITING, VLLM)), "waiting {{pod}}"),
                ),
            ),
        ),
    )


def _serving_lora() -> Row:
    # vllm:lora_requests_info keeps every label set it ever had, each valued at the time it
    # was last current: the series with the newest value per pod is the set running now.
    per_pod = ("namespace", "pod")
    info = sel(m.LORA_INFO, POD)
    newest = f"{info}\n== on (namespace, pod) group_left\n{agg('max', per_pod, info)}"
    return Row(
        "LoRA adapters (pods with lora.enabled)",
        (
            Panel(
                "Adapters served",
                "Per configured adapter, from the sidecar: 1 served by vLLM and warmed, 0 "
                "refused by the fetch-adapters init container (MiniStreamLoraAdapterNotLoaded).",
                (Target(agg("min", ("adapter",), sel(m.LORA_ADAPTER_LOADED, POD)), "{{adapter}}"),),
            ),
            Panel(
                "Adapters in the running batch",
                "vLLM's vllm:lora_requests_info: one line per set of adapters running (and "
                "waiting) in a pod's batch. vLLM 0.32 counts requests and latency per served "
                "model only, not per adapter: per-adapter latency is in the load test's SLO "
                "report (docs/loadtest.md).",
                (
                    Target(
                        agg(
                            "count",
                            ("pod", "running_lora_adapters", "waiting_lora_adapters"),
                            newest,
                        ),
                        "{{pod}} running [{{running_lora_adapters}}] waiting "
                        "[{{waiting_lora_adapters}}]",
                    ),
                ),
            ),
        ),
    )


def _histogram_rate(metric: m.Metric, series: str) -> str:
    """rate() of a histogram's `_count` (observations) or `_sum` (their total)."""
    assert series in ("count", "sum") and metric.kind is m.Kind.HISTOGRAM, metric.name
    return f"rate({sel(f'{metric.name}_{series}', VLLM)}[{W}])"


def _serving_pd() -> Row:
    # The decode pods observe the transfers (they pull the KV cache); the prefill pods count
    # KV that expired unfetched. A colocated release has none of these series.
    per_pod = ("pod",)
    return Row(
        "Prefill/decode KV transfers (disaggregation.enabled)",
        (
            Panel(
                "KV transfers per second",
                "NIXL transfers completed by each decode pod (vLLM's NixlConnector).",
                (
                    Target(
                        agg("sum", per_pod, _histogram_rate(m.NIXL_XFER_TIME, "count")), "{{pod}}"
                    ),
                ),
                unit="ops",
            ),
            Panel(
                "KV transfer throughput",
                "Bytes per second pulled from prefill pods, per decode pod.",
                (Target(agg("sum", per_pod, _histogram_rate(m.NIXL_BYTES, "sum")), "{{pod}}"),),
                unit="Bps",
            ),
            Panel(
                "KV transfer time",
                "Duration of one transfer, over every decode pod: a slow transport (TCP where "
                "RDMA or GPU paths were expected, docs/fleet.md) shows here first.",
                _percentiles(m.NIXL_XFER_TIME, VLLM),
                unit="s",
            ),
            Panel(
                "KV transfer failures",
                "Failed transfers per second (decode pods; MiniStreamKVTransfersFailing), "
                "requests whose KV a prefill pod released unfetched when its lease expired, and "
                "reads of such released KV (prefill pods; MiniStreamKVReadAfterLeaseExpired).",
                (
                    Target(agg("sum", per_pod, rate(m.NIXL_FAILED, VLLM, W)), "failed {{pod}}"),
                    Target(
                        agg("sum", per_pod, rate(m.NIXL_KV_EXPIRED, VLLM, W)), "expired {{pod}}"
                    ),
                    Target(
                        agg("sum", per_pod, rate(m.NIXL_LATE_READ, VLLM, W)), "read late {{pod}}"
                    ),
                ),
                unit="ops",
            ),
        ),
    )


def serving(params: AlertParams) -> Dashboard:
    latency = _serving_latency(params)
    throughput = _serving_throughput(params)
    saturation = _serving_saturation(params)
    per_pod = _serving_per_pod(params)
    return Dashboard(
        uid="ministream-serving",
        title="MiniStream / Serving",
        description="vLLM's own metrics, scraped from vLLM directly: latency, throughput, "
        "saturation. Generated by `python -m ministream_observability`; edit the "
        "generator, not this file.",
        variables=(
            Variable("namespace", "Namespace", f"label_values({m.RUNNING}, namespace)"),
            Variable(
                "model",
                "Model",
                f'label_values({m.RUNNING}{{namespace=~"$namespace"}}, model_name)',
            ),
            Variable(
                "pod",
                "Pod",
                f'label_values({m.RUNNING}{{namespace=~"$namespace", model_name=~"$model"}}, pod)',
            ),
        ),
        rows=(latency, throughput, saturation, per_pod, _serving_lora(), _serving_pd()),
        links=LINKS,
    )


# ministream_cold_start_phase_seconds: the sidecar's own phases, and vLLM's (from its startup
# log) without profiling_and_compile, which compile + profiling split.
_SIDECAR_PHASES = 'phase=~"engine_start|warmup|total"'
_VLLM_PHASES = 'phase!~"engine_start|warmup|total|profiling_and_compile"'


def _phases_panel(title: str, description: str, phases: str) -> Panel:
    """Cold-start phases per pod, those `phases` (a label matcher) selects."""
    series = agg("max", ("pod", "phase"), sel(m.COLD_START, POD, phases))
    return Panel(title, description, (Target(series, "{{phase}} {{pod}}"),), unit="s")


def _ready_replicas() -> str:
    # Ready pods that run a sidecar, per workload: one per replica for both kinds (a
    # Deployment's pods, a LeaderWorkerSet group's leader; workers run none, and a leader is
    # Ready only once vLLM serves on the group's ranks). kube_deployment_status_replicas_ready
    # has no LWS counterpart, and LWS status metrics need a kube-state-metrics custom-resource
    # configuration that is off by default; kube_pod_status_ready is a default series.
    return agg(
        "sum",
        ("namespace", "workload"),
        (
            f"label_replace({sel(m.POD_READY, NAMESPACE, READY)}, {POD_TO_WORKLOAD})\n"
            "and on (namespace, pod)\n"
            f"{sel(m.INFO, POD)}"
        ),
    )


def _fleet_replicas() -> Row:
    ready_replicas = _ready_replicas()
    return Row(
        "Replicas",
        (
            Panel(
                "Ready replicas",
                "kube-state-metrics' view (Ready serving pods per Deployment or LeaderWorkerSet: "
                "one per replica) next to the sidecars' own readiness; the difference is pods "
                "Kubernetes has not yet counted.",
                (
                    Target(ready_replicas, "{{workload}} ready (kube-state-metrics)"),
                    Target(agg("sum", (), sel(m.READY, POD)), "ready (sidecars)"),
                    Target(agg("count", (), sel(m.READY, POD)), "pods reporting"),
                    Target(agg("sum", (), sel(m.DRAINING, POD)), "draining"),
                ),
            ),
            Panel(
                "Readiness by pod",
                "1 while the sidecar's /readyz answers 200.",
                (Target(agg("max", ("pod",), sel(m.READY, POD)), "{{pod}}"),),
                max=1,
            ),
            Panel(
                "What each pod serves",
                "ministream_info: model, revision, load format, TP.",
                (
                    Target(
                        agg(
                            "max",
                            ("pod", "model", "revision", "load_format", "tensor_parallel_size"),
                            sel(m.INFO, POD),
                        ),
                        instant=True,
                    ),
                ),
                kind="table",
            ),
        ),
    )


def _fleet_cold_start() -> Row:
    return Row(
        "Cold start and warmup",
        (
            _phases_panel(
                "Cold-start phases",
                "engine_start: process start to vLLM healthy (weights "
                "loaded); warmup: healthy to warmup done; total: process start to ready. Set "
                "once per pod.",
                _SIDECAR_PHASES,
            ),
            _phases_panel(
                "vLLM start, by phase",
                "Inside engine_start, from vLLM's own log: imports, engine core start, "
                "weights, compile, profiling, CUDA-graph capture, engine finish, API server up "
                "(consecutive: they add up to vLLM's start). Set once per pod.",
                _VLLM_PHASES,
            ),
            Panel(
                "Warmup runs by outcome",
                "A failed run exhausted all its attempts; the pod "
                "stays unready (MiniStreamWarmupFailing).",
                (Target(agg("sum", ("outcome",), increase(m.WARMUP_RUNS, POD, W)), "{{outcome}}"),),
                unit="short",
            ),
            Panel(
                "Warmup requests by outcome",
                "Warmup completions per second; failures are "
                "retried with backoff until the run's attempts are used up.",
                (Target(agg("sum", ("outcome",), rate(m.WARMUP_REQUESTS, POD, W)), "{{outcome}}"),),
                unit="reqps",
            ),
            Panel(
                "Warmup request latency",
                "Latency of one warmup completion (successful or not).",
                tuple(
                    Target(quantile(q, m.WARMUP_DURATION, POD, W), f"p{round(q * 100)}")
                    for q in (0.5, 0.95)
                ),
                unit="s",
            ),
        ),
    )


def _fleet_rollout() -> Row:
    return Row(
        "Rollout and health",
        (
            Panel(
                "Drains by outcome",
                "idle: vLLM finished its requests; timeout: the drain "
                "gave up (MiniStreamDrainTimingOut).",
                (Target(agg("sum", ("outcome",), increase(m.DRAINS, POD, W)), "{{outcome}}"),),
            ),
            Panel(
                "Drain duration",
                "From going unready to vLLM idle (or the timeout).",
                tuple(
                    Target(quantile(q, m.DRAIN_DURATION, POD, W), f"p{round(q * 100)}")
                    for q in (0.5, 0.95)
                ),
                unit="s",
            ),
            Panel(
                "Container restarts",
                "kube-state-metrics; a restarting vllm container with a "
                "running sidecar is an engine crash or a failed startupProbe.",
                (
                    Target(
                        agg("sum", ("pod", "container"), increase(m.RESTARTS, POD, W)),
                        "{{pod}} {{container}}",
                    ),
                ),
            ),
            Panel(
                "vLLM health-check failures",
                "Failed /health checks of the sidecar per second; busy: failed while tokens "
                "flowed (saturated, not counted towards liveness); vLLM up is the last "
                "check's result.",
                (
                    Target(
                        agg("sum", ("pod",), rate(m.UPSTREAM_FAILURES, POD, W)),
                        "failures/s {{pod}}",
                    ),
                    Target(
                        agg("sum", ("pod",), rate(m.UPSTREAM_BUSY, POD, W)),
                        "busy/s {{pod}}",
                    ),
                    Target(agg("min", ("pod",), sel(m.UPSTREAM_UP, POD)), "up {{pod}}"),
                ),
            ),
        ),
    )


def fleet(params: AlertParams) -> Dashboard:
    replicas = _fleet_replicas()
    cold_start = _fleet_cold_start()
    rollout = _fleet_rollout()
    return Dashboard(
        uid="ministream-fleet",
        title="MiniStream / Fleet and rollout",
        description="Readiness, cold starts, warmup, drains and restarts: the sidecars' "
        "ministream_* metrics and kube-state-metrics. Generated by "
        "`python -m ministream_observability`; edit the generator, not this file.",
        variables=(
            Variable("namespace", "Namespace", f"label_values({m.INFO}, namespace)"),
            Variable("model", "Model", f'label_values({m.INFO}{{namespace=~"$namespace"}}, model)'),
            Variable(
                "pod",
                "Pod",
                f'label_values({m.INFO}{{namespace=~"$namespace", model=~"$model"}}, pod)',
            ),
        ),
        rows=(replicas, cold_start, rollout),
        links=LINKS,
    )


# The router pods: the chart's `<release>-router-...` (its router's own Prometheus port).
ROUTER = 'namespace=~"$namespace", pod=~"$router"'


def _router_traffic() -> Row:
    hits = agg("sum", (), rate(m.ROUTER_PREFIX_DECISIONS, ROUTER, W, 'outcome="prefix_hit"'))
    all_decisions = agg("sum", (), rate(m.ROUTER_PREFIX_DECISIONS, ROUTER, W))
    return Row(
        "Routing",
        (
            _rate_by(
                "Requests per replica",
                "Requests the routers sent to each serving pod (`worker` is its URL): with "
                "cache_aware an uneven split is expected while prefixes differ.",
                m.ROUTER_REQUESTS,
                ROUTER,
                "worker",
            ),
            Panel(
                "Prefix-cache routing hit rate",
                "Share of cache_aware's choices that sent a request to the replica holding its "
                "prompt's prefix (prefix_hit of all decisions); vLLM's own prefix-cache hit "
                "rate is on the Serving dashboard.",
                (Target(f"{hits}\n/\n{all_decisions}", "hit rate"),),
                unit="percentunit",
                max=1,
            ),
            _rate_by(
                "cache_aware decisions by outcome",
                "prefix_hit, prefix_miss, load_imbalance (the load was too uneven: least "
                "loaded replica), missing_tokens (no token ids to match).",
                m.ROUTER_PREFIX_DECISIONS,
                ROUTER,
                "outcome",
            ),
        ),
    )


def _router_health() -> Row:
    return Row(
        "Replica health, retries, breakers",
        (
            Panel(
                "Retries",
                "Tries again after a connection error or a 5xx (router.retries), and "
                "requests that failed after every try.",
                (
                    Target(agg("sum", ("route",), rate(m.ROUTER_RETRIES, ROUTER, W)), "{{route}}"),
                    Target(
                        agg("sum", ("route",), rate(m.ROUTER_RETRIES_EXHAUSTED, ROUTER, W)),
                        "exhausted {{route}}",
                    ),
                ),
                unit="reqps",
            ),
            Panel(
                "Circuit breaker state",
                "Per replica: 0 closed, 1 open (ejected: gets nothing until the breaker's "
                "timeout, MiniStreamRouterWorkerEjected), 2 half open (a trial request).",
                (Target(agg("max", ("worker",), sel(m.ROUTER_CB_STATE, ROUTER)), "{{worker}}"),),
                max=2,
            ),
            Panel(
                "Replica health and count",
                "The routers' /health check of each replica (1 healthy) and how many "
                "replicas each router routes to (Ready pods it discovered).",
                (
                    Target(
                        agg("min", ("worker",), sel(m.ROUTER_WORKER_HEALTH, ROUTER)),
                        "healthy {{worker}}",
                    ),
                    Target(
                        agg("max", ("pod",), sel(m.ROUTER_ACTIVE_WORKERS, ROUTER)),
                        "replicas seen by {{pod}}",
                    ),
                ),
            ),
            Panel(
                "Failed requests by error type",
                "Requests the router answered with an error, by `error_type` "
                "(no_available_workers: nothing to route to).",
                (
                    Target(
                        agg("sum", ("error_type",), rate(m.ROUTER_ERRORS, ROUTER, W)),
                        "{{error_type}}",
                    ),
                ),
                unit="reqps",
            ),
        ),
    )


def router(params: AlertParams) -> Dashboard:
    return Dashboard(
        uid="ministream-router",
        title="MiniStream / Router",
        description="vLLM's router (router.enabled): requests per replica, cache_aware's hit "
        "rate, retries, circuit breakers and the health of each replica, from the router's "
        "vllm_router_* metrics. Generated by `python -m ministream_observability`; edit the "
        "generator, not this file.",
        variables=(
            Variable(
                "namespace", "Namespace", f"label_values({m.ROUTER_ACTIVE_WORKERS}, namespace)"
            ),
            Variable(
                "router",
                "Router pod",
                f'label_values({m.ROUTER_ACTIVE_WORKERS}{{namespace=~"$namespace"}}, pod)',
            ),
        ),
        rows=(_router_traffic(), _router_health()),
        links=LINKS,
    )


def all_dashboards(params: AlertParams) -> tuple[Dashboard, ...]:
    return serving(params), fleet(params), router(params)
