"""The tools the project installs for its tests, and the one way a test meets a missing one.

`make setup-test` (scripts/setup.sh test) installs them: helm, helm3 and kubectl
(scripts/install_tools.sh), Prometheus and promtool (install_prometheus.sh), HAProxy
(install_haproxy.sh), buildah and podman (install_oci.sh), and the Python extras (vLLM's
router, NIXL, Ray, moto's S3 server). CI runs it first, so a missing tool is a broken set-up: the
test fails with the hint that installs it, never skips. tests/test_skip_policy.py holds every
skip under tests/ to this.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import NoReturn

import pytest

from ministream_testkit import router
from ministream_testkit.helm import helm_path


def missing_tool(hint: str) -> NoReturn:
    """Fail the test (no traceback: the hint is the whole message)."""
    pytest.fail(hint, pytrace=False)


def python_module(name: str, hint: str) -> None:
    """Fail with `hint` when the module `name` (a project extra's) is not importable."""
    if importlib.util.find_spec(name) is None:
        missing_tool(hint)


def helm() -> str:
    """The testkit's helm lookup (ministream_testkit.helm), failing with its hint."""
    try:
        return helm_path()
    except FileNotFoundError as err:
        missing_tool(str(err))


def vllm_router() -> Path:
    """vLLM's router: its Python package and its launcher (the `router` extra)."""
    python_module("vllm_router", router.INSTALL_HINT)
    if not router.VLLM_ROUTER.exists():
        missing_tool(router.INSTALL_HINT)
    return router.VLLM_ROUTER
