"""Helpers of the image tests (a unique module name: conftest.py files share one)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
OCI_TOOLS = ("buildah", "podman", "runc", "mmdebstrap")


def load_images_script() -> ModuleType:
    """scripts/images.py as a module (scripts/ is not a package)."""
    name = "ministream_images_script"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "images.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def podman(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)


def run_in(
    image: str, command: str, *, user: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`sh -c command` in a throwaway container of `image` (read-only root filesystem)."""
    args = ["run", "--rm", "--read-only", "--entrypoint", "sh"]
    if user:
        args += ["--user", user]
    return podman(*args, image, "-c", command)
