"""Every metric the dashboards and alerts may use, in one table.

Names are exposition names as Prometheus stores them: counters carry `_total`, histograms are
named by their base (queries add `_bucket`, `_sum`, `_count`). Sources:

- `vllm`: vLLM 0.32's own metrics (`vllm/v1/metrics/loggers.py`; labels `model_name`,
  `engine`) and the HTTP metrics of its API server (prometheus-fastapi-instrumentator;
  labels `handler`, `method`, `status` in classes `2xx`, `4xx`, `5xx`).
- `sidecar`: the sidecar's `ministream_*` contract (docs/architecture.md §1.7,
  `ministream_sidecar/metrics.py`).
- `router`: vLLM's router, vllm-router 0.1.17 (`vllm_router_*`, its `--prometheus-port`;
  per-replica series carry `worker`, the replica's URL). Read off its own /metrics; the
  vLLM live scrape has none of them (`ROUTER_ONLY`): tests/charts/test_router_discovery.py
  checks them in a scrape of the real router.
- `cluster`: kube-state-metrics. They cannot exist in a local scrape, so they form the only
  allow-list the live-scrape test exempts (`CLUSTER_ONLY`).

In a cluster every series also carries `namespace` and `pod`, added by the ServiceMonitor or
PodMonitor (or by the usual `kubernetes_sd_configs` relabelling without the operator).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Kind(str, enum.Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


class Source(str, enum.Enum):
    VLLM = "vllm"
    SIDECAR = "sidecar"
    ROUTER = "router"
    CLUSTER = "cluster"


@dataclass(frozen=True)
class Metric:
    name: str
    kind: Kind
    source: Source
    help: str

    def __post_init__(self) -> None:
        # The mistake this project exists to prevent: a counter queried without `_total`.
        assert (self.kind is Kind.COUNTER) == self.name.endswith("_total"), self.name

    @property
    def bucket(self) -> str:
        assert self.kind is Kind.HISTOGRAM, self.name
        return f"{self.name}_bucket"

    @property
    def series_names(self) -> tuple[str, ...]:
        """The names Prometheus stores for this metric."""
        if self.kind is Kind.HISTOGRAM:
            return tuple(f"{self.name}_{s}" for s in ("bucket", "sum", "count"))
        return (self.name,)

    def __str__(self) -> str:
        return self.name


def _vllm(name: str, kind: Kind, help: str) -> Metric:
    return Metric(name, kind, Source.VLLM, help)


def _sidecar(name: str, kind: Kind, help: str) -> Metric:
    return Metric(name, kind, Source.SIDECAR, help)


def _router(name: str, kind: Kind, help: str) -> Metric:
    return Metric(name, kind, Source.ROUTER, help)


C, G, H = Kind.COUNTER, Kind.GAUGE, Kind.HISTOGRAM

# --- vLLM (engine) ----------------------------------------------------------------------------
TTFT = _vllm("vllm:time_to_first_token_seconds", H, "Time to first token.")
ITL = _vllm("vllm:inter_token_latency_seconds", H, "Time between two output tokens.")
E2E = _vllm("vllm:e2e_request_latency_seconds", H, "Arrival to last token of a request.")
QUEUE_TIME = _vllm("vllm:request_queue_time_seconds", H, "Time a request spent WAITING.")
PROMPT_TOKENS = _vllm("vllm:prompt_tokens_total", C, "Prefill tokens processed.")
GENERATION_TOKENS = _vllm("vllm:generation_tokens_total", C, "Tokens generated.")
RUNNING = _vllm("vllm:num_requests_running", G, "Requests in the running batch.")
WAITING = _vllm("vllm:num_requests_waiting", G, "Requests waiting to be scheduled.")
KV_CACHE_USAGE = _vllm("vllm:kv_cache_usage_perc", G, "KV-cache usage, 1 = 100 %.")
PREEMPTIONS = _vllm("vllm:num_preemptions_total", C, "Preemptions (KV cache ran out).")
PREFIX_QUERIES = _vllm("vllm:prefix_cache_queries_total", C, "Prefix-cache queried tokens.")
PREFIX_HITS = _vllm("vllm:prefix_cache_hits_total", C, "Prefix-cache hit tokens.")
# Prefix-cache lookups a KV connector answers: with vllm.kvOffload, the host-memory tier.
EXTERNAL_PREFIX_QUERIES = _vllm(
    "vllm:external_prefix_cache_queries_total", C, "KV-connector prefix-cache queried tokens."
)
EXTERNAL_PREFIX_HITS = _vllm(
    "vllm:external_prefix_cache_hits_total", C, "KV-connector prefix-cache hit tokens."
)
# Only with KV offload (vllm.kvOffload, GPU builds): the native offloading connector's transfer
# counters (vllm/distributed/kv_transfer/kv_connector/v1/offloading/metrics.py).
KV_OFFLOAD_LOAD_BYTES = _vllm(
    "vllm:kv_offload_load_bytes_total", C, "Bytes of KV blocks loaded from the host tier."
)
KV_OFFLOAD_STORE_BYTES = _vllm(
    "vllm:kv_offload_store_bytes_total", C, "Bytes of KV blocks stored to the host tier."
)
# Only with prefill/decode disaggregation (disaggregation.enabled): vLLM's NixlConnector
# (vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py). The decode pod, which pulls
# the KV cache, observes the transfers and their failures; the prefill pod counts the requests
# whose KV expired before a decode pod fetched it, and the reads that completed after that.
NIXL_XFER_TIME = _vllm(
    "vllm:nixl_xfer_time_seconds", H, "Duration of one NIXL KV-cache transfer (decode side)."
)
NIXL_BYTES = _vllm(
    "vllm:nixl_bytes_transferred", H, "Bytes of one NIXL KV-cache transfer (decode side)."
)
NIXL_FAILED = _vllm(
    "vllm:nixl_num_failed_transfers_total",
    C,
    "Failed NIXL KV-cache transfers, handshake and notification failures included.",
)
NIXL_KV_EXPIRED = _vllm(
    "vllm:nixl_num_kv_expired_reqs_total",
    C,
    "Requests whose KV a prefill pod released unfetched when its lease expired.",
)
NIXL_LATE_READ = _vllm(
    "vllm:nixl_num_notifications_after_expiry_total",
    C,
    "Notices a prefill pod got from decode pods about KV it had already released (lease "
    "expired): mostly late reads, whose answers may come from blocks reused by others.",
)
REQUEST_SUCCESS = _vllm(
    "vllm:request_success_total",
    C,
    "Finished requests by `finished_reason` (stop, length, abort, error, repetition).",
)
# --- vLLM (HTTP server) -----------------------------------------------------------------------
# Only with --enable-lora (chart: lora.enabled). An info gauge: its value is the time of the
# last scheduler step, its labels the adapters then running and waiting (comma-joined) and
# max_lora. vLLM 0.32 has no per-adapter request or latency series: every request metric
# carries the base model's model_name, whichever adapter served it.
LORA_INFO = _vllm(
    "vllm:lora_requests_info",
    G,
    "LoRA adapters running and waiting (labels running_lora_adapters, waiting_lora_adapters).",
)
HTTP_REQUESTS = _vllm(
    "http_requests_total", C, "HTTP requests of vLLM's API server by handler and status class."
)

# --- sidecar ----------------------------------------------------------------------------------
READY = _sidecar("ministream_ready", G, "1 while /readyz answers 200.")
DRAINING = _sidecar("ministream_draining", G, "1 from the first moment of a drain.")
UPSTREAM_UP = _sidecar("ministream_upstream_up", G, "1 when the last vLLM /health passed.")
COLD_START = _sidecar(
    "ministream_cold_start_phase_seconds",
    G,
    "Cold-start phase durations, `phase` = engine_start | warmup | total (the sidecar's "
    "clock), imports | engine_core_start | weights | profiling_and_compile | compile | "
    "profiling | graph_capture | engine_finish | api_server_up (vLLM's startup log); absent "
    "until done.",
)
WARMUP_REQUESTS = _sidecar(
    "ministream_warmup_requests_total", C, "Warmup completions by `outcome`."
)
WARMUP_DURATION = _sidecar(
    "ministream_warmup_request_duration_seconds", H, "Latency of one warmup completion."
)
WARMUP_RUNS = _sidecar("ministream_warmup_runs_total", C, "Warmup runs by `outcome`.")
DRAIN_DURATION = _sidecar("ministream_drain_duration_seconds", H, "Duration of a drain.")
DRAINS = _sidecar("ministream_drains_total", C, "Drains by `outcome` (idle | timeout | never_up).")
UPSTREAM_FAILURES = _sidecar(
    "ministream_upstream_health_failures_total", C, "Failed vLLM /health checks."
)
UPSTREAM_BUSY = _sidecar(
    "ministream_upstream_busy_checks_total",
    C,
    "Failed vLLM /health checks while its token counters grew (busy, not counted).",
)
INFO = _sidecar(
    "ministream_info", G, "Constant 1: model, revision, load_format, tensor_parallel_size."
)

LORA_ADAPTER_LOADED = _sidecar(
    "ministream_lora_adapter_loaded",
    G,
    "Per configured LoRA adapter (`adapter`): 1 served and warmed, 0 not served by vLLM.",
)

# --- vLLM's router (vllm-router 0.1.17) ----------------------------------------------------
ROUTER_REQUESTS = _router(
    "vllm_router_processed_requests_total", C, "Requests the router sent to each `worker`."
)
ROUTER_PREFIX_DECISIONS = _router(
    "vllm_router_prefix_routing_decisions_total",
    C,
    "cache_aware's choices by `outcome`: prefix_hit, prefix_miss, load_imbalance (the least "
    "loaded replica instead), missing_tokens (no token ids to match).",
)
ROUTER_RETRIES = _router("vllm_router_retries_total", C, "Retries of a request, by `route`.")
ROUTER_RETRIES_EXHAUSTED = _router(
    "vllm_router_retries_exhausted_total", C, "Requests that failed after every try."
)
ROUTER_ERRORS = _router(
    "vllm_router_request_errors_total", C, "Failed requests by `route` and `error_type`."
)
ROUTER_CB_STATE = _router(
    "vllm_router_cb_state", G, "Circuit breaker per `worker`: 0 closed, 1 open, 2 half open."
)
ROUTER_CB_TRANSITIONS = _router(
    "vllm_router_cb_state_transitions_total", C, "Breaker transitions by `worker`, `from`, `to`."
)
ROUTER_WORKER_HEALTH = _router(
    "vllm_router_worker_health", G, "The router's health check of `worker`: 1 healthy, 0 not."
)
ROUTER_ACTIVE_WORKERS = _router(
    "vllm_router_active_workers", G, "Replicas the router currently routes to."
)

# --- cluster-only (kube-state-metrics) --------------------------------------------------------
RESTARTS = Metric(
    "kube_pod_container_status_restarts_total", C, Source.CLUSTER, "Container restarts."
)
POD_READY = Metric(
    "kube_pod_status_ready", G, Source.CLUSTER, "A pod's Ready condition (1 on its current one)."
)
# A rollout's progress, per workload kind: a Deployment's own verdict (Progressing=False once
# progressDeadlineSeconds passed without progress), and a LeaderWorkerSet's leader StatefulSet
# (same name as the LeaderWorkerSet), which rolls whole groups and has no progress deadline.
DEPLOYMENT_CONDITION = Metric(
    "kube_deployment_status_condition",
    G,
    Source.CLUSTER,
    "Deployment conditions by `condition` and `status` (true | false | unknown).",
)
STS_CURRENT_REVISION = Metric(
    "kube_statefulset_status_current_revision",
    G,
    Source.CLUSTER,
    "The StatefulSet revision its pods run (`revision`).",
)
STS_UPDATE_REVISION = Metric(
    "kube_statefulset_status_update_revision",
    G,
    Source.CLUSTER,
    "The StatefulSet revision being rolled out (`revision`).",
)
STS_REPLICAS = Metric("kube_statefulset_replicas", G, Source.CLUSTER, "Desired StatefulSet pods.")
STS_UPDATED = Metric(
    "kube_statefulset_status_replicas_updated",
    G,
    Source.CLUSTER,
    "StatefulSet pods at the update revision.",
)

ALL: tuple[Metric, ...] = tuple(v for v in dict(globals()).values() if isinstance(v, Metric))

# The only names the live-scrape test may not find: nothing but kube-state-metrics, which runs
# in a cluster, never next to a local vLLM.
CLUSTER_ONLY: frozenset[str] = frozenset(
    n for m in ALL if m.source is Source.CLUSTER for n in m.series_names
)

# Names only a pod serving LoRA adapters exports (tests/observability/test_lora_live.py).
LORA_ONLY: frozenset[str] = frozenset(
    n for m in (LORA_INFO, LORA_ADAPTER_LOADED) for n in m.series_names
)

# Names only a GPU pod with KV offload exports: vLLM's CPU build cannot offload, so no live
# scrape here has them; tests/observability/test_kv_offload_names.py finds them in the H200
# run's recorded counters instead.
OFFLOAD_ONLY: frozenset[str] = frozenset(
    n for m in (KV_OFFLOAD_LOAD_BYTES, KV_OFFLOAD_STORE_BYTES) for n in m.series_names
)

# Names only a P/D replica (NixlConnector) exports: tests/pd/test_pd_live.py finds them in the
# real decode and prefill replicas' scrapes.
PD_ONLY: frozenset[str] = frozenset(
    n
    for m in (NIXL_XFER_TIME, NIXL_BYTES, NIXL_FAILED, NIXL_KV_EXPIRED, NIXL_LATE_READ)
    for n in m.series_names
)

# The router's names: absent from the vLLM live scrape, checked in the router's own.
ROUTER_ONLY: frozenset[str] = frozenset(
    n for m in ALL if m.source is Source.ROUTER for n in m.series_names
)

KNOWN_SERIES: frozenset[str] = frozenset(n for m in ALL for n in m.series_names)
