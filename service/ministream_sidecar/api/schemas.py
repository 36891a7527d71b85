"""Response bodies of the sidecar's endpoints (they make up its OpenAPI document)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from ..metrics import DrainOutcome
from ..state import NotReadyReason, WarmupState


class Liveness(BaseModel):
    alive: bool
    upstream_up: bool
    consecutive_upstream_failures: int
    liveness_failure_threshold: int


class Readiness(BaseModel):
    ready: bool
    reasons: list[NotReadyReason] = Field(description="Why not ready; empty when ready.")
    upstream_up: bool
    warmup: WarmupState
    draining: bool
    model: str
    adapters_warmed: list[str] = Field(
        default_factory=list, description="Configured LoRA adapters that answered warmup."
    )
    adapters_missing: list[str] = Field(
        default_factory=list,
        description="Configured LoRA adapters vLLM does not serve (refused when fetched); "
        "the pod serves the base model and the other adapters without them.",
    )


class WarmupBody(BaseModel):
    succeeded: bool
    ran: bool = Field(description="False when an earlier warmup had succeeded already.")
    attempts: int
    requests_succeeded: int
    requests_failed: int
    duration_seconds: float
    model: str
    last_error: str | None = None
    adapters_warmed: list[str] = Field(default_factory=list)
    adapters_missing: list[str] = Field(default_factory=list)


class DrainBody(BaseModel):
    outcome: DrainOutcome
    duration_seconds: float
    running: int | None = Field(description="Last vLLM num_requests_running seen.")
    waiting: int | None = Field(description="Last vLLM num_requests_waiting seen.")
    in_flight: int | None = Field(
        default=None,
        description="Last vLLM GET /load seen: requests its HTTP server had accepted and not "
        "yet answered (null: never read, or vLLM has no /load).",
    )
    polls: int
    scrape_errors: int
    last_error: str | None = None


class ErrorDetail(BaseModel):
    type: str
    message: str
    details: dict[str, object] = Field(default_factory=dict)


class ErrorBody(BaseModel):
    error: ErrorDetail
