"""The API key on vLLM's adapter routes outside /v1 (`ministream.adapter_guard`), in front of
a stand-in ASGI app: vLLM's own server with the guard is exercised by
tests/observability/test_lora_live.py."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from ministream import adapter_guard
from ministream.adapter_guard import AdapterRoutesGuard

KEY = "s3cret"


async def _ok(request: Request) -> PlainTextResponse:
    return PlainTextResponse("reached")


APP = Starlette(
    routes=[
        Route("/adapters", _ok, methods=["POST"]),
        Route("/adapters/{name}", _ok, methods=["DELETE"]),
        Route("/adaptersx", _ok, methods=["POST"]),
        Route("/health", _ok),
    ]
)


def client(key: str | None = KEY) -> TestClient:
    return TestClient(AdapterRoutesGuard(APP, api_key=key))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"}],
    ids=["none", "wrong", "basic"],
)
def test_adapter_routes_need_the_key(headers: dict[str, str]) -> None:
    c = client()
    for r in (c.post("/adapters", headers=headers), c.delete("/adapters/x", headers=headers)):
        assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}


def test_the_key_passes_and_other_paths_are_untouched() -> None:
    c = client()
    auth = {"Authorization": f"Bearer {KEY}"}
    assert c.post("/adapters", headers=auth).text == "reached"
    assert c.delete("/adapters/x", headers=auth).text == "reached"
    assert c.get("/health").text == "reached"
    assert c.post("/adaptersx").text == "reached"  # a prefix of a name is not the route


def test_without_a_key_nothing_is_guarded_like_vllm() -> None:
    assert client(key="").post("/adapters").text == "reached"


def test_the_key_comes_from_vllms_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(adapter_guard.API_KEY_ENV, KEY)
    c = TestClient(AdapterRoutesGuard(APP))  # type: ignore[arg-type]
    assert c.post("/adapters").status_code == 401
    assert c.post("/adapters", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
