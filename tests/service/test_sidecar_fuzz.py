"""Fuzz the sidecar's OpenAPI with schemathesis: malformed requests get 4xx, never 500,
and every response matches the documented status codes, content types and schemas.

The app runs in-process (schemathesis' ASGI transport, which also runs the lifespan) with
`FakeVLLM` as the upstream: this fuzzes the sidecar's own HTTP handling only, and a fake
upstream keeps hundreds of calls fast and lets /drain end at once. (schemathesis'
`from_fixture` does not work with pytest 9.2 — `Function._nodeid` is gone — so the cases
are drawn with hypothesis directly from each operation's strategy.)
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.generation import GenerationMode

# The schema loader's lazy imports, made here at collection rather than in a test: CPython
# 3.11 counts the AST builder's recursion depth per interpreter, not per thread, so pytest
# compiling these modules (it rewrites schemathesis, a pytest plugin) while another thread
# compiles raises SystemError ("AST constructor recursion depth mismatch", seen once in CI).
from schemathesis.python import asgi as _asgi  # noqa: F401
from schemathesis.specs.openapi import schemas as _openapi_schemas  # noqa: F401
from sidecarkit import FakeVLLM, fake_settings

from ministream_sidecar.app import create_app

OPERATIONS = {
    ("GET", "/livez"),
    ("GET", "/readyz"),
    ("POST", "/warmup"),
    ("POST", "/drain"),
    ("GET", "/metrics"),
}


def load_schema(token: str | None) -> Any:
    app = create_app(
        fake_settings(token=token, drain_poll_interval_seconds=0.01),
        transport=FakeVLLM().transport(),
    )
    return schemathesis.openapi.from_asgi("/openapi.json", app)


def test_openapi_lists_the_contract() -> None:
    schema = load_schema(None)
    found = {(op.ok().method.upper(), op.ok().path) for op in schema.get_all_operations()}
    assert found == OPERATIONS


@pytest.mark.parametrize(
    "mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value
)
@pytest.mark.parametrize("token", [None, "s3cret"], ids=["open", "token"])
def test_openapi_fuzz(token: str | None, mode: GenerationMode) -> None:
    schema = load_schema(token)
    for result in schema.get_all_operations():
        operation = result.ok()
        raw = operation.definition.raw
        if (
            mode is GenerationMode.NEGATIVE
            and not raw.get("parameters")
            and not raw.get("security")
        ):
            continue  # nothing to make invalid (GET /livez takes no input at all)

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        def check(case: Any) -> None:
            response = case.call_and_validate()
            assert response.status_code < 500, (case.method, case.path, response.text)

        check()
