"""The helm binary the tests and benchmarks render the chart with: the project's own
(`.tools/bin/helm`, installed by scripts/install_tools.sh) in a checkout, else helm on PATH.
A missing helm is an error, never a skip: CI installs it first, so absence is a broken set-up.
"""

from __future__ import annotations

import shutil
from pathlib import Path

REPO_HELM = Path(__file__).resolve().parents[2] / ".tools" / "bin" / "helm"


def helm_path() -> str:
    if REPO_HELM.is_file():
        return str(REPO_HELM)
    if found := shutil.which("helm"):
        return found
    raise FileNotFoundError(
        "helm not found: run scripts/install_tools.sh (installs helm into .tools/bin)"
    )
