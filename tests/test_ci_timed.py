"""scripts/ci_timed.py reads pytest's closing line out of a CI log."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ci_timed.py"


def _module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("ci_timed", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_last_pytest_summary_line_is_taken() -> None:
    log = "\n".join(
        [
            "==== 3 passed in 1.00s ====",
            "lint ok",
            "===== 1158 passed, 12 skipped, 3 warnings in 1234.56s (0:20:34) =====",
        ]
    )
    assert _module().pytest_summary(log) == (
        "1158 passed, 12 skipped, 3 warnings in 1234.56s (0:20:34)"
    )


def test_a_log_without_a_summary_gives_none() -> None:
    assert _module().pytest_summary("make: *** [test] Error 2\n") is None
