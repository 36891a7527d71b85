"""The project's one statistics module: which interval for which comparison (standard
library only; the GPU host's scripts import it too).

One engine instance's figure carries an offset of its own (memory placement, thread layout,
compiled kernels, what the scheduler happened to batch) that its rounds do not average out:
an interval over rounds of one instance per side is an interval for that pair of instances,
not for the model code (docs/benchmarks.md, the H200 A/A controls). Hence one method per kind
of comparison, each read beside an A/A control made the same way:

Which interval for which comparison:
- **Engine instances (or replica sets, or process starts) created in blocks**, one of every
  side per block with the order rotated (`creation_order`): the geometric mean of the blocks'
  paired ratios with a t-interval of their logs over blocks (`paired_ratio_interval`); a
  difference only when it excludes 1.0 and lies outside the A/A spread (`aa_spread`,
  `verdict`). Differences in seconds between back-to-back starts (`cold_start.py pairs`):
  the same t-interval on the differences (`paired_difference_interval`). bench_plugin.py,
  bench_routing.py (its rounds are blocks over one replica set: the interval covers rounds,
  not replica starts), cold_start.py.
- **Engine instances not created in blocks, or too few for an interval** (forward_parity.py
  --instances, whose engines start kind by kind): the ratio of the kinds' means with the
  lowest and highest of all instance pairs' ratios (`instance_pair_range`), stated as a range,
  not an interval.
- **Rounds of one instance pair** (forward_parity.py with one engine per kind, fp8_compare.py,
  kv_offload.py): the median of the rounds' paired ratios with a percentile bootstrap over
  rounds (`ratio_summary`). It says how well that one pair was measured, nothing about another
  pair; read it only beside the A/A of the same method.

`instance_ratio_summary` (a two-level percentile bootstrap over instances) is superseded and
kept only for the scripts written against it; scripts/gpu/paired_stats.py re-exports this
module under its old name for the GPU scripts, which import their siblings by bare name.

Why a t-interval and not a bootstrap over instances: with three instances a percentile
bootstrap has ten distinct resamples and cannot be wider than the observed ratios, so it
covers far less than its nominal 95 % (the failure it is meant to fix). The log makes A/B
and B/A reciprocal; pairing by block cancels the machine's drift over the run (a block's
instances run minutes apart, the first and last block tens of minutes).
"""

from __future__ import annotations

import math
import random
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


def paired_difference_interval(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """a - b over pairs (a[k], b[k]) in their own unit (seconds): mean difference and its
    t-interval over pairs, the median difference and how many pairs came out lower for a."""
    if len(a) != len(b):
        raise ValueError(f"unpaired: {len(a)} vs {len(b)}")
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    mean = statistics.fmean(diffs)
    half = t975(len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return {
        "n": len(diffs),
        "mean": mean,
        "ci95": [mean - half, mean + half],
        "median": statistics.median(diffs),
        "a_lower": sum(d < 0 for d in diffs),
        "diffs": diffs,
    }


def instance_pair_range(
    numerator: Sequence[Sequence[float]], denominator: Sequence[Sequence[float]]
) -> dict[str, Any]:
    """Two groups of engine instances, each timed over rounds: the ratio of the groups' means
    of their instances' medians, and the lowest and highest ratio of one numerator instance's
    median to one denominator instance's (every pair). A range, not an interval: for instances
    not created in blocks, or too few of them (module docstring)."""
    if not numerator or not denominator or not all([*numerator, *denominator]):
        raise ValueError("each side needs at least one instance with at least one round")
    num = [statistics.median(v) for v in numerator]
    den = [statistics.median(v) for v in denominator]
    pairs = [x / y for x in num for y in den]
    return {
        "instances": [len(num), len(den)],
        "median": statistics.fmean(num) / statistics.fmean(den),
        "pairs_min": min(pairs),
        "pairs_max": max(pairs),
        "instance_medians": [num, den],
    }


def fmt_pair_range(summary: dict[str, Any]) -> str:
    """`1.000 (0.998–1.002)`: the estimate and the range of the instance pairs' ratios."""
    return f"{summary['median']:.3f} ({summary['pairs_min']:.3f}–{summary['pairs_max']:.3f})"


def instance_ratio_summary(
    numerator: Sequence[Sequence[float]],
    denominator: Sequence[Sequence[float]],
    *,
    resamples: int = 4000,
    seed: int = 0,
) -> dict[str, Any]:
    """Superseded: a two-level percentile bootstrap over engine instances, kept for the scripts
    written against it (scripts/gpu/paired_stats.py re-exports it). With 3-4 instances a side it
    undercovers (module docstring), so a figure for the docs is `instance_pair_range` or, for
    instances created in blocks, `paired_ratio_interval` over the blocks.

    The ratio of two groups of engine *instances*, each timed over the same rounds.

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


# ---- rounds of one instance pair


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
    """Per-round ratios numerator/denominator of one instance pair: median, 95 % bootstrap
    interval over rounds, range, count."""
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
