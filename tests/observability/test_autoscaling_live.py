"""The chart's autoscaling signal and the inference gateway's metrics, against the live stack:
the session's real vLLM (CPU) scraped every 2 s by a real Prometheus (conftest.py).

The autoscaling query is taken verbatim from the ScaledObject that `helm template` renders for
release `ms` in namespace `ministream-test`: the scrape config labels the live vLLM with that
namespace and a Deployment-style pod name of that release (promkit.NAMESPACE, promkit.POD), so
the chart's release selector matches it unchanged. The threshold is a value
(`autoscaling.target.requestsPerReplica`); it is set to 4 here, below what the load keeps in
flight, because a tiny model on two CPU cores saturates at fewer requests than a GPU pod.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from promkit import NAMESPACE, POD, ROOT, PrometheusServer

from ministream_observability.autoscaling import ADAPTER_MATCHERS, SIGNALS
from ministream_testkit.helm import render
from ministream_testkit.load import BusyEngine
from ministream_testkit.vllm_server import metrics_text, request_counts
from ministream_testkit.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.network]

CHART = ROOT / "charts" / "ministream"
THRESHOLD = 4
IN_FLIGHT = 8  # concurrent clients of the load, twice the threshold
# The metrics the upstream endpoint picker scores pods on with its default "vllm" engine
# config: kubernetes-sigs/gateway-api-inference-extension v1.5.0 (the last release shipping
# the picker before it moved to llm-d/llm-d-router),
# pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go (defaultEngineConfigs)
# and pkg/epp/server/options.go (the same names as flag defaults).
PICKER_GAUGES = {
    "vllm:num_requests_waiting": "queue length",
    "vllm:num_requests_running": "running batch",
    "vllm:kv_cache_usage_perc": "KV-cache usage",
}
PICKER_CACHE_INFO = ("vllm:cache_config_info", ("block_size", "num_gpu_blocks"))
PICKER_LORA_INFO = "vllm:lora_requests_info"


def _render(**sets: Any) -> list[dict[str, Any]]:
    """The fleet scenario with the threshold above and `sets` (dots in keys via `__`)."""
    values = {"autoscaling.target.requestsPerReplica": THRESHOLD}
    values |= {key.replace("__", "."): value for key, value in sets.items()}
    return render(CHART, [CHART / "ci" / "fleet-values.yaml"], values, namespace=NAMESPACE)


@pytest.fixture(scope="module")
def trigger() -> dict[str, Any]:
    """The requests-per-replica trigger of the rendered ScaledObject."""
    (so,) = [d for d in _render() if d["kind"] == "ScaledObject"]
    (t,) = [t for t in so["spec"]["triggers"] if t.get("name") == "requests-per-replica"]
    assert float(t["metadata"]["threshold"]) == THRESHOLD and t["metricType"] == "Value"
    return t


def _keda_series(result: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The one series of a query result, as KEDA's Prometheus scaler requires (kedacore/keda
    v2.20.2 pkg/scalers/prometheus_scaler.go: "returned multiple elements"); None: no data."""
    assert len(result) <= 1, result
    return result[0] if result else None


def _value(prom: PrometheusServer, query: str) -> float | None:
    """The query's value as KEDA's Prometheus scaler reads it."""
    series = _keda_series(prom.query(query))
    return None if series is None else float(series["value"][1])


def _adapter_query(signal_index: int) -> str:
    """The HPA path: prometheus-adapter's per-pod query for the HPA's pods, with the label
    matchers it substitutes for <<.LabelMatchers>> (namespace, then the pods as a regex)."""
    matchers = f'namespace="{NAMESPACE}",pod=~"{POD}"'
    return SIGNALS[signal_index].per_pod(ADAPTER_MATCHERS).replace(ADAPTER_MATCHERS, matchers)


