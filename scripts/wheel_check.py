#!/usr/bin/env python3
"""`make wheel-check`: build the wheel, install it (not editable) into a fresh virtual
environment and run every console script's main path there, from outside the repository.

What it proves: the wheel carries every module and data file its commands read (bundled
scenarios through importlib.resources, no path into a source checkout), its entry points
resolve, and each command imports what it loads from the fresh environment, not the
editable install of .venv.

1. copies what the build reads (pyproject.toml, README.md, the package folders listed in
   [tool.setuptools.packages.find] `where`) to a temporary folder, so stale `build/` or
   `*.egg-info` leftovers of the checkout cannot leak into the wheel, and builds it there;
2. creates a fresh venv (no system site-packages) and installs the wheel with the `sidecar`
   extra and the `loadtest` extra's own requirements; the `cpu` engine the `loadtest` extra
   also pulls (vLLM + torch, ~3.7 GB, measured 206 s to install on 2 vCPUs) is left out: no
   command run here imports it, and the docker-image tests resolve that extra;
3. runs `ministream --help`, `ministream up --help`, `ministream-loadtest run --help`,
   `ministream-loadtest run --scenario short-chat --dry-run` (a bundled scenario loaded from
   the installed package) and `ministream-sidecar --help`, with the temporary folder as the
   working directory and PYTHONPATH unset, and checks that every module they import lives
   in the fresh venv.

    scripts/wheel_check.py [--keep]     --keep: leave the temporary folder for inspection
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _step(message: str, started: float) -> None:
    print(f"wheel-check [{time.monotonic() - started:5.1f}s] {message}", flush=True)


def _run(cmd: Sequence[str | Path], *, cwd: Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0:
        raise SystemExit(
            f"wheel-check: {' '.join(map(str, cmd))} exited {proc.returncode}\n"
            f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        )
    return proc.stdout


def build_wheel(work: Path) -> Path:
    """The wheel, built from a copy of exactly what the build reads."""
    # setuptools' own reader (the build needs setuptools anyway; tomllib is Python 3.11+).
    from setuptools.config.pyprojecttoml import read_configuration

    pyproject = read_configuration(ROOT / "pyproject.toml", expand=False)
    project = pyproject["project"]
    folders = pyproject["tool"]["setuptools"]["packages"]["find"]["where"]
    src = work / "src"
    src.mkdir()
    for name in ["pyproject.toml", project["readme"], *folders]:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(
                path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
            )
        else:
            shutil.copy2(path, src / name)
    dist = work / "dist"
    # No build isolation: .venv has the build backend (setuptools), and the isolated build
    # environment would cost an install from the index on every run.
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    _run([*pip_wheel, "-q", "--wheel-dir", dist, src], cwd=work)
    (wheel,) = dist.glob("*.whl")
    return wheel


def top_level_packages(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    return sorted(n.split("/")[0] for n in names if re.fullmatch(r"[^/]+/__init__\.py", n))


def extra_requirements(wheel: Path, extra: str) -> list[str]:
    """The requirements an extra adds beyond other extras of this distribution (METADATA)."""
    with zipfile.ZipFile(wheel) as zf:
        (meta,) = (n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req, _, marker = line.removeprefix("Requires-Dist:").strip().partition(";")
        if re.search(rf"extra\s*==\s*['\"]{extra}['\"]", marker) and not req.startswith(
            "ministream-serving"
        ):
            out.append(req.strip())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="ministream-wheel-check-"))
    try:
        wheel = build_wheel(work)
        _step(f"built {wheel.name}", started)

        venv = work / "venv"
        _run([sys.executable, "-m", "venv", venv], cwd=work)
        bin_dir = venv / "bin"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        env.update(VIRTUAL_ENV=str(venv), PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}")
        env["COLUMNS"] = "1000"  # argparse wraps help at hyphens: keep `short-chat` whole
        loadtest_reqs = extra_requirements(wheel, "loadtest")
        # No .pyc compilation: it is most of the CPU an install costs, and proves nothing here.
        _run(
            [bin_dir / "python", "-m", "pip", "install", "-q", f"{wheel}[sidecar]", *loadtest_reqs],
            cwd=work,
            env={**env, "PIP_NO_COMPILE": "1"},
        )
        _step(f"installed it with [sidecar] and {', '.join(loadtest_reqs)} into {venv}", started)

        site = Path(
            _run(
                [
                    bin_dir / "python",
                    "-c",
                    "import sysconfig; print(sysconfig.get_path('purelib'))",
                ],
                cwd=work,
                env=env,
            ).strip()
        )
        checks: list[tuple[list[str | Path], str]] = [
            ([bin_dir / "ministream", "--help"], "COMMAND"),
            ([bin_dir / "ministream", "up", "--help"], "--sidecar-port"),
            ([bin_dir / "ministream-loadtest", "run", "--help"], "short-chat"),
            (
                [bin_dir / "ministream-loadtest", "run", "--scenario", "short-chat", "--dry-run"],
                str(site / "ministream_loadtest" / "scenario_files" / "short-chat.yaml"),
            ),
            ([bin_dir / "ministream-sidecar", "--help"], "MINISTREAM_SIDECAR_PORT"),
        ]
        for cmd, expect in checks:
            out = _run(cmd, cwd=work, env=env)
            if expect not in out:
                raise SystemExit(
                    f"wheel-check: {cmd[0]} {cmd[1:]} did not print {expect!r}:\n{out}"
                )
            _step(f"ok: {Path(cmd[0]).name} {' '.join(map(str, cmd[1:]))}", started)

        packages = top_level_packages(wheel)
        probe = "; ".join(f"print({p}.__file__)" for p in packages)
        files = _run(
            [bin_dir / "python", "-c", f"import {', '.join(packages)}; {probe}"], cwd=work, env=env
        ).split()
        outside = [f for f in files if not Path(f).is_relative_to(site)]
        if outside:
            raise SystemExit(f"wheel-check: imported from outside the fresh venv: {outside}")
        _step(f"ok: {', '.join(packages)} all import from {site}", started)
    finally:
        if args.keep:
            print(f"wheel-check: kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    _step("passed", started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
