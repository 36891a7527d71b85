"""Kubernetes Events on our pod (warmup finished/failed, drain started/finished).

Only in a cluster (KUBERNETES_SERVICE_HOST set) and only when the downward API gave us
POD_NAME and POD_NAMESPACE. Each event is one `POST /api/v1/namespaces/{ns}/events` to the
API server, made with httpx (already the sidecar's HTTP client) and the pod's projected
service-account credentials, as in-cluster clients do: the API server at
`https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`, verified against
`ca.crt`, with the bearer token in `token`, both under
/var/run/secrets/kubernetes.io/serviceaccount (the chart's `kube-api-access` volume). The
token file is read again for every event: projected tokens are rotated by the kubelet.
The official `kubernetes` client did the same for 126 MB of the sidecar image (docs/images.md).

The RBAC it needs is `create` on `events` in the pod's namespace. An event that cannot be
created (RBAC refusal, API down) is logged and counted in
`ministream_kubernetes_events_total{outcome="failure"}`; it never fails the sidecar.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

import httpx

from .metrics import Outcome, SidecarMetrics
from .settings import SidecarSettings

log = logging.getLogger(__name__)

COMPONENT = "ministream-sidecar"
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_API_TIMEOUT_SECONDS = 5.0
_MESSAGE_LIMIT = 1024


class EventType(str, enum.Enum):
    NORMAL = "Normal"
    WARNING = "Warning"


class EventReason(str, enum.Enum):
    WARMUP_SUCCEEDED = "WarmupSucceeded"
    WARMUP_FAILED = "WarmupFailed"
    DRAIN_STARTED = "DrainStarted"
    DRAIN_FINISHED = "DrainFinished"
    DRAIN_TIMED_OUT = "DrainTimedOut"
    ADAPTER_NOT_LOADED = "LoraAdapterNotLoaded"


class EventRecorder(Protocol):
    def emit(self, reason: EventReason, message: str, type_: EventType = EventType.NORMAL) -> None:
        """Record an event in the background; never raises, never blocks the caller."""

    async def aclose(self) -> None:
        """Wait (briefly) for events still being sent."""


class NullEventRecorder:
    """Outside a cluster: events go to the log only."""

    def emit(self, reason: EventReason, message: str, type_: EventType = EventType.NORMAL) -> None:
        _log_event(reason, message, type_)

    async def aclose(self) -> None:
        return None


class InClusterConfigError(Exception):
    """The pod has no usable service-account credentials or API server address."""


@dataclass(frozen=True)
class InClusterConfig:
    """Where the API server is and the pod's credentials for it (what client-go's and the
    official Python client's in-cluster config read)."""

    api_url: str
    token_file: Path
    ca_file: Path

    @classmethod
    def load(
        cls,
        service_host: str,
        env: Mapping[str, str] = os.environ,
        service_account_dir: Path = SERVICE_ACCOUNT_DIR,
    ) -> InClusterConfig:
        port = env.get("KUBERNETES_SERVICE_PORT") or "443"
        token_file, ca_file = service_account_dir / "token", service_account_dir / "ca.crt"
        for needed in (token_file, ca_file):
            if not needed.is_file():
                raise InClusterConfigError(f"{needed} does not exist (no service-account token)")
        host = f"[{service_host}]" if ":" in service_host else service_host  # IPv6 literal
        return cls(f"https://{host}:{port}", token_file, ca_file)

    def token(self) -> str:
        return self.token_file.read_text().strip()


class KubernetesEventRecorder:
    """Creates core/v1 Events whose involvedObject is our pod."""

    def __init__(
        self,
        config: InClusterConfig,
        *,
        pod_name: str,
        namespace: str,
        pod_uid: str | None,
        metrics: SidecarMetrics,
    ) -> None:
        self._config = config
        self._pod_name = pod_name
        self._namespace = namespace
        self._pod_uid = pod_uid
        self._metrics = metrics
        self._http: httpx.AsyncClient | None = None  # made on first use, inside the event loop
        self._pending: set[asyncio.Task[None]] = set()

    def emit(self, reason: EventReason, message: str, type_: EventType = EventType.NORMAL) -> None:
        _log_event(reason, message, type_)
        task = asyncio.get_running_loop().create_task(self._send(reason, message, type_))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def aclose(self) -> None:
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=_API_TIMEOUT_SECONDS)
        if self._http is not None:
            await self._http.aclose()

    async def _send(self, reason: EventReason, message: str, type_: EventType) -> None:
        try:
            await self._create(reason, message, type_)
        except Exception as exc:  # RBAC refusal, API down, bad token file: log, count, carry on
            self._metrics.kubernetes_events.labels(Outcome.FAILURE.value).inc()
            log.warning(
                "could not create Kubernetes event",
                extra={"reason": reason.value, "error": _describe(exc)},
            )
        else:
            self._metrics.kubernetes_events.labels(Outcome.SUCCESS.value).inc()

    async def _create(self, reason: EventReason, message: str, type_: EventType) -> None:
        if self._http is None:
            self._http = httpx.AsyncClient(
                base_url=self._config.api_url,
                verify=ssl.create_default_context(cafile=str(self._config.ca_file)),
                timeout=_API_TIMEOUT_SECONDS,
            )
        response = await self._http.post(
            f"/api/v1/namespaces/{self._namespace}/events",
            json=self.event_body(reason, message, type_),
            headers={"Authorization": f"Bearer {self._config.token()}"},
        )
        response.raise_for_status()

    def event_body(self, reason: EventReason, message: str, type_: EventType) -> dict[str, Any]:
        """The core/v1 Event, as the API server takes it (camelCase JSON)."""
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        involved: dict[str, str] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": self._pod_name,
            "namespace": self._namespace,
        }
        if self._pod_uid:
            involved["uid"] = self._pod_uid
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{self._pod_name}.", "namespace": self._namespace},
            "involvedObject": involved,
            "reason": reason.value,
            "message": message[:_MESSAGE_LIMIT],
            "type": type_.value,
            "source": {"component": COMPONENT, "host": socket.gethostname()},
            "reportingComponent": COMPONENT,
            "reportingInstance": self._pod_name,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }


def build_event_recorder(
    settings: SidecarSettings,
    metrics: SidecarMetrics,
    *,
    env: Mapping[str, str] = os.environ,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> EventRecorder:
    """A Kubernetes recorder in a cluster, else a log-only one. Never raises."""
    if not settings.in_kubernetes:
        return NullEventRecorder()
    assert settings.kubernetes_service_host is not None
    assert settings.pod_name is not None and settings.pod_namespace is not None
    try:
        config = InClusterConfig.load(settings.kubernetes_service_host, env, service_account_dir)
    except InClusterConfigError as exc:  # no service-account token mounted
        log.warning("Kubernetes events disabled", extra={"error": str(exc)})
        return NullEventRecorder()
    return KubernetesEventRecorder(
        config,
        pod_name=settings.pod_name,
        namespace=settings.pod_namespace,
        pod_uid=settings.pod_uid,
        metrics=metrics,
    )


def _log_event(reason: EventReason, message: str, type_: EventType) -> None:
    log.info(
        "event",
        extra={"reason": reason.value, "event_type": type_.value, "event_message": message},
    )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code} {exc.response.reason_phrase}".strip()
    return repr(exc)