def test_autoscaling_query_crosses_the_threshold_under_load_and_falls_back_idle(
    vllm_server: Any, prometheus: PrometheusServer, trigger: dict[str, Any], record_property: Any
) -> None:
    query = trigger["metadata"]["query"]
    assert f'namespace="{NAMESPACE}"' in query  # scoped to the release, as rendered
    prom = prometheus

    def idle_value() -> float:
        """The signal from a scrape taken after vLLM reported nothing running or waiting."""
        wait_until(lambda: request_counts(vllm_server.url).idle, 300, 0.2, what="vLLM idle")
        idle_since = time.time()
        scraped = f'timestamp(vllm:num_requests_running{{namespace="{NAMESPACE}"}}) > {idle_since}'
        prom.wait_for(scraped, 30, "a scrape of the idle engine")
        value = _value(prom, query)
        assert value is not None, f"no data: {query}"
        return value

    idle_before = idle_value()

    busy: list[float] = []
    with BusyEngine(vllm_server, IN_FLIGHT, stream=False) as load:
        loaded = time.time()

        def above() -> bool:
            """Whether the query, evaluated at every second of the load so far, has been above
            the threshold. Each evaluation reads the latest scrape, as a KEDA poll at that
            instant would. Single instant queries missed it: on two cores one took up to 27 s
            to answer, and a wait of 190 s read 22 instants, 15 of them 0."""
            load.check()
            series = _keda_series(prom.query_range(query, loaded, time.time(), 1))
            busy[:] = [float(v) for _, v in series["values"]] if series else []
            return any(v > THRESHOLD for v in busy)

        wait_until(
            above,
            180,
            2,
            what=f"the signal above {THRESHOLD} under load",
            detail=lambda: f"values read since the load began: {sorted(set(busy))}",
        )
        crossed_after = time.time() - loaded
        counts = request_counts(vllm_server.url)

        # The HPA engine's path reads the same signal: the per-pod metric prometheus-adapter
        # serves, averaged over the pods by the HPA, is the KEDA query's value.
        # Both are evaluated at one instant with data: a scrape that timed out on the busy
        # machine leaves a stale gap, so an instant is retried until both read a sample.
        def at_one_instant() -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
            at = time.time() - 1
            keda, adapter = prom.query(query, at=at), prom.query(_adapter_query(0), at=at)
            return (keda, adapter) if keda and adapter else None

        keda, adapter = wait_until(at_one_instant, 30, 0.5, what="both forms of the signal")
        keda_at = float(keda[0]["value"][1])
        per_pod = [float(r["value"][1]) for r in adapter]
        assert sum(per_pod) / len(per_pod) == pytest.approx(keda_at)
    peak = max(busy)

    idle_after = idle_value()
    record_property("requests_per_replica_idle_before", idle_before)
    record_property("requests_per_replica_busy_peak", peak)
    record_property("requests_per_replica_idle_after", idle_after)
    record_property("seconds_to_cross", round(crossed_after, 1))
    print(
        f"\nrequests per replica: idle {idle_before:g}, busy peak {peak:g} "
        f"(threshold {THRESHOLD}, {IN_FLIGHT} clients; vLLM then had {counts.running} running, "
        f"{counts.waiting} waiting), idle again {idle_after:g}; above the threshold "
        f"{crossed_after:.0f} s into the load, at {sum(v > THRESHOLD for v in busy)} of "
        f"{len(busy)} instants"
    )
    assert idle_before < THRESHOLD < peak and idle_after < THRESHOLD
    assert idle_before == idle_after == 0


def test_kv_cache_signal_runs_on_the_live_scrape(
    vllm_server: Any, prometheus: PrometheusServer
) -> None:
    """The second signal returns one sample in [0, 1], and its adapter form agrees."""
    (so,) = [
        d for d in _render(autoscaling__target__kvCacheUsage=0.8) if d["kind"] == "ScaledObject"
    ]
    (t,) = [t for t in so["spec"]["triggers"] if t.get("name") == "kv-cache-usage"]
    query = t["metadata"]["query"]
    wait_until(lambda: _value(prometheus, query) is not None, 60, 0.5, what="the KV-cache signal")
    value = _value(prometheus, query)
    assert value is not None
    assert 0 <= value <= 1
    per_pod = [float(r["value"][1]) for r in prometheus.query(_adapter_query(1))]
    assert len(per_pod) == 1 and 0 <= per_pod[0] <= 1


def test_endpoint_picker_metrics_exist_in_a_live_vllm_scrape(vllm_server: Any) -> None:
    """Every metric the endpoint picker scores on is in vLLM 0.32's own /metrics, as a gauge.

    `vllm:lora_requests_info` is not: vLLM creates it only with LoRA enabled, and MiniStream
    serves no adapters (MiniStreamForCausalLM does not implement SupportsLoRA; the chart passes
    no --enable-lora). The picker tolerates that: a missing LoRA family is a partial metrics
    update, not a failure (v1.5.0 pkg/epp/backend/metrics/pod_metrics.go, "Optimistically
    update metrics even if there was an error"), so it scores on queue and KV cache alone."""
    families = {f.name: f for f in text_string_to_metric_families(metrics_text(vllm_server.url))}
    for name, what in PICKER_GAUGES.items():
        assert name in families, f"{name} ({what}) missing from vLLM's /metrics"
        assert families[name].type == "gauge", (name, families[name].type)
        assert families[name].samples, name
    name, labels = PICKER_CACHE_INFO
    (sample, *_) = families[name].samples
    for label in labels:
        assert int(sample.labels[label]) > 0, (name, label, sample.labels)
    assert PICKER_LORA_INFO not in families
