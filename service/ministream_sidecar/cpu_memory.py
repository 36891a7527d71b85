"""How much host memory vLLM's CPU build gets for its KV cache when the user did not say.

vLLM 0.32's CPU worker (vllm/v1/worker/cpu_worker.py) has two ways to size the KV cache:

- `VLLM_CPU_KVCACHE_SPACE=<GiB>` (or `--kv-cache-memory-bytes`): exactly that much. The
  platform turns the variable into `kv_cache_memory_bytes`, which also wins over
  `--gpu-memory-utilization`; at allocation the worker only checks that the size fits the
  memory available then.
- otherwise `--gpu-memory-utilization` (default 0.92) of the memory node's total is reserved
  for the worker, and the worker refuses to start unless that much is available at once.
  "Available" is MemFree + file pages + reclaimable slab of the NUMA node it binds to, and,
  under a cgroup limit, at most the limit minus the cgroup's usage, which counts the page
  cache charged to it. So 0.92 fails wherever other processes (or, in a container, the
  page cache) hold more than 8 % of the memory: a shared workstation, a CI machine, a pod.

The rule here (`default_gib`): a quarter of the memory available as vLLM counts it, whole
GiB, at least 1 and at most 8. A quarter leaves the rest for what the engine allocates
besides the cache (weights, activations, its processes) and for everyone else, since the
worker zero-fills the whole cache at start; 1 GiB holds ~43k tokens of the bfloat16 demo
model (21 sequences of 2048), and a cache above 8 GiB should be a deliberate choice. The
user's own `VLLM_CPU_KVCACHE_SPACE` (set at all, even empty, which vLLM ignores),
`--gpu-memory-utilization` or `--kv-cache-memory-bytes` always wins, and nothing is set for
a build that is not the CPU one. docs/sidecar.md describes it for users.

Standard library only: the launcher and the CPU image's entrypoint use it before vLLM (or
torch) is imported, and the sidecar package imports neither.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ministream.versions import is_cpu_build

ENV = "VLLM_CPU_KVCACHE_SPACE"
GiB = 1 << 30
MIN_GIB = 1  # vLLM reads whole GiB, and an empty cache serves nothing
MAX_GIB = 8
AVAILABLE_SHARE = 4  # one quarter of the available memory
# Engines that share a machine with others (the tests' servers, the load tests' pods): a
# fixed small cache, so that several fit side by side whatever this machine has free.
SHARED_MACHINE_GIB = 1
# The flags that size vLLM's CPU memory themselves.
SIZING_FLAGS = ("--gpu-memory-utilization", "--kv-cache-memory-bytes")
# cgroup v1 reports "no limit" as a number close to 2**63 (vLLM treats >= 2**62 so).
_CGROUP_V1_UNLIMITED = 1 << 62


@dataclass(frozen=True)
class MemoryView:
    """Host memory as vLLM's CPU worker counts it at start (bytes)."""

    total: int
    available: int

    @classmethod
    def read(cls, root: Path = Path("/")) -> MemoryView:
        """vLLM's `get_memory_node_info` for the node of this process's first CPU, also
        capped by the kernel's MemAvailable (where a NUMA node claims more than that)."""
        proc = _meminfo(root / "proc/meminfo")
        total = proc["MemTotal"]
        available = proc.get("MemAvailable", proc["MemFree"])
        node = _meminfo(root / f"sys/devices/system/node/node{_first_cpu_node(root)}/meminfo")
        if node:
            total = node["MemTotal"]
            available = min(
                available,
                node["MemFree"]
                + node["Active(file)"]
                + node["Inactive(file)"]
                + node.get("SReclaimable", 0),
            )
        limit, usage = _cgroup(root)
        if limit is not None and limit < total:
            total = limit
            available = max(0, min(available, limit - (usage or 0)))
        return cls(total=total, available=available)


