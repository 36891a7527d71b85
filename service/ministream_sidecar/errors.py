"""Domain exceptions. They know nothing about HTTP: api/errors.py maps them to statuses."""

from __future__ import annotations

from typing import Any


class SidecarError(Exception):
    """Base of everything the sidecar raises on purpose."""

    #: Stable machine-readable name, used in error bodies and logs.
    code = "sidecar_error"

    def __init__(self, message: str, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}


class TokenMissing(SidecarError):
    """A guarded endpoint was called without a bearer token."""

    code = "token_missing"


class TokenInvalid(SidecarError):
    """A guarded endpoint was called with the wrong bearer token."""

    code = "token_invalid"


class ControlNotLocal(SidecarError):
    """A control endpoint was called from the network while only local peers may call it."""

    code = "control_not_local"


class UpstreamUnavailable(SidecarError):
    """vLLM could not be reached or answered /health with an error."""

    code = "upstream_unavailable"


class UpstreamError(SidecarError):
    """vLLM answered, but not with what the sidecar needs (bad status, unparsable body)."""

    code = "upstream_error"


class ModelUnknown(SidecarError):
    """No model name is configured and GET /v1/models did not give one."""

    code = "model_unknown"


class WarmupFailed(SidecarError):
    """Every warmup attempt failed; the pod stays unready."""

    code = "warmup_failed"


class Draining(SidecarError):
    """The pod is draining: it will not be warmed up or made ready again."""

    code = "draining"
