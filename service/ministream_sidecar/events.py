"""Kubernetes Events on our pod (warmup finished/failed, drain started/finished).

Only in a cluster (KUBERNETES_SERVICE_HOST set) and only when the downward API gave us
POD_NAME and POD_NAMESPACE; the official `kubernetes` client is imported lazily then, with
in-cluster config. The RBAC it needs is `create` on `events` in the pod's namespace. An
event that cannot be created (RBAC refusal, API down) is logged and counted in
`ministream_kubernetes_events_total{outcome="failure"}`; it never fails the sidecar.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import socket
from datetime import datetime, timezone
from typing import Any, Protocol

from .metrics import Outcome, SidecarMetrics
from .settings import SidecarSettings

log = logging.getLogger(__name__)

COMPONENT = "ministream-sidecar"
_API_TIMEOUT_SECONDS = 5.0


class EventType(str, enum.Enum):
    NORMAL = "Normal"
    WARNING = "Warning"


class EventReason(str, enum.Enum):
    WARMUP_SUCCEEDED = "WarmupSucceeded"
    WARMUP_FAILED = "WarmupFailed"
    DRAIN_STARTED = "DrainStarted"
    DRAIN_FINISHED = "DrainFinished"
    DRAIN_TIMED_OUT = "DrainTimedOut"


class EventRecorder(Protocol):
    def emit(self, reason: EventReason, message: str, type_: EventType = EventType.NORMAL) -> None:
        """Record an event in the background; never raises, never blocks the caller."""

    async def aclose(self) -> None:
        """Wait (briefly) for events still being sent."""


class NullEventRecorder:
    """Outside a cluster: events go to the log only."""

    def emit(self, reason: EventReason, message: str, type_: EventType = EventType.NORMAL) -> None:
        log.info(
            "event",
            extra={"reason": reason.value, "event_type": type_.value, "event_message": message},
        )

    async def aclose(self) -> None:
        return None


class KubernetesEventRecorder:
    """Creates core/v1 Events whose involvedObject is our pod."""

    def __init__(
        self,
        core_api: Any,
        *,
        pod_name: str,
        namespace: str,
        pod_uid: str | None,
        metrics: SidecarMetrics,
    ) -> None:
        self._api = core_api
        self._pod_name = pod_name
        self._namespace = namespace
        self._pod_uid = pod_uid
        self._metrics = metrics
        self._pending: set[asyncio.Task[None]] = set()

    def emit(self, reason: EventReason, message: str, type_: EventType = EventType.NORMAL) -> None:
        log.info(
            "event",
            extra={"reason": reason.value, "event_type": type_.value, "event_message": message},
        )
        task = asyncio.get_running_loop().create_task(self._send(reason, message, type_))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def aclose(self) -> None:
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=_API_TIMEOUT_SECONDS)

    async def _send(self, reason: EventReason, message: str, type_: EventType) -> None:
        try:
            await asyncio.to_thread(self._create, reason, message, type_)
        except Exception as exc:  # RBAC refusal, API down, client bug: log, count, carry on
            self._metrics.kubernetes_events.labels(Outcome.FAILURE.value).inc()
            log.warning(
                "could not create Kubernetes event",
                extra={"reason": reason.value, "error": _describe(exc)},
            )
        else:
            self._metrics.kubernetes_events.labels(Outcome.SUCCESS.value).inc()

    def _create(self, reason: EventReason, message: str, type_: EventType) -> None:
        from kubernetes import client  # only in a cluster: keeps startup light elsewhere

        now = datetime.now(timezone.utc)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{self._pod_name}."),
            involved_object=client.V1ObjectReference(
                api_version="v1",
                kind="Pod",
                name=self._pod_name,
                namespace=self._namespace,
                uid=self._pod_uid,
            ),
            reason=reason.value,
            message=message[:1024],
            type=type_.value,
            source=client.V1EventSource(component=COMPONENT, host=socket.gethostname()),
            reporting_component=COMPONENT,
            reporting_instance=self._pod_name,
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        self._api.create_namespaced_event(
            self._namespace, body, _request_timeout=_API_TIMEOUT_SECONDS
        )


def build_event_recorder(settings: SidecarSettings, metrics: SidecarMetrics) -> EventRecorder:
    """A Kubernetes recorder in a cluster, else a log-only one. Never raises."""
    if not settings.in_kubernetes:
        return NullEventRecorder()
    assert settings.pod_name is not None and settings.pod_namespace is not None
    try:
        from kubernetes import client, config

        config.load_incluster_config()
        core_api = client.CoreV1Api()
    except Exception as exc:  # no service account token mounted, bad config
        log.warning("Kubernetes events disabled", extra={"error": _describe(exc)})
        return NullEventRecorder()
    return KubernetesEventRecorder(
        core_api,
        pod_name=settings.pod_name,
        namespace=settings.pod_namespace,
        pod_uid=settings.pod_uid,
        metrics=metrics,
    )


def _describe(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None)
    if status is not None:
        return f"{type(exc).__name__} {status} {reason or ''}".strip()
    return repr(exc)