def default_gib(available: int) -> int:
    """The KV cache (GiB) for an engine started with `available` bytes free (module doc)."""
    return max(MIN_GIB, min(MAX_GIB, available // AVAILABLE_SHARE // GiB))


def user_sizing(env: Mapping[str, str], vllm_args: Sequence[str]) -> str | None:
    """The setting by which the user sized vLLM's CPU memory themselves, or None."""
    if ENV in env:
        return f"{ENV}={env[ENV]}"
    for arg in vllm_args:
        name = arg.split("=", 1)[0].replace("_", "-")  # vLLM accepts either spelling
        if name in SIZING_FLAGS:
            return name
    return None


def kv_cache_env(
    env: Mapping[str, str],
    vllm_args: Sequence[str],
    *,
    gib: int | None = None,
    view: MemoryView | None = None,
) -> dict[str, str]:
    """What to add to `env` for a vLLM started with `vllm_args`: `VLLM_CPU_KVCACHE_SPACE`
    of `gib` (default: the rule, from `view` or this machine), or nothing when the user
    sized it or the build is not the CPU one."""
    if user_sizing(env, vllm_args) is not None or not is_cpu_build():
        return {}
    if gib is None:
        gib = default_gib((view or MemoryView.read()).available)
    return {ENV: str(gib)}


def pinned(gib: int = SHARED_MACHINE_GIB) -> dict[str, str]:
    """A fixed cache size regardless of the environment (tests that need the same memory
    use on every machine)."""
    return {ENV: str(gib)}


def describe(gib: int, view: MemoryView) -> str:
    return (
        f"KV cache {gib} GiB ({ENV}; a quarter of the {view.available / GiB:.1f} GiB "
        f"available, {MIN_GIB}..{MAX_GIB}); set {ENV}=<GiB> or vLLM's "
        "--gpu-memory-utilization to choose"
    )


def view_in(reason: str) -> MemoryView | None:
    """The memory vLLM's refusal saw, `Available memory on node 0 (10.64/12.46 GiB) ...`:
    it counts vLLM's own processes, which are gone once it exited."""
    found = re.search(r"Available memory on node \d+ \(([\d.]+)/([\d.]+) GiB\)", reason)
    if found is None:
        return None
    available, total = (int(float(x) * GiB) for x in found.groups())
    return MemoryView(total=total, available=available)


def advice(view: MemoryView) -> str:
    """What to set after vLLM refused for memory, for the memory `view` shows free."""
    share = math.floor((view.available / max(view.total, 1) - 0.05) * 20) / 20
    return (
        f"set {ENV}={default_gib(view.available)} (GiB for the KV cache) or pass "
        f"`-- --gpu-memory-utilization {max(share, 0.05):.2f}` "
        f"({view.available / GiB:.1f} of {view.total / GiB:.1f} GiB available)"
    )


def _meminfo(path: Path) -> dict[str, int]:
    """`Key: N kB` lines (a node's file prefixes them with `Node N`) in bytes; {} if absent."""
    values: dict[str, int] = {}
    try:
        text = path.read_text()
    except OSError:
        return values
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            scale = 1024 if fields[1:] == ["kB"] else 1
            values[key.split()[-1]] = int(fields[0]) * scale
    return values


def _first_cpu_node(root: Path) -> int:
    """The NUMA node of the lowest CPU this process may run on: the node vLLM binds to."""
    cpu = min(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    for entry in sorted((root / f"sys/devices/system/cpu/cpu{cpu}").glob("node[0-9]*")):
        return int(entry.name[4:])
    return 0


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):  # absent, or "max" (cgroup v2 without a limit)
        return None


def _cgroup(root: Path) -> tuple[int | None, int | None]:
    """(limit, usage) of this process's memory cgroup, read where vLLM reads them."""
    cgroup = root / "sys/fs/cgroup"
    if (limit := _read_int(cgroup / "memory.max")) is not None:
        return limit, _read_int(cgroup / "memory.current")
    limit = _read_int(cgroup / "memory/memory.limit_in_bytes")
    if limit is None or limit >= _CGROUP_V1_UNLIMITED:
        return None, None
    return limit, _read_int(cgroup / "memory/memory.usage_in_bytes")
