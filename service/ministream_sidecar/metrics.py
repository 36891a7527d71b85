"""The sidecar's own Prometheus metrics, in their own registry (never the global one).

Names are a contract (docs/architecture.md §1.7: dashboards and alerts rely on them). vLLM's
`vllm:*` metrics are scraped from vLLM directly and never copied here.
"""

from __future__ import annotations

import enum

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest


class Outcome(str, enum.Enum):
    SUCCESS = "success"
    FAILURE = "failure"


class ColdStartPhase(str, enum.Enum):
    """Cold-start phases, each measured once, at the first cold start of the pod.

    The sidecar's own: engine_start, warmup, total. Inside vLLM's start, from its startup
    log (ministream/startup_log.py; startup_phases.py defines each, with the markers): imports ...
    api_server_up, consecutive, so they add up to vLLM's start; compile and profiling
    split profiling_and_compile."""

    ENGINE_START = "engine_start"  # process start -> vLLM /health first OK
    WARMUP = "warmup"  # vLLM /health first OK -> first successful warmup
    TOTAL = "total"  # process start -> first ready
    IMPORTS = "imports"
    ENGINE_CORE_START = "engine_core_start"
    WEIGHTS = "weights"
    PROFILING_AND_COMPILE = "profiling_and_compile"
    COMPILE = "compile"
    PROFILING = "profiling"
    GRAPH_CAPTURE = "graph_capture"
    ENGINE_FINISH = "engine_finish"
    API_SERVER_UP = "api_server_up"


class DrainOutcome(str, enum.Enum):
    IDLE = "idle"  # vLLM reported no running and no waiting requests
    TIMEOUT = "timeout"  # DRAIN_TIMEOUT_SECONDS passed first
    # vLLM never answered its health check and its metrics cannot be read: the pod was never
    # ready, so no request can be inside it (a release whose engine never starts).
    NEVER_UP = "never_up"


# Warmup requests on CPU take 0.05-5 s; on GPUs 10 ms-1 s. Drains last up to the timeout.
_REQUEST_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_DRAIN_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)

INFO_LABELS = ("model", "revision", "load_format", "tensor_parallel_size")


class SidecarMetrics:
    """All `ministream_*` metric objects, bound to one private registry.

    Created concern by concern, in the order the exposition lists them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._add_state()
        self._add_cold_start()
        self._add_drain()
        self._add_upstream_checks()
        self._add_pod_facts()
        # Create every labelled child up front: a series that exists at 0 lets `rate()` and
        # alerts see the first increment, and the exposition always carries every name.
        for outcome in Outcome:
            self.warmup_requests.labels(outcome.value)
            self.warmup_runs.labels(outcome.value)
            self.kubernetes_events.labels(outcome.value)
        for drain_outcome in DrainOutcome:
            self.drains.labels(drain_outcome.value)

    def _add_state(self) -> None:
        r = self.registry
        self.ready = Gauge("ministream_ready", "1 when /readyz answers 200, else 0.", registry=r)
        self.draining = Gauge(
            "ministream_draining", "1 from the first moment of a drain.", registry=r
        )
        self.upstream_up = Gauge(
            "ministream_upstream_up", "1 when the last vLLM /health check passed.", registry=r
        )

    def _add_cold_start(self) -> None:
        """The cold start's phases, and the warmup that ends it."""
        r = self.registry
        self.cold_start_phase_seconds = Gauge(
            "ministream_cold_start_phase_seconds",
            "Duration of each cold-start phase: engine_start (process start to vLLM healthy), "
            "warmup (healthy to warmup done), total (process start to ready); and, from vLLM's "
            "startup log, imports, engine_core_start, weights, profiling_and_compile (= "
            "compile + profiling), graph_capture, engine_finish, api_server_up.",
            ["phase"],
            registry=r,
        )
        self.warmup_requests = Counter(
            "ministream_warmup_requests",
            "Warmup completions sent to vLLM, by outcome.",
            ["outcome"],
            registry=r,
        )
        self.warmup_request_duration_seconds = Histogram(
            "ministream_warmup_request_duration_seconds",
            "Latency of one warmup completion (successful or not).",
            buckets=_REQUEST_BUCKETS,
            registry=r,
        )
        self.warmup_runs = Counter(
            "ministream_warmup_runs",
            "Warmup runs (each up to WARMUP_MAX_ATTEMPTS attempts), by outcome.",
            ["outcome"],
            registry=r,
        )

    def _add_drain(self) -> None:
        r = self.registry
        self.drain_duration_seconds = Histogram(
            "ministream_drain_duration_seconds",
            "Time from the start of a drain until vLLM was idle or the timeout passed.",
            buckets=_DRAIN_BUCKETS,
            registry=r,
        )
        self.drains = Counter(
            "ministream_drains", "Drains, by outcome (idle or timeout).", ["outcome"], registry=r
        )

    def _add_upstream_checks(self) -> None:
        """vLLM /health checks that failed."""
        r = self.registry
        self.upstream_health_failures = Counter(
            "ministream_upstream_health_failures",
            "Failed vLLM /health checks (background loop and /readyz).",
            registry=r,
        )
        self.upstream_busy_checks = Counter(
            "ministream_upstream_busy_checks",
            "Failed vLLM /health checks during which its token counters grew: busy, not hung; "
            "they count towards neither liveness nor readiness.",
            registry=r,
        )

    def _add_pod_facts(self) -> None:
        """What the pod serves, the Events it reported and its page-cache prefetch."""
        r = self.registry
        self.info = Gauge(
            "ministream_info",
            "Constant 1, labelled with what this pod serves.",
            list(INFO_LABELS),
            registry=r,
        )
        self.lora_adapter_loaded = Gauge(
            "ministream_lora_adapter_loaded",
            "Per configured LoRA adapter: 1 when vLLM lists it and it answered warmup, 0 when "
            "vLLM does not list it (refused when fetched or failed to load).",
            ["adapter"],
            registry=r,
        )
        self.kubernetes_events = Counter(
            "ministream_kubernetes_events",
            "Kubernetes Events the sidecar tried to create, by outcome.",
            ["outcome"],
            registry=r,
        )
        self.prefetch_bytes = Gauge(
            "ministream_prefetch_bytes",
            "Bytes of the model and the compile cache read into the page cache at the "
            "sidecar's start, while vLLM imports (0 until the read is done, or when off).",
            registry=r,
        )
        self.prefetch_seconds = Gauge(
            "ministream_prefetch_seconds",
            "Duration of that read (0 until it is done, or when off).",
            registry=r,
        )

    def set_info(
        self, *, model: str, revision: str, load_format: str, tensor_parallel_size: int
    ) -> None:
        """Replace the single info series (the model name may only be known later)."""
        self.info.clear()
        self.info.labels(model, revision, load_format, str(tensor_parallel_size)).set(1)

    def set_phase(self, phase: ColdStartPhase, seconds: float) -> None:
        self.cold_start_phase_seconds.labels(phase.value).set(max(0.0, seconds))

    def render(self) -> tuple[bytes, str]:
        """Prometheus text exposition and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
