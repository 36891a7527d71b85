"""The one helm lookup of the tests, benchmarks and the load-test tools.

In order: the binary the caller names (`--helm`), the project's own pinned helm
(`.tools/bin/helm`, installed by scripts/install_tools.sh) in this checkout or under the
working directory, then helm on PATH. A missing helm is an error, never a skip: CI installs it
first, so absence is a broken set-up.
"""

from __future__ import annotations

import shutil
from pathlib import Path

REPO_HELM = Path(__file__).resolve().parents[2] / ".tools" / "bin" / "helm"
_CWD_HELM = Path(".tools") / "bin" / "helm"


def helm_path(explicit: str | None = None) -> str:
    if explicit:
        return explicit
    for candidate in (REPO_HELM, _CWD_HELM):
        if candidate.is_file():
            return str(candidate)
    if found := shutil.which("helm"):
        return found
    raise FileNotFoundError(
        "helm not found: pass --helm PATH, put helm on PATH, or run scripts/install_tools.sh "
        "in the project checkout (it installs helm into .tools/bin)"
    )
