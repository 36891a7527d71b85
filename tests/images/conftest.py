"""Fixtures of the image tests: the project's images, built by `scripts/images.py` (what
`make images` runs) with buildah, and podman configured the way that script configures it.

The build reuses the layer cache and the bootstrapped base: in `make test` the images were
built a moment before by `make images`, so the fixture only confirms them (~1 min); from a
cold machine it builds them (~10-15 min on the 2-core reference machine, docs/images.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from imagekit import OCI_TOOLS, ROOT, load_images_script

from tests.support import tools


@pytest.fixture(scope="session")
def images_script() -> ModuleType:
    return load_images_script()


@pytest.fixture(scope="session")
def oci_env(images_script: ModuleType) -> Iterator[dict[str, str]]:
    """CONTAINERS_CONF / CONTAINERS_STORAGE_CONF of this host, set for the session."""
    if os.geteuid() != 0:  # the `root` marker skips first; this guards direct fixture use
        pytest.skip("needs root: buildah --isolation chroot and podman with runc")
    missing = [tool for tool in OCI_TOOLS if shutil.which(tool) is None]
    if missing:
        tools.missing_tool(
            f"{missing} not installed: run scripts/install_oci.sh (scripts/setup.sh test)"
        )
    env = images_script.oci_env()
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        yield env


@pytest.fixture(scope="session")
def built_images(oci_env: dict[str, str], images_script: ModuleType) -> dict[str, Any]:
    """Every image `make images` builds, built or confirmed now; the build report."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "images.py"), "build"],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report: dict[str, Any] = json.loads(images_script.REPORT.read_text())
    return report
