"""Paired ratios and their bootstrap confidence interval (standard library only).

Used by forward_parity.py and fp8_compare.py: each round times engine X and a reference
engine R back to back, so the round's ratio X/R cancels the machine's slow drift; the
median of the rounds' ratios is the estimate and a percentile bootstrap over rounds its
95 % interval.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from typing import Any


def bootstrap_median_ci(
    values: Sequence[float], *, level: float = 0.95, resamples: int = 4000, seed: int = 0
) -> tuple[float, float]:
    """Percentile-bootstrap interval of the median (rounds resampled with replacement)."""
    if not values:
        raise ValueError("no values")
    if len(values) == 1:
        return values[0], values[0]
    rng = random.Random(seed)
    n = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(resamples))
    lo = medians[int((1 - level) / 2 * (resamples - 1))]
    hi = medians[int((1 + level) / 2 * (resamples - 1))]
    return lo, hi


def ratio_summary(
    numerator: Sequence[float], denominator: Sequence[float], resamples: int = 4000
) -> dict[str, Any]:
    """Per-round ratios numerator/denominator: median, 95 % CI, range, count."""
    ratios = [a / b for a, b in zip(numerator, denominator, strict=True) if b > 0]
    if not ratios:
        return {"n": 0}
    lo, hi = bootstrap_median_ci(ratios, resamples=resamples)
    return {
        "n": len(ratios),
        "median": statistics.median(ratios),
        "ci95": [lo, hi],
        "min": min(ratios),
        "max": max(ratios),
        "ratios": ratios,
    }


def fmt_ratio(summary: dict[str, Any]) -> str:
    """`1.003 [0.998, 1.007]` — median and 95 % interval."""
    if not summary.get("n"):
        return "n/a"
    lo, hi = summary["ci95"]
    return f"{summary['median']:.3f} [{lo:.3f}, {hi:.3f}]"
