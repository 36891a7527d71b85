"""POST /warmup and POST /drain: local peers only (unless MINISTREAM_SIDECAR_CONTROL_FROM_NETWORK),
and token-guarded when MINISTREAM_SIDECAR_TOKEN is set.

The router is built per app so that its OpenAPI document tells the truth: the bearer
security scheme and the 401/403 answers appear only when a token is configured.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from ..errors import UpstreamUnavailable, WarmupFailed
from .deps import DrainerDep, MonitorDep, StateDep, WarmupDep, require_local_peer, require_token
from .errors import AUTH_RESPONSES, LOCAL_RESPONSES
from .schemas import DrainBody, ErrorBody, WarmupBody


async def warmup(warmup: WarmupDep, state: StateDep, monitor: MonitorDep) -> WarmupBody:
    """Run warmup now (idempotent: after a success, returns it without sending anything)."""
    if not state.upstream_up:
        # Check now rather than wait for the background loop (and record what it finds).
        await monitor.check_once()
    if not state.upstream_up:
        raise UpstreamUnavailable("vLLM /health is not OK; warmup would fail")
    result = await warmup.run()
    body = WarmupBody(**asdict(result))
    if not result.succeeded:
        raise WarmupFailed(
            f"warmup failed after {result.attempts} attempt(s): {result.last_error}",
            details=body.model_dump(mode="json"),
        )
    return body


async def drain(
    drainer: DrainerDep,
    timeout_seconds: Annotated[
        float | None,
        Query(gt=0, le=86400, description="Override DRAIN_TIMEOUT_SECONDS for this drain."),
    ] = None,
) -> DrainBody:
    """Go unready at once; return when vLLM holds no request (none running, waiting or in
    flight in its HTTP server), or on timeout.

    Draining is one-way: the pod is on its way out.
    """
    result = await drainer.drain(timeout_seconds)
    return DrainBody(**asdict(result))


def build_control_router(*, guarded: bool, local_only: bool = True) -> APIRouter:
    auth: dict[int | str, dict[str, Any]] = dict(LOCAL_RESPONSES) if local_only else {}
    auth.update(AUTH_RESPONSES if guarded else {})
    dependencies = [Depends(require_local_peer)] if local_only else []
    if guarded:
        dependencies.append(Depends(require_token))
    router = APIRouter(tags=["control"], dependencies=dependencies)
    router.add_api_route(
        "/warmup",
        warmup,
        methods=["POST"],
        response_model=WarmupBody,
        responses={
            **auth,
            409: {"model": ErrorBody, "description": "The pod is draining."},
            503: {"model": ErrorBody, "description": "vLLM unavailable, or warmup failed."},
        },
    )
    router.add_api_route(
        "/drain", drain, methods=["POST"], response_model=DrainBody, responses=auth
    )
    return router
