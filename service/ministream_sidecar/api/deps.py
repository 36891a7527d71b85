"""FastAPI dependencies: the objects the lifespan hung on `app.state`, and the control guards."""

from __future__ import annotations

import ipaddress
import secrets
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ..drain import Drainer
from ..engine_client import VLLMClient
from ..errors import ControlNotLocal, TokenInvalid, TokenMissing
from ..metrics import SidecarMetrics
from ..monitor import HealthMonitor
from ..settings import SidecarSettings
from ..state import ServingState
from ..warmup import WarmupRunner


def get_settings(request: Request) -> SidecarSettings:
    settings: SidecarSettings = request.app.state.settings
    return settings


def get_state(request: Request) -> ServingState:
    state: ServingState = request.app.state.serving
    return state


def get_client(request: Request) -> VLLMClient:
    client: VLLMClient = request.app.state.vllm
    return client


def get_metrics(request: Request) -> SidecarMetrics:
    metrics: SidecarMetrics = request.app.state.metrics
    return metrics


def get_warmup(request: Request) -> WarmupRunner:
    warmup: WarmupRunner = request.app.state.warmup
    return warmup


def get_monitor(request: Request) -> HealthMonitor:
    monitor: HealthMonitor = request.app.state.monitor
    return monitor


def get_drainer(request: Request) -> Drainer:
    drainer: Drainer = request.app.state.drainer
    return drainer


def is_local_peer(peer: str | None, server: str | None = None) -> bool:
    """Loopback (127.0.0.0/8, ::1, v4-mapped loopback), or the address the connection
    arrived on: the pod (or `ministream up --host <ip>`) calling itself on its own IP."""
    if not peer:
        return False
    try:
        address = ipaddress.ip_address(peer.split("%", 1)[0])
    except ValueError:
        return False  # a unix socket or a test client's made-up name: not provably local
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback:
        return True
    return server is not None and peer == server


def require_local_peer(
    request: Request, settings: Annotated[SidecarSettings, Depends(get_settings)]
) -> None:
    """403 for a non-local peer unless MINISTREAM_SIDECAR_CONTROL_FROM_NETWORK opens the
    control endpoints (the preStop hook, `ministream up` and local tools call from loopback)."""
    if settings.control_from_network:
        return
    peer = request.client.host if request.client else None
    server = request.scope.get("server")
    if is_local_peer(peer, server[0] if server else None):
        return
    raise ControlNotLocal(
        f"control endpoints answer only from inside the pod (loopback); peer {peer!r} is "
        "not local. Set MINISTREAM_SIDECAR_CONTROL_FROM_NETWORK=true (chart value "
        "sidecar.control.fromNetwork) to open them, guarded by the token.",
        details={"peer": peer, "setting": "MINISTREAM_SIDECAR_CONTROL_FROM_NETWORK"},
    )


# auto_error=False: a missing or non-Bearer header must become our 401, not FastAPI's 403.
_bearer = HTTPBearer(auto_error=False, description="MINISTREAM_SIDECAR_TOKEN, when configured")


def require_token(
    settings: Annotated[SidecarSettings, Depends(get_settings)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """401 without a bearer token, 403 with a wrong one; open when no token is configured."""
    if settings.token is None:
        return
    if credentials is None:
        raise TokenMissing("this endpoint needs 'Authorization: Bearer <token>'")
    expected = settings.token.get_secret_value().encode()
    if not secrets.compare_digest(credentials.credentials.encode(), expected):
        raise TokenInvalid("wrong bearer token")


SettingsDep = Annotated[SidecarSettings, Depends(get_settings)]
StateDep = Annotated[ServingState, Depends(get_state)]
ClientDep = Annotated[VLLMClient, Depends(get_client)]
MetricsDep = Annotated[SidecarMetrics, Depends(get_metrics)]
WarmupDep = Annotated[WarmupRunner, Depends(get_warmup)]
DrainerDep = Annotated[Drainer, Depends(get_drainer)]
MonitorDep = Annotated[HealthMonitor, Depends(get_monitor)]
