"""Kubernetes Events. No API server runs on these machines, so a stub stands in for the
official client's CoreV1Api (only `create_namespaced_event`); the request bodies are the
client's real model objects."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from ministream_sidecar.events import (
    EventReason,
    EventType,
    KubernetesEventRecorder,
    NullEventRecorder,
    build_event_recorder,
)
from ministream_sidecar.metrics import SidecarMetrics
from ministream_sidecar.settings import SidecarSettings


class StubCoreApi:
    def __init__(self, fail_with: Exception | None = None) -> None:
        self.fail_with = fail_with
        self.created: list[tuple[str, Any]] = []

    def create_namespaced_event(self, namespace: str, body: Any, **kwargs: Any) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        self.created.append((namespace, body))


def emit_once(api: StubCoreApi, metrics: SidecarMetrics) -> None:
    async def go() -> None:
        recorder = KubernetesEventRecorder(
            api, pod_name="ms-0", namespace="serving", pod_uid="uid-1", metrics=metrics
        )
        recorder.emit(EventReason.WARMUP_FAILED, "boom", EventType.WARNING)
        await recorder.aclose()

    asyncio.run(go())


def test_event_names_the_pod() -> None:
    api, metrics = StubCoreApi(), SidecarMetrics()
    emit_once(api, metrics)
    namespace, body = api.created[0]
    assert namespace == "serving"
    assert (body.involved_object.kind, body.involved_object.name) == ("Pod", "ms-0")
    assert body.involved_object.uid == "uid-1"
    assert (body.reason, body.type, body.message) == ("WarmupFailed", "Warning", "boom")
    assert body.metadata.generate_name == "ms-0."
    assert metrics.kubernetes_events.labels("success")._value.get() == 1


def test_rbac_refusal_is_logged_and_counted_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    api = StubCoreApi(fail_with=ApiException(status=403, reason="Forbidden"))
    metrics = SidecarMetrics()
    emit_once(api, metrics)
    assert metrics.kubernetes_events.labels("failure")._value.get() == 1
    assert any("could not create Kubernetes event" in r.getMessage() for r in caplog.records)


def test_events_only_in_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes import config

    def no_service_account() -> None:
        raise config.ConfigException("Service token file does not exist.")

    monkeypatch.setattr(config, "load_incluster_config", no_service_account)
    metrics = SidecarMetrics()
    outside = SidecarSettings(pod_name="ms-0", pod_namespace="serving")
    assert isinstance(build_event_recorder(outside, metrics), NullEventRecorder)
    # In a cluster but without a service-account token: disabled with a warning, no crash.
    inside = SidecarSettings(
        pod_name="ms-0", pod_namespace="serving", kubernetes_service_host="10.0.0.1"
    )
    assert inside.in_kubernetes
    assert isinstance(build_event_recorder(inside, metrics), NullEventRecorder)
