"""The exposition parses (prometheus_client's own parser) and carries the documented names.

Runs against `FakeVLLM`: the names and types are the sidecar's; test_sidecar_vllm.py checks
the values after warmups and drains against the real engine."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sidecarkit import FakeVLLM, SidecarFactory

from ministream_testkit.waiting import wait_until

# Each test runs the sidecar under uvicorn on a loopback port.
pytestmark = pytest.mark.network

# The contract (docs/architecture.md §1.7): dashboards and alerts rely on them.
DOCUMENTED = {
    "ministream_ready": "gauge",
    "ministream_draining": "gauge",
    "ministream_upstream_up": "gauge",
    "ministream_cold_start_phase_seconds": "gauge",
    "ministream_warmup_requests": "counter",
    "ministream_warmup_request_duration_seconds": "histogram",
    "ministream_warmup_runs": "counter",
    "ministream_drain_duration_seconds": "histogram",
    "ministream_drains": "counter",
    "ministream_upstream_health_failures": "counter",
    "ministream_upstream_busy_checks": "counter",
    "ministream_info": "gauge",
    "ministream_prefetch_bytes": "gauge",
    "ministream_prefetch_seconds": "gauge",
}


def test_exposition_parses_and_carries_the_documented_names(
    start_sidecar: SidecarFactory,
) -> None:
    fake = FakeVLLM(model="tiny")
    sidecar = start_sidecar(
        app_kwargs={"transport": fake.transport()},
        vllm_url="http://fake-vllm:8000",
        info_revision="abc123",
        info_load_format="runai_streamer",
        info_tensor_parallel_size=2,
    )
    wait_until(sidecar.ready, 10, what="ready")
    response = sidecar.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    for name, kind in DOCUMENTED.items():
        assert name in families, name
        assert families[name].type == kind, name
    assert all(name.startswith("ministream_") for name in families)  # no vllm:* copied
    sample_names = {s.name for f in families.values() for s in f.samples}
    for name in (
        "ministream_warmup_requests_total",
        "ministream_warmup_runs_total",
        "ministream_drains_total",
        "ministream_upstream_health_failures_total",
        "ministream_upstream_busy_checks_total",
    ):
        assert name in sample_names
    phases = {
        s.labels["phase"]: s.value for s in families["ministream_cold_start_phase_seconds"].samples
    }
    assert set(phases) == {"engine_start", "warmup", "total"}
    assert phases["total"] >= phases["warmup"] > 0
    [info] = families["ministream_info"].samples
    assert info.value == 1
    assert info.labels == {
        "model": "tiny",
        "revision": "abc123",
        "load_format": "runai_streamer",
        "tensor_parallel_size": "2",
    }
    outcomes = {(s.name, s.labels.get("outcome")) for s in families["ministream_drains"].samples}
    assert ("ministream_drains_total", "idle") in outcomes
    assert ("ministream_drains_total", "timeout") in outcomes
