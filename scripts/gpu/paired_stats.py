"""The GPU scripts' name for the project's one statistics module, scripts/interval_stats.py
(which interval for which comparison): they import their siblings by bare name from this
folder. Nothing is defined here."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from interval_stats import (
    bootstrap_median_ci,
    fmt_pair_range,
    fmt_ratio,
    instance_pair_range,
    instance_ratio_summary,
    ratio_summary,
)

__all__ = [
    "bootstrap_median_ci",
    "fmt_pair_range",
    "fmt_ratio",
    "instance_pair_range",
    "instance_ratio_summary",
    "ratio_summary",
]
