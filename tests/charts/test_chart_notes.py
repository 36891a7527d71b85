"""NOTES.txt warns that anyone can call the sidecar's /warmup and /drain only when the rendered
sidecar would let them: control from the network on (`MINISTREAM_SIDECAR_CONTROL_FROM_NETWORK`)
and no token (`MINISTREAM_SIDECAR_TOKEN`). With the defaults it answers loopback only, and a
warning there would be wrong."""

from __future__ import annotations

import pytest
from chartkit import CHART, render, render_notes

BASE = CHART / "ci" / "local-tp1-values.yaml"
WARNING = "can call /warmup and /drain"

CASES = {
    "defaults": [],
    "from-network": ["sidecar.control.fromNetwork=true"],
    "from-network-without-policy": [
        "sidecar.control.fromNetwork=true",
        "networkPolicy.enabled=false",
    ],
    "from-network-with-token": [
        "sidecar.control.fromNetwork=true",
        "sidecar.token.existingSecret=sidecar-token",
    ],
    "token-only": ["sidecar.token.existingSecret=sidecar-token"],
}


def _notes(sets: list[str]) -> str:
    return " ".join(render_notes(BASE, set_args=tuple(sets)).split())


def _open_to_the_network(sets: list[str]) -> bool:
    """What the rendered sidecar does: control endpoints for non-loopback peers, no token."""
    parsed = {"true": True, "false": False}
    values = {k.replace(".", "__"): parsed.get(v, v) for k, v in (s.split("=") for s in sets)}
    spec = render(BASE, **values).pod_template()["spec"]
    sidecar = next(c for c in spec["containers"] + spec["initContainers"] if c["name"] == "sidecar")
    env = {e["name"]: e.get("value") for e in sidecar["env"]}
    return (
        env["MINISTREAM_SIDECAR_CONTROL_FROM_NETWORK"] == "true"
        and "MINISTREAM_SIDECAR_TOKEN" not in env
    )


@pytest.mark.parametrize("sets", CASES.values(), ids=CASES.keys())
def test_the_control_warning_is_shown_exactly_when_true(sets: list[str]) -> None:
    notes = _notes(sets)
    assert (WARNING in notes) == _open_to_the_network(sets), notes
    if WARNING in notes and "networkPolicy.enabled=false" not in sets:
        # It says who the NetworkPolicy lets in, not that one should be enabled.
        assert "every pod of namespace serving: networkPolicy.sidecarFrom is empty" in notes
        assert "enable networkPolicy" not in notes


def test_the_defaults_warn_of_nothing_about_the_sidecar() -> None:
    assert WARNING not in _notes([])
    assert not _open_to_the_network([])
