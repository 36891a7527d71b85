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


def instance_ratio_summary(
    numerator: Sequence[Sequence[float]],
    denominator: Sequence[Sequence[float]],
    *,
    resamples: int = 4000,
    seed: int = 0,
) -> dict[str, Any]:
    """The ratio of two groups of engine *instances*, each timed over the same rounds.

    `numerator[i][r]` is instance i's figure in round r (likewise `denominator`). An
    instance's figure is its median over rounds; a group's is the mean of its instances'.
    The estimate is mean(numerator) / mean(denominator). The 95 % interval is a two-level
    percentile bootstrap: instances resampled with replacement within each group (what
    differs between engine starts), and rounds resampled together for every instance (the
    rounds stay paired, so drift still cancels). With one instance per side the first level
    does nothing and the interval only says how well that one pair was measured.
    """
    if not numerator or not denominator:
        raise ValueError("each side needs at least one instance")
    rounds = {len(v) for v in (*numerator, *denominator)}
    if len(rounds) != 1 or 0 in rounds:
        raise ValueError(f"every instance needs the same, non-zero number of rounds: {rounds}")
    (n_rounds,) = rounds

    def estimate(num: Sequence[int], den: Sequence[int], rows: Sequence[int]) -> float:
        def group(side: Sequence[Sequence[float]], picks: Sequence[int]) -> float:
            return statistics.fmean(statistics.median(side[i][r] for r in rows) for i in picks)

        return group(numerator, num) / group(denominator, den)

    every = range(n_rounds)
    point = estimate(range(len(numerator)), range(len(denominator)), every)
    rng = random.Random(seed)
    draws = sorted(
        estimate(
            rng.choices(range(len(numerator)), k=len(numerator)),
            rng.choices(range(len(denominator)), k=len(denominator)),
            rng.choices(every, k=n_rounds),
        )
        for _ in range(resamples)
    )
    per_pair = [statistics.median(a) / statistics.median(b) for a in numerator for b in denominator]
    return {
        "instances": [len(numerator), len(denominator)],
        "rounds": n_rounds,
        "median": point,  # the estimate (named as ratio_summary's, for fmt_ratio)
        "ci95": [draws[int(0.025 * (resamples - 1))], draws[int(0.975 * (resamples - 1))]],
        "pairs_min": min(per_pair),
        "pairs_max": max(per_pair),
        "instance_medians": [
            [statistics.median(v) for v in numerator],
            [statistics.median(v) for v in denominator],
        ],
        "n": n_rounds,
    }
