"""The API key on vLLM's adapter routes outside `/v1`.

With runtime LoRA updating on, vLLM 0.32 also registers SageMaker-style routes,
`POST /adapters` and `DELETE /adapters/{name}`, which load and unload adapters like
`/v1/load_lora_adapter` does. Its API-key middleware guards only paths under `/v1`, `/v2`,
`/inference` and `/cohere`, so anyone who reaches the pod could load an adapter without the key.
This ASGI middleware, passed to vLLM with `--middleware ministream.adapter_guard.AdapterRoutesGuard`
(the chart does when `lora.dynamic.enabled`), answers those routes 401 without the key, as
vLLM answers its own guarded routes. The key is vLLM's: `VLLM_API_KEY`. Without one it lets
every request through, like vLLM.

Only the standard library and starlette (which vLLM's server brings) are imported.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

GUARDED_PREFIXES = ("/adapters",)
API_KEY_ENV = "VLLM_API_KEY"  # the key as the chart passes it (vLLM reads it too)
# What `--middleware` names; the chart renders the same string (tests/charts/test_chart_lora.py).
MIDDLEWARE = f"{__name__}.AdapterRoutesGuard"

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]


def guarded(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in GUARDED_PREFIXES)


def _bearer(scope: Scope) -> bytes | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.encode() if scheme.lower() == "bearer" else None
    return None


class AdapterRoutesGuard:
    def __init__(self, app: ASGIApp, api_key: str | None = None) -> None:
        self.app = app
        key = api_key if api_key is not None else os.environ.get(API_KEY_ENV, "")
        self._key_hash = hashlib.sha256(key.encode()).digest() if key else None

    def _allowed(self, scope: Scope) -> bool:
        token = _bearer(scope)
        return token is not None and secrets.compare_digest(
            hashlib.sha256(token).digest(), self._key_hash or b""
        )

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if (
            self._key_hash is None
            or scope["type"] not in ("http", "websocket")
            or scope.get("method") == "OPTIONS"
            or not guarded(scope["path"].removeprefix(scope.get("root_path", "")))
            or self._allowed(scope)
        ):
            await self.app(scope, receive, send)
            return
        from starlette.responses import JSONResponse

        await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
