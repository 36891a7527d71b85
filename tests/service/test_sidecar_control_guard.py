"""Who may call POST /warmup and POST /drain: loopback only unless
MINISTREAM_SIDECAR_CONTROL_FROM_NETWORK, the token on top; probes and /metrics stay open.

The non-loopback peer is the ASGI app seen through `httpx.ASGITransport(client=...)`: a real
second host is not available here. The allowed case also runs under the real uvicorn on
127.0.0.1, as the preStop hook reaches it. `FakeVLLM` stands in for vLLM: these tests are
about the sidecar's own guard, not about vLLM.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from sidecarkit import FakeVLLM, SidecarFactory, fake_settings

from ministream_sidecar.api.deps import is_local_peer
from ministream_sidecar.app import create_app
from ministream_sidecar.settings import SidecarSettings

OUTSIDE = ("10.0.0.7", 1234)


def call(
    method: str,
    path: str,
    *,
    client: tuple[str, int],
    headers: dict[str, str] | None = None,
    **settings: Any,
) -> httpx.Response:
    """One request to a freshly built app (lifespan run by hand) from `client`."""
    app = create_app(fake_settings(**settings), transport=FakeVLLM().transport(), run_monitor=False)

    async def go() -> httpx.Response:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, client=client)
            async with httpx.AsyncClient(transport=transport, base_url="http://pod:8081") as c:
                return await c.request(method, path, headers=headers)

    return asyncio.run(go())


@pytest.mark.parametrize("path", ["/warmup", "/drain"])
def test_control_from_the_network_is_403_naming_the_setting(path: str) -> None:
    r = call("POST", path, client=OUTSIDE)
    assert r.status_code == 403
    error = r.json()["error"]
    assert error["type"] == "control_not_local"
    assert "MINISTREAM_SIDECAR_CONTROL_FROM_NETWORK" in error["message"]
    assert "sidecar.control.fromNetwork" in error["message"]
    assert error["details"]["peer"] == "10.0.0.7"


@pytest.mark.parametrize("path", ["/livez", "/readyz", "/metrics"])
def test_probes_and_metrics_stay_open_to_the_network(path: str) -> None:
    r = call("GET", path, client=OUTSIDE)
    assert r.status_code in (200, 503)  # readiness may say "not yet"; never 403
    assert r.status_code != 403


@pytest.mark.parametrize("peer", ["127.0.0.1", "127.3.4.5", "::1"])
def test_control_from_loopback_is_served(peer: str) -> None:
    r = call("POST", "/drain", client=(peer, 4321), drain_timeout_seconds=1)
    assert r.status_code == 200, r.text
    assert r.json()["outcome"] == "idle"


def test_opened_to_the_network_the_token_still_guards() -> None:
    opened = {"control_from_network": True, "token": "s3cret", "drain_timeout_seconds": 1}
    assert call("POST", "/drain", client=OUTSIDE, **opened).status_code == 401
    wrong = call("POST", "/drain", client=OUTSIDE, headers={"Authorization": "Bearer x"}, **opened)
    assert wrong.status_code == 403 and wrong.json()["error"]["type"] == "token_invalid"
    right = {"Authorization": "Bearer s3cret"}
    assert call("POST", "/drain", client=OUTSIDE, headers=right, **opened).status_code == 200


def test_local_with_a_token_still_needs_the_token() -> None:
    r = call("POST", "/drain", client=("127.0.0.1", 1), token="s3cret")
    assert r.status_code == 401


def test_opened_without_a_token_is_served_from_anywhere() -> None:
    r = call("POST", "/drain", client=OUTSIDE, control_from_network=True, drain_timeout_seconds=1)
    assert r.status_code == 200


@pytest.mark.parametrize(
    ("peer", "server", "local"),
    [
        ("127.0.0.1", None, True),
        ("::1", None, True),
        ("::ffff:127.0.0.1", None, True),
        ("10.0.0.7", "10.0.0.7", True),  # the pod calling itself on its pod IP
        ("10.0.0.7", "10.0.0.8", False),
        ("10.0.0.7", None, False),
        ("testclient", None, False),
        ("", None, False),
        (None, None, False),
        ("::ffff:10.0.0.7", None, False),
    ],
)
def test_is_local_peer(peer: str | None, server: str | None, local: bool) -> None:
    assert is_local_peer(peer, server) is local


def test_real_uvicorn_on_loopback_serves_drain(start_sidecar: SidecarFactory) -> None:
    """The preStop hook's path: real HTTP over 127.0.0.1 to the real server."""
    sidecar = start_sidecar(
        app_kwargs={"transport": FakeVLLM().transport()},
        vllm_url="http://fake-vllm:8000",
        drain_idle_polls=1,
    )
    r = sidecar.post("/drain", params={"timeout_seconds": 2})
    assert r.status_code == 200, r.text
    assert sidecar.get("/openapi.json").json()["paths"]["/drain"]["post"]["responses"]["403"]


def test_env_var_opens_the_control_plane(monkeypatch: pytest.MonkeyPatch) -> None:
    assert SidecarSettings().control_from_network is False
    monkeypatch.setenv("MINISTREAM_SIDECAR_CONTROL_FROM_NETWORK", "true")
    assert SidecarSettings().control_from_network is True


# ------------------------------------------------- secrets refused at start (hostile input)


@pytest.mark.parametrize("field", ["api_key", "token"])
@pytest.mark.parametrize("value", [" ", "\t\n", "key\n", " key"])
def test_blank_or_padded_secret_is_refused(field: str, value: str) -> None:
    with pytest.raises(ValidationError, match="whitespace"):
        SidecarSettings(**{field: value})


@pytest.mark.parametrize(
    ("field", "required"), [("api_key", "api_key_required"), ("token", "token_required")]
)
@pytest.mark.parametrize("value", [None, ""])
def test_required_secret_empty_is_refused_at_start(
    field: str, required: str, value: str | None
) -> None:
    with pytest.raises(ValidationError, match=f"{required} is set"):
        SidecarSettings(**{field: value, required: True})


def test_required_secret_from_env_empty_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the chart renders: the key from a Secret that holds an empty string."""
    monkeypatch.setenv("MINISTREAM_SIDECAR_API_KEY", "")
    monkeypatch.setenv("MINISTREAM_SIDECAR_API_KEY_REQUIRED", "true")
    with pytest.raises(ValidationError, match="MINISTREAM_SIDECAR_API_KEY is empty"):
        SidecarSettings()
    monkeypatch.setenv("MINISTREAM_SIDECAR_API_KEY", "k3y")
    assert SidecarSettings().api_key is not None


def test_sidecar_process_with_an_empty_required_key_exits(tmp_path: Any) -> None:
    """The real entry point refuses to start (and so never serves) with an empty key."""
    env = {
        **os.environ,
        "MINISTREAM_SIDECAR_API_KEY": "",
        "MINISTREAM_SIDECAR_API_KEY_REQUIRED": "true",
        "MINISTREAM_SIDECAR_PORT": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "ministream_sidecar"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "api_key_required" in proc.stderr
