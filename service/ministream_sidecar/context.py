"""What the sidecar's workers share: one object instead of the same five collaborators
passed to each of them (the warmup runner, the drainer, the model resolver, the monitor)."""

from __future__ import annotations

from dataclasses import dataclass

from .engine_client import VLLMClient
from .events import EventRecorder
from .metrics import SidecarMetrics
from .settings import SidecarSettings
from .state import ServingState


@dataclass(frozen=True)
class SidecarContext:
    settings: SidecarSettings
    client: VLLMClient
    state: ServingState
    metrics: SidecarMetrics
    events: EventRecorder
