"""The one helm lookup and the one `helm template` call of the tests, benchmarks and the
load-test tools.

The lookup, in order: the binary the caller names (`--helm`), the project's own pinned helm
(`.tools/bin/helm`, installed by scripts/install_tools.sh) in this checkout or under the
working directory, then helm on PATH. A missing helm is an error, never a skip: CI installs it
first, so absence is a broken set-up.

Every render names the release `RELEASE`: the chart's object names and its release selectors
carry it (`ms-ministream`, `app.kubernetes.io/instance=ms`), and the chart snapshots
(tests/charts/snapshots) are rendered with it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict, Unpack

import yaml

_REPO = Path(__file__).resolve().parents[2]
REPO_HELM = _REPO / ".tools" / "bin" / "helm"
_CWD_HELM = Path(".tools") / "bin" / "helm"
CHART = _REPO / "charts" / "ministream"
RELEASE = "ms"
# Generous: on a loaded 2-core runner one render took over 120 s while engines started.
_TIMEOUT_SECONDS = 600


class RenderError(Exception):
    """`helm template` refused the chart or its values; the message is helm's."""


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


class RenderOptions(TypedDict, total=False):
    set_args: Sequence[str]  # `--set key=value` each (helm's own typing of the value)
    namespace: str | None
    extra: Sequence[str]  # further helm arguments
    helm: str | None  # the binary; None: helm_path's lookup


def render_text(
    chart: Path | str = CHART,
    values_files: Sequence[Path | str] = (),
    sets: Mapping[str, Any] | None = None,
    **options: Unpack[RenderOptions],
) -> str:
    """`helm template RELEASE chart` with values files (in order), `sets` as `--set-json
    key=<value as JSON>` and the `options`. Raises RenderError with helm's message."""
    cmd = [helm_path(options.get("helm")), "template", RELEASE, str(chart)]
    cmd += options.get("extra", ())
    if (namespace := options.get("namespace")) is not None:
        cmd += ["--namespace", namespace]
    for f in values_files:
        cmd += ["-f", str(f)]
    for key, value in (sets or {}).items():
        cmd += ["--set-json", f"{key}={json.dumps(value)}"]
    for s in options.get("set_args", ()):
        cmd += ["--set", s]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT_SECONDS)
    if proc.returncode != 0:
        raise RenderError(proc.stderr.strip())
    return proc.stdout


def documents(text: str) -> list[dict[str, Any]]:
    """The objects of a rendering (empty documents dropped)."""
    return [d for d in yaml.safe_load_all(text) if d]


def render(
    chart: Path | str = CHART,
    values_files: Sequence[Path | str] = (),
    sets: Mapping[str, Any] | None = None,
    **options: Unpack[RenderOptions],
) -> list[dict[str, Any]]:
    """Every object `render_text` renders."""
    return documents(render_text(chart, values_files, sets, **options))
