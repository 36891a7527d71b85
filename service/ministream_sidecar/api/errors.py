"""The one place where domain exceptions become HTTP statuses."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ..errors import (
    ControlNotLocal,
    Draining,
    ModelUnknown,
    SidecarError,
    TokenInvalid,
    TokenMissing,
    UpstreamError,
    UpstreamUnavailable,
    WarmupFailed,
)
from .schemas import ErrorBody, ErrorDetail

STATUS: dict[type[SidecarError], int] = {
    TokenMissing: 401,
    TokenInvalid: 403,
    ControlNotLocal: 403,
    Draining: 409,
    UpstreamError: 502,
    UpstreamUnavailable: 503,
    ModelUnknown: 503,
    WarmupFailed: 503,
}


def status_for(exc: SidecarError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


async def _handle(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, SidecarError)
    body = ErrorBody(error=ErrorDetail(type=exc.code, message=exc.message, details=exc.details))
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, TokenMissing) else None
    return JSONResponse(body.model_dump(mode="json"), status_code=status_for(exc), headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(SidecarError, _handle)


# OpenAPI `responses=` fragments, so the documented statuses match what handlers return.
LOCAL_RESPONSES: dict[int | str, dict[str, Any]] = {
    403: {
        "model": ErrorBody,
        "description": "Called from the network (only loopback peers may call it unless "
        "MINISTREAM_SIDECAR_CONTROL_FROM_NETWORK), or a wrong bearer token.",
    },
}

AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "No bearer token (a token is configured)."},
    403: {"model": ErrorBody, "description": "Wrong bearer token."},
}
