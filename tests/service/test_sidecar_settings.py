"""Settings come from MINISTREAM_SIDECAR_* (and the downward API's unprefixed names)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import AliasChoices, ValidationError

from ministream_sidecar.settings import ENV_PREFIX, SidecarSettings


def test_environment_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINISTREAM_SIDECAR_PORT", "9091")
    monkeypatch.setenv("MINISTREAM_SIDECAR_VLLM_URL", "http://vllm:8000/")
    monkeypatch.setenv("MINISTREAM_SIDECAR_TOKEN", "")  # a chart's unset secret
    monkeypatch.setenv("MINISTREAM_SIDECAR_DRAIN_TIMEOUT_SECONDS", "90")
    monkeypatch.setenv("MINISTREAM_SIDECAR_INFO_TENSOR_PARALLEL_SIZE", "4")
    monkeypatch.setenv("POD_NAME", "ms-0")
    monkeypatch.setenv("POD_NAMESPACE", "serving")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    s = SidecarSettings()
    assert (s.port, s.vllm_url, s.token, s.drain_timeout_seconds) == (
        9091,
        "http://vllm:8000",
        None,
        90.0,
    )
    assert s.info_tensor_parallel_size == 4
    assert (s.pod_name, s.pod_namespace, s.in_kubernetes) == ("ms-0", "serving", False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert SidecarSettings().in_kubernetes


@pytest.mark.parametrize(
    "env",
    [
        {"MINISTREAM_SIDECAR_VLLM_URL": "vllm:8000"},
        {"MINISTREAM_SIDECAR_PORT": "0"},
        {"MINISTREAM_SIDECAR_WARMUP_CONCURRENCY": "0"},
        {"MINISTREAM_SIDECAR_LOG_LEVEL": "LOUD"},
        {
            "MINISTREAM_SIDECAR_WARMUP_BACKOFF_INITIAL_SECONDS": "10",
            "MINISTREAM_SIDECAR_WARMUP_BACKOFF_MAX_SECONDS": "1",
        },
    ],
)
def test_nonsense_is_rejected(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValidationError):
        SidecarSettings()


def test_every_setting_is_documented() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "sidecar.md").read_text()
    for name, field in SidecarSettings.model_fields.items():
        alias = field.validation_alias
        env = (
            str(alias.choices[0])
            if isinstance(alias, AliasChoices)
            else (ENV_PREFIX + name.upper())
        )
        assert f"`{env}`" in doc, env
