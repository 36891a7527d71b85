"""FastAPI dependencies: the objects the lifespan hung on `app.state`, and the token guard."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ..drain import Drainer
from ..engine_client import VLLMClient
from ..errors import TokenInvalid, TokenMissing
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
