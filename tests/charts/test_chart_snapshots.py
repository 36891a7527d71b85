"""Every `ci/` scenario renders exactly as its snapshot in tests/charts/snapshots/.

A refactoring of the templates (a define split, a helper moved between files) must not change
one byte of what a cluster receives; an intended change shows up here as a diff of the rendered
objects, reviewed with the template change in the same commit. After an intended change:

    make chart-snapshots      # = python tests/charts/test_chart_snapshots.py --update
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

import pytest
from chartkit import SCENARIOS, render, scenario_id

SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"


def snapshot_path(scenario: Path) -> Path:
    return SNAPSHOTS / f"{scenario_id(scenario)}.yaml"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=scenario_id)
def test_scenario_renders_as_its_snapshot(scenario: Path) -> None:
    want = snapshot_path(scenario)
    assert want.is_file(), f"no snapshot for {scenario.name}: run make chart-snapshots"
    got = render(scenario).text
    if got != want.read_text():
        diff = difflib.unified_diff(
            want.read_text().splitlines(), got.splitlines(), "snapshot", "rendered", lineterm=""
        )
        pytest.fail(
            f"{scenario.name} renders differently from {want.name} (if intended: make "
            "chart-snapshots):\n" + "\n".join(list(diff)[:60]),
            pytrace=False,
        )


def test_every_snapshot_has_a_scenario() -> None:
    assert sorted(p.name for p in SNAPSHOTS.glob("*.yaml")) == sorted(
        snapshot_path(s).name for s in SCENARIOS
    )


def update() -> None:
    SNAPSHOTS.mkdir(exist_ok=True)
    for stale in SNAPSHOTS.glob("*.yaml"):
        stale.unlink()
    for scenario in SCENARIOS:
        snapshot_path(scenario).write_text(render(scenario).text)
        print(f"wrote {snapshot_path(scenario)}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python tests/charts/test_chart_snapshots.py --update")
    update()
