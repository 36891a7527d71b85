"""HTTP translation only: routes read objects from `app.state` and call into the domain."""

from __future__ import annotations

from fastapi import APIRouter

from . import metrics, probes
from .control import build_control_router


def build_router(*, guarded: bool, local_only: bool = True) -> APIRouter:
    """All routes; `guarded`: POST endpoints need the bearer token; `local_only`: they
    answer loopback peers only."""
    router = APIRouter()
    router.include_router(probes.router)
    router.include_router(build_control_router(guarded=guarded, local_only=local_only))
    router.include_router(metrics.router)
    return router
