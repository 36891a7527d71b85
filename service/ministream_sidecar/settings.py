"""Sidecar settings: one pydantic-settings class, read from the environment.

Every field is set through ``MINISTREAM_SIDECAR_<FIELD>`` (e.g. ``MINISTREAM_SIDECAR_PORT``),
except the Kubernetes downward-API variables ``POD_NAME``, ``POD_NAMESPACE``, ``POD_UID`` and
the in-cluster marker ``KUBERNETES_SERVICE_HOST``, which keep their usual names.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from .client import ENV_PREFIX


class SidecarSettings(BaseSettings):
    """Everything the sidecar can be told. Documented in docs/sidecar.md."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        populate_by_name=True,
        extra="ignore",
        frozen=True,
    )

    # --- where we listen and what we guard -------------------------------------------------
    port: int = Field(
        default=8081, ge=1, le=65535, description="Port of the sidecar's HTTP server."
    )
    host: str = Field(default="0.0.0.0", description="Bind address of the sidecar's HTTP server.")
    token: SecretStr | None = Field(
        default=None,
        description="Bearer token guarding POST /warmup and POST /drain (unset: no token; "
        "they still answer only local peers unless control_from_network).",
    )
    control_from_network: bool = Field(
        default=False,
        description="Let POST /warmup and POST /drain answer peers other than loopback (and "
        "the pod calling itself on its own address). Off: 403 for everyone else.",
    )
    max_request_body_bytes: int = Field(
        default=65536,
        ge=0,
        description="Largest request body accepted (413 above it); no endpoint needs one.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    access_log_probes: bool = Field(
        default=False,
        description="Access-log every GET /livez, /readyz and /metrics (the kubelet's probes, "
        "Prometheus). Off: only those that fail (status >= 400) or take longer than "
        "slow_probe_seconds are logged.",
    )
    slow_probe_seconds: float = Field(
        default=1.0,
        ge=0,
        description="A probe or scrape answered later than this is logged as a warning "
        "while access_log_probes is off.",
    )

    # --- the vLLM server next to us --------------------------------------------------------
    vllm_url: str = Field(default="http://127.0.0.1:8000", description="Base URL of `vllm serve`.")
    model_name: str = Field(
        default="", description="Served model name; empty: discovered through GET /v1/models."
    )
    lora_adapters: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="LoRA adapters vLLM was told to serve (comma-separated names; the chart "
        "renders them from lora.adapters). Warmup sends each one it lists under /v1/models a "
        "request before the pod turns ready; one it does not list (refused when fetched) "
        "is reported as not loaded, and the pod serves the rest.",
    )
    api_key: SecretStr | None = Field(
        default=None, description="Bearer sent to vLLM (its --api-key), if it has one."
    )
    api_key_required: bool = Field(
        default=False,
        description="Refuse to start without a non-blank api_key (the chart sets it while "
        "apiKey.enabled: an empty key in the Secret would let vLLM serve open).",
    )
    token_required: bool = Field(
        default=False,
        description="Refuse to start without a non-blank token (the chart sets it while "
        "sidecar.token.existingSecret is set).",
    )

    # --- health ----------------------------------------------------------------------------
    health_interval_seconds: float = Field(
        default=2.0, gt=0, description="Background /health period."
    )
    health_timeout_seconds: float = Field(
        default=2.0, gt=0, description="Timeout of one /health call."
    )
    liveness_failure_threshold: int = Field(
        default=3,
        ge=1,
        description="Consecutive failed background health checks, after vLLM was healthy once, "
        "before /livez reports vLLM dead (so ~threshold x interval seconds).",
    )
    progress_window_seconds: float = Field(
        default=2.0,
        gt=0,
        description="When /health fails, vLLM's token counters are read twice this far apart: "
        "if they grew, vLLM is busy (tokens flowing), not hung, and the check does not count "
        "towards liveness or readiness.",
    )
    progress_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        description="Timeout of each of those two /metrics reads (a saturated server answers "
        "slowly; a hung one not at all). At 5x capacity on 2 vCPUs a 10 s timeout let a busy "
        "vLLM be declared dead (docs/benchmarks.md#overload).",
    )

    # --- warmup ----------------------------------------------------------------------------
    warmup_on_start: bool = Field(
        default=True, description="Run warmup automatically as soon as vLLM /health first turns OK."
    )
    warmup_requests: int = Field(default=8, ge=1, description="Completions per warmup attempt.")
    warmup_concurrency: int = Field(
        default=4, ge=1, description="Warmup completions in flight at once."
    )
    warmup_prompt_tokens: int = Field(
        default=128, ge=1, description="Prompt length (token ids) of each."
    )
    warmup_max_tokens: int = Field(
        default=32, ge=1, description="Tokens generated by each (ignore_eos)."
    )
    warmup_request_timeout_seconds: float = Field(default=300.0, gt=0)
    warmup_max_attempts: int = Field(default=5, ge=1, description="Attempts per warmup run.")
    warmup_backoff_initial_seconds: float = Field(
        default=1.0, ge=0, description="Wait after attempt 1."
    )
    warmup_backoff_max_seconds: float = Field(
        default=30.0, ge=0, description="Cap of the doubling wait."
    )

    # --- drain -----------------------------------------------------------------------------
    drain_timeout_seconds: float = Field(
        default=60.0, gt=0, description="Longest a drain waits for vLLM to become idle."
    )
    drain_poll_interval_seconds: float = Field(
        default=0.5, gt=0, description="vLLM /metrics period."
    )
    drain_idle_polls: int = Field(
        default=2,
        ge=1,
        description="Consecutive idle scrapes (0 running, 0 waiting) that end a drain.",
    )
    drain_min_seconds: float = Field(
        default=0.0,
        ge=0,
        description="Minimum time a drain waits after going unready, so that endpoint "
        "controllers and load balancers stop routing here before vLLM is stopped.",
    )

    # --- cold start and info metric ----------------------------------------------------------
    process_start_time: float | None = Field(
        default=None, gt=0, description="Epoch seconds the cold start counts from; default: ours."
    )
    startup_log: str = Field(
        default="",
        description="File vLLM's processes stamp their start into (the plugin writes it "
        "when vLLM has the same variable; startup_log.py): its phases become "
        "ministream_cold_start_phase_seconds. Empty: only engine_start, warmup, total.",
    )
    prefetch_paths: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="Files or directories (comma-separated) read once into the page cache "
        "at start, in the background, while vLLM imports: the model and VLLM_CACHE_ROOT (the "
        "chart renders them; prefetch.py). An s3:// URI is skipped; empty: off.",
    )
    info_revision: str = ""
    info_load_format: str = "auto"
    info_tensor_parallel_size: int = Field(default=1, ge=1)

    # --- Kubernetes (downward API; no prefix) -------------------------------------------------
    pod_name: str | None = Field(
        default=None, validation_alias=AliasChoices("POD_NAME", "pod_name")
    )
    pod_namespace: str | None = Field(
        default=None, validation_alias=AliasChoices("POD_NAMESPACE", "pod_namespace")
    )
    pod_uid: str | None = Field(default=None, validation_alias=AliasChoices("POD_UID", "pod_uid"))
    kubernetes_service_host: str | None = Field(
        default=None,
        validation_alias=AliasChoices("KUBERNETES_SERVICE_HOST", "kubernetes_service_host"),
    )

    @field_validator("vllm_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"vllm_url must start with http:// or https://, got {value!r}")
        return value.rstrip("/")

    @field_validator("lora_adapters", "prefetch_paths", mode="before")
    @classmethod
    def _comma_list(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(name.strip() for name in value.split(",") if name.strip())
        return value

    @field_validator("token", "api_key", mode="before")
    @classmethod
    def _empty_secret_is_none(cls, value: object) -> object:
        # A chart renders unset secrets as empty strings; empty must mean "not configured",
        # never "the empty string is the token".
        if value == "":
            return None
        raw = value.get_secret_value() if isinstance(value, SecretStr) else value
        if isinstance(raw, str) and (not raw.strip() or raw != raw.strip()):
            # A Secret written with `echo` carries a newline; one of spaces is no secret.
            raise ValueError(
                "is blank or has leading/trailing whitespace; refusing to start with it "
                "(fix the Secret: `printf %s KEY`, not `echo KEY`)"
            )
        return value

    @field_validator(
        "pod_name", "pod_namespace", "pod_uid", "kubernetes_service_host", mode="before"
    )
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value

    @model_validator(mode="after")
    def _required_secrets(self) -> SidecarSettings:
        # Checked at start: a pod whose Secret holds an empty key must not come up serving
        # an open API (vLLM treats an empty VLLM_API_KEY as "no key").
        if self.api_key_required and self.api_key is None:
            raise ValueError(
                "api_key_required is set but MINISTREAM_SIDECAR_API_KEY is empty or unset "
                "(check the apiKey Secret)"
            )
        if self.token_required and self.token is None:
            raise ValueError(
                "token_required is set but MINISTREAM_SIDECAR_TOKEN is empty or unset "
                "(check the sidecar.token Secret)"
            )
        return self

    @model_validator(mode="after")
    def _backoff_order(self) -> SidecarSettings:
        if self.warmup_backoff_max_seconds < self.warmup_backoff_initial_seconds:
            raise ValueError("warmup_backoff_max_seconds must be >= warmup_backoff_initial_seconds")
        return self

    @property
    def in_kubernetes(self) -> bool:
        """Events are emitted only in a cluster and only when the pod is known."""
        return bool(self.kubernetes_service_host and self.pod_name and self.pod_namespace)
