"""HTTP translation only: routes read objects from `app.state` and call into the domain."""

from __future__ import annotations

from fastapi import APIRouter

from . import metrics, probes
from .control import build_control_router


def build_router(*, guarded: bool) -> APIRouter:
    """All routes; `guarded`: POST endpoints need the bearer token."""
    router = APIRouter()
    router.include_router(probes.router)
    router.include_router(build_control_router(guarded=guarded))
    router.include_router(metrics.router)
    return router
