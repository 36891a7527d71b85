"""scripts/ci_timed.py reads pytest's closing line out of a CI log."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.support.scripts import ScriptImporter


@pytest.fixture
def ci_timed(import_script: ScriptImporter) -> ModuleType:
    return import_script("ci_timed")


def test_the_last_pytest_summary_line_is_taken(ci_timed: ModuleType) -> None:
    log = "\n".join(
        [
            "==== 3 passed in 1.00s ====",
            "lint ok",
            "===== 1158 passed, 12 skipped, 3 warnings in 1234.56s (0:20:34) =====",
        ]
    )
    assert ci_timed.pytest_summary(log) == (
        "1158 passed, 12 skipped, 3 warnings in 1234.56s (0:20:34)"
    )


def test_a_log_without_a_summary_gives_none(ci_timed: ModuleType) -> None:
    assert ci_timed.pytest_summary("make: *** [test] Error 2\n") is None
