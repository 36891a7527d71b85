"""Statistics over engine instances for scripts/bench_plugin.py (standard library only).

One engine instance's throughput carries an offset of its own (memory placement, thread
layout, what the scheduler happened to batch) that its rounds do not average out: an
interval over rounds of one instance per side is an interval for that pair of instances,
not for the model code (docs/benchmarks.md, the H200 A/A controls). So the unit here is
the instance: each side has several fresh instances, created in blocks (one instance of
every side per block, the order rotated between blocks), and a comparison is made over
the blocks' paired ratios.

The interval is a t-interval of the paired log-ratios (n - 1 degrees of freedom), not a
bootstrap: with three instances a percentile bootstrap has ten distinct resamples and
cannot be wider than the observed ratios, so it covers far less than its nominal 95 %
(the failure it is meant to fix). The log makes A/B and B/A reciprocal; pairing by block
cancels the machine's drift over the run (a block's instances run minutes apart, the
first and last block tens of minutes).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

# Two-sided 95 % quantiles of Student's t, t(0.975, df) for df = 1..30.
# fmt: off
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)
# fmt: on
DIFFERENCE = "difference"
NO_DIFFERENCE = "no difference resolved"


def t975(df: int) -> float:
    """t(0.975, df); past the table, the normal quantile with its first 1/df correction."""
    if df < 1:
        raise ValueError("a t-interval needs at least two pairs (df >= 1)")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df)


@dataclass(frozen=True)
class RatioInterval:
    """A ratio over paired instances: geometric mean of the pairs' ratios and its 95 % CI."""

    ratio: float
    lo: float
    hi: float
    pair_ratios: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.pair_ratios)

    def excludes_one(self) -> bool:
        return self.hi < 1.0 or self.lo > 1.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"n": self.n, "ci95": [self.lo, self.hi]}


def paired_ratio_interval(a: Sequence[float], b: Sequence[float]) -> RatioInterval:
    """Ratio a/b over pairs (a[k], b[k]): exp of the mean log-ratio and its t-interval."""
    if len(a) != len(b):
        raise ValueError(f"unpaired: {len(a)} vs {len(b)} instances")
    if min([*a, *b], default=0.0) <= 0:
        raise ValueError("ratios need positive figures")
    logs = [math.log(x / y) for x, y in zip(a, b, strict=True)]
    mean = statistics.fmean(logs)
    half = t975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return RatioInterval(
        ratio=math.exp(mean),
        lo=math.exp(mean - half),
        hi=math.exp(mean + half),
        pair_ratios=tuple(math.exp(x) for x in logs),
    )


def aa_spread(aa: RatioInterval) -> tuple[float, float]:
    """The ratios an A/A comparison of this method reaches, made symmetric around 1.0.

    Both sides of an A/A run the same code, so any distance from 1.0 (its interval's ends,
    each pair's ratio) is what this method produces without a difference; the spread is
    1.0 give or take the largest such distance, in either direction (an A/A that came out
    at 1.04 says a 0.96 is as reachable by chance as a 1.04).
    """
    reach = max(max(x, 1 / x) for x in (aa.lo, aa.hi, *aa.pair_ratios))
    return 1 / reach, reach


def verdict(ab: RatioInterval, spread: tuple[float, float]) -> str:
    """A difference only when the A/B interval excludes 1.0 AND its ratio lies outside the
    A/A spread; anything else is "no difference resolved"."""
    lo, hi = spread
    if ab.excludes_one() and not lo <= ab.ratio <= hi:
        return DIFFERENCE
    return NO_DIFFERENCE


def resolved_below(ab: RatioInterval, spread: tuple[float, float], target: float) -> bool:
    """A/B is resolved below `target`: a resolved difference downwards whose whole interval
    lies below the target (one whose interval reaches the target is not)."""
    return verdict(ab, spread) == DIFFERENCE and ab.ratio < 1 and ab.hi < target


def creation_order(instances: int, sides: Sequence[str]) -> list[tuple[int, str]]:
    """(block, side) in the order instances are created: block k holds one instance of
    every side, the sides rotated by k (a Latin square over each len(sides) blocks), so
    every side is created first, in the middle and last equally often and a side's
    instance k comes before another's in some blocks and after it in others."""
    if instances < 1 or not sides:
        raise ValueError("need at least one instance and one side")
    s = len(sides)
    return [(k, sides[(k + i) % s]) for k in range(instances) for i in range(s)]
