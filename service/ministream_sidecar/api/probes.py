"""GET /livez and GET /readyz."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from ..engine_client import Health
from .deps import ClientDep, SettingsDep, StateDep
from .schemas import Liveness, Readiness

router = APIRouter(tags=["probes"])


@router.get(
    "/livez",
    response_model=Liveness,
    responses={503: {"model": Liveness, "description": "vLLM is known dead."}},
)
async def livez(state: StateDep, settings: SettingsDep) -> JSONResponse:
    """200 while the sidecar runs and vLLM is not known dead.

    "Known dead": vLLM was healthy once, then failed LIVENESS_FAILURE_THRESHOLD consecutive
    background health checks. A vLLM that is still loading is not dead.
    """
    body = Liveness(
        alive=state.alive,
        upstream_up=state.upstream_up,
        consecutive_upstream_failures=state.consecutive_failures,
        liveness_failure_threshold=settings.liveness_failure_threshold,
    )
    return JSONResponse(body.model_dump(mode="json"), status_code=200 if body.alive else 503)


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "Not ready; `reasons` says why."}},
)
async def readyz(state: StateDep, client: ClientDep) -> JSONResponse:
    """200 only when vLLM /health is OK, warmup has succeeded and the pod is not draining.

    When everything else says ready, vLLM /health is checked right now, so a dead vLLM
    (connection refused, or /health not 200) turns the pod unready at the next probe, not at
    the next background check. A /health that only times out does not: a saturated vLLM
    misses the timeout while it serves at full speed, and the background check tells busy
    from hung by its token counters (docs/sidecar.md, "Busy or hung").
    """
    if state.ready and await client.health() is Health.DOWN:
        state.record_probe_failure()
    reasons = state.not_ready_reasons()
    body = Readiness(
        ready=not reasons,
        reasons=reasons,
        upstream_up=state.upstream_up,
        warmup=state.warmup,
        draining=state.draining,
        model=state.model,
        adapters_warmed=list(state.adapters_warmed),
        adapters_missing=list(state.adapters_missing),
    )
    return JSONResponse(body.model_dump(mode="json"), status_code=200 if body.ready else 503)
