"""GET /metrics: the sidecar's own registry (vLLM's metrics are scraped from vLLM)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from .deps import MetricsDep

router = APIRouter(tags=["metrics"])


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format."}},
)
async def metrics(metrics: MetricsDep) -> Response:
    payload, content_type = metrics.render()
    return Response(payload, media_type=content_type)
