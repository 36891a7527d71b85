"""`accessLog`: health checks, probes and scrapes stay out of the access logs by default.

vLLM's arguments carry `--disable-access-log-for-endpoints` with the paths `ministream up`
passes too (one list, held equal here), and the sidecar gets its switch; `accessLog.probes`
turns both back on.
"""

from __future__ import annotations

from typing import Any

from chartkit import CHART, render

from ministream_sidecar.launcher import QUIET_FLAG, VLLM_QUIET_PATHS, UpArgs, vllm_command
from ministream_sidecar.settings import SidecarSettings

BASE = CHART / "ci" / "local-tp1-values.yaml"


def _containers(**sets: Any) -> dict[str, dict[str, Any]]:
    spec = render(BASE, **sets).pod_template()["spec"]
    return {c["name"]: c for c in spec["containers"] + spec.get("initContainers", [])}


def _env(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in c.get("env", [])}


def _settings(c: dict[str, Any], monkeypatch: Any) -> SidecarSettings:
    """The sidecar's settings as its rendered environment makes them (the Secret's key
    stands in for the one a cluster would supply)."""
    for name, value in _env(c).items():
        if name.startswith("MINISTREAM_SIDECAR_"):
            monkeypatch.setenv(name, "a-key" if value is None else value)
    return SidecarSettings()


def _quiet_paths(args: list[str]) -> list[str] | None:
    return args[args.index(QUIET_FLAG) + 1].split(",") if QUIET_FLAG in args else None


def test_by_default_vllm_and_the_sidecar_leave_probes_out(monkeypatch: Any) -> None:
    c = _containers()
    assert _quiet_paths(c["vllm"]["args"]) == list(VLLM_QUIET_PATHS)
    up = vllm_command(UpArgs("/models/m", 8000, 8081, "127.0.0.1", []))
    assert _quiet_paths(up) == _quiet_paths(c["vllm"]["args"])  # the chart and `up` agree
    settings = _settings(c["sidecar"], monkeypatch)
    assert settings.access_log_probes is False and settings.slow_probe_seconds == 1


def test_access_log_probes_turns_them_back_on(monkeypatch: Any) -> None:
    c = _containers(accessLog__probes=True, accessLog__slowProbeSeconds=2.5)
    assert QUIET_FLAG not in c["vllm"]["args"]
    settings = _settings(c["sidecar"], monkeypatch)
    assert settings.access_log_probes is True and settings.slow_probe_seconds == 2.5
    up = vllm_command(UpArgs("/models/m", 8000, 8081, "127.0.0.1", [], access_log_probes=True))
    assert QUIET_FLAG not in up
