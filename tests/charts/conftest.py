"""Fixtures of the chart tests (helpers live in chartkit.py, a unique module name)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chartkit import SCENARIOS, Rendered, render, scenario_id, scenario_values


@pytest.fixture(params=SCENARIOS, ids=scenario_id)
def scenario(request: pytest.FixtureRequest) -> Path:
    return request.param


@pytest.fixture
def rendered(scenario: Path) -> Rendered:
    return render(scenario)


@pytest.fixture
def values(scenario: Path) -> dict[str, Any]:
    return scenario_values(scenario)
