"""Offline vLLM engine runs of `python -m ministream_reference.golden`, one process each.

`vllm.LLM` needs a `__main__` guard and a fresh process per configuration, so every run is a
subprocess that writes its greedy completions (tokens and top-5 logprobs) to a JSON file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from ministream_sidecar import cpu_memory
from ministream_testkit.vllm_server import IN_PROCESS_ENGINE

MAX_TOKENS = 16


def rank_binding(world: int) -> str:
    """`VLLM_CPU_OMP_THREADS_BIND` for `world` ranks: one core each, round robin over the
    cores there are (docs/architecture.md §3: TP=2 on two cores; 4 ranks on 2 cores share them)."""
    cores = os.cpu_count() or 1
    return "|".join(str(rank % cores) for rank in range(world))


def run_golden(
    model: Path | str,  # a directory or an s3:// URL
    out: Path,
    *,
    tp: int = 1,
    pp: int = 1,
    dtype: str = "float32",
    load_format: str = "auto",
    check: bool = True,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Eager unless `pp > 1`: vLLM 0.32's CPU runner serves pipeline stages only on the
    compiled path (with enforce_eager its PP worker dies on an assertion, built-in Llama
    too)."""
    args = ["--model", str(model), "--out", str(out), "--tp", str(tp), "--pp", str(pp)]
    args += ["--dtype", dtype, "--load-format", load_format, "--max-tokens", str(MAX_TOKENS)]
    args += ["--eager"] if pp == 1 else []
    return run_engine_module("ministream_reference.golden", args, tp * pp, env, check=check)


def run_engine_module(
    module: str,
    args: list[str],
    world: int,
    env: Mapping[str, str] | None = None,
    *,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """`python -m module args` as one offline engine run of `world` ranks; with `check`, a
    failed run fails the test with the end of its output."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        env=engine_env(world, env),
        timeout=1800,
        check=False,
    )
    if check and proc.returncode != 0:
        fail(proc)
    return proc


def engine_env(world: int, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of one offline engine run of `world` ranks on this machine."""
    full = {
        **os.environ,
        **IN_PROCESS_ENGINE,
        **cpu_memory.pinned(),  # next to the tests' other engines
        "VLLM_NO_USAGE_STATS": "1",
        **(env or {}),
    }
    if world > 1:
        full["VLLM_CPU_OMP_THREADS_BIND"] = rank_binding(world)
    return full


def fail(proc: subprocess.CompletedProcess[str]) -> None:
    pytest.fail(
        f"vLLM run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )


def run_lora_golden(
    model: Path, adapters: Mapping[str, Path], out: Path, *, tp: int = 1, max_lora_rank: int = 16
) -> None:
    """`python -m ministream_reference.lora`: every prompt without and with each adapter in
    one engine, with as many adapter slots as adapters (every slot in use)."""
    args = ["--model", str(model)]
    args += [arg for name, path in adapters.items() for arg in ("--adapter", f"{name}={path}")]
    args += ["--out", str(out), "--tp", str(tp), "--max-lora-rank", str(max_lora_rank)]
    run_engine_module("ministream_reference.lora", [*args, "--max-tokens", str(MAX_TOKENS)], tp)
