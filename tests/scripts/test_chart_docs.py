"""scripts/chart_docs.py: the values table of charts/ministream/README.md is generated from
values.yaml and up to date, and the check fails on a value without its comment."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.scripts import SCRIPTS


def test_readme_values_table_is_up_to_date() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "chart_docs.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr


def test_docs_check_catches_an_undocumented_value(tmp_path: Path) -> None:
    chart = tmp_path / "ministream"
    shutil.copytree(SCRIPTS.parent / "charts" / "ministream", chart)
    values = chart / "values.yaml"
    values.write_text(values.read_text() + "\nundocumentedKnob: 3\n")
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "chart_docs.py"), "--check", "--chart", str(chart)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and "undocumentedKnob" in proc.stderr


def test_a_continuation_line_that_starts_with_a_flag_stays_in_its_description(
    tmp_path: Path,
) -> None:
    """Only `# -- ` opens a description: a wrapped line starting `# --query...` continues it."""
    chart = tmp_path / "ministream"
    shutil.copytree(SCRIPTS.parent / "charts" / "ministream", chart)
    values = chart / "values.yaml"
    knob = "# -- (float) GiB of one device (`nvidia-smi\n# --query-gpu=memory.total` prints MiB).\n"
    values.write_text(f"{values.read_text()}\n{knob}wrappedKnob: null\n")
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "chart_docs.py"), "--chart", str(chart)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    row = next(r for r in (chart / "README.md").read_text().splitlines() if "`wrappedKnob`" in r)
    want = "GiB of one device (`nvidia-smi --query-gpu=memory.total` prints MiB)."
    assert row == f"| `wrappedKnob` | float | `null` | {want} |"
