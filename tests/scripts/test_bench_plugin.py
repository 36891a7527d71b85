"""scripts/bench_plugin.py: the plugin vs built-in Llama over fresh engine instances.

Unit tests hold the statistics (the interval over instances, the A/A spread, the verdict
rule, the creation order) to hand-computed values; the `engine` test runs the script on
the tiny model with two instances per side and checks what it writes, never its speed.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ministream_testkit.vllm_server import IN_PROCESS_ENGINE
from tests.support.scripts import SCRIPTS, ScriptImporter


@pytest.fixture
def script(import_script: ScriptImporter) -> ModuleType:
    return import_script("bench_plugin")


@pytest.fixture
def stats(import_script: ScriptImporter) -> ModuleType:
    return import_script("interval_stats")


def test_t_quantiles(stats: ModuleType) -> None:
    assert stats.t975(2) == pytest.approx(4.303)
    assert stats.t975(30) == pytest.approx(2.042)
    assert stats.t975(200) == pytest.approx(1.972, abs=1e-3)  # t(0.975, 200) = 1.9719
    with pytest.raises(ValueError, match="two pairs"):
        stats.t975(0)


def test_interval_over_instances_is_a_t_interval_of_log_ratios(stats: ModuleType) -> None:
    a, b = [102.0, 99.0, 105.0], [100.0, 100.0, 100.0]
    logs = [math.log(x / y) for x, y in zip(a, b, strict=True)]
    half = 4.303 * statistics.stdev(logs) / math.sqrt(3)
    got = stats.paired_ratio_interval(a, b)
    assert got.ratio == pytest.approx(math.exp(statistics.fmean(logs)))
    assert (got.lo, got.hi) == pytest.approx(
        (math.exp(statistics.fmean(logs) - half), math.exp(statistics.fmean(logs) + half))
    )
    assert got.pair_ratios == pytest.approx((1.02, 0.99, 1.05))
    # Three instances whose ratios scatter by ±3 % resolve nothing at 2 %.
    assert got.lo < 1 < got.hi and not got.excludes_one()
    # B/A is the reciprocal of A/B.
    back = stats.paired_ratio_interval(b, a)
    assert (back.ratio, back.lo, back.hi) == pytest.approx((1 / got.ratio, 1 / got.hi, 1 / got.lo))
    assert got.as_dict()["ci95"] == [got.lo, got.hi] and got.as_dict()["n"] == 3
    with pytest.raises(ValueError, match="unpaired"):
        stats.paired_ratio_interval([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="two pairs"):
        stats.paired_ratio_interval([1.0], [1.0])


def test_a_difference_in_seconds_gets_the_same_t_interval(stats: ModuleType) -> None:
    got = stats.paired_difference_interval([1.0, 2.0, 3.0], [0.0, 0.0, 0.0])
    half = 4.303 * 1.0 / math.sqrt(3)  # sd of (1, 2, 3) is 1
    assert got["mean"] == pytest.approx(2.0) and got["median"] == pytest.approx(2.0)
    assert got["ci95"] == pytest.approx([2.0 - half, 2.0 + half])
    assert got["n"] == 3 and got["a_lower"] == 0
    with pytest.raises(ValueError, match="unpaired"):
        stats.paired_difference_interval([1.0], [1.0, 2.0])


def test_aa_spread_is_symmetric_around_one(stats: ModuleType) -> None:
    aa = stats.RatioInterval(ratio=1.01, lo=0.99, hi=1.04, pair_ratios=(1.0, 1.05, 0.98))
    lo, hi = stats.aa_spread(aa)
    assert hi == pytest.approx(1.05) and lo == pytest.approx(1 / 1.05)
    # An A/A below 1 reaches as far above it.
    low = stats.RatioInterval(ratio=0.95, lo=0.90, hi=0.99, pair_ratios=(0.94, 0.96))
    assert stats.aa_spread(low) == pytest.approx((0.90, 1 / 0.90))


def test_verdict_needs_both_the_interval_and_the_aa_spread(stats: ModuleType) -> None:
    spread = (1 / 1.05, 1.05)  # this method's A/A reached 5 %
    # Interval excludes 1.0, but a 3 % ratio is inside the A/A spread: no difference.
    small = stats.RatioInterval(ratio=0.97, lo=0.96, hi=0.98, pair_ratios=(0.97,) * 3)
    assert small.excludes_one()
    assert stats.verdict(small, spread) == stats.NO_DIFFERENCE
    # Outside the spread, and the interval excludes 1.0: a difference.
    big = stats.RatioInterval(ratio=0.90, lo=0.88, hi=0.92, pair_ratios=(0.90,) * 3)
    assert stats.verdict(big, spread) == stats.DIFFERENCE
    # Outside the spread, but the interval reaches 1.0: no difference.
    wide = stats.RatioInterval(ratio=0.90, lo=0.70, hi=1.10, pair_ratios=(0.7, 0.9, 1.1))
    assert stats.verdict(wide, spread) == stats.NO_DIFFERENCE
    faster = stats.RatioInterval(ratio=1.10, lo=1.08, hi=1.12, pair_ratios=(1.1,) * 3)
    assert stats.verdict(faster, spread) == stats.DIFFERENCE
    # Exit 1 only for a resolved slowdown whose whole interval is below the target.
    assert stats.resolved_below(big, spread, 0.98)
    assert not stats.resolved_below(big, spread, 0.90)  # its interval reaches 0.90
    assert not stats.resolved_below(small, spread, 0.99)  # not resolved at all
    assert not stats.resolved_below(faster, spread, 1.2)


def test_creation_order_rotates_sides_between_blocks(stats: ModuleType) -> None:
    sides = ("plugin", "llama", "plugin_b")
    order = stats.creation_order(3, sides)
    assert order == [
        (0, "plugin"), (0, "llama"), (0, "plugin_b"),
        (1, "llama"), (1, "plugin_b"), (1, "plugin"),
        (2, "plugin_b"), (2, "plugin"), (2, "llama"),
    ]  # fmt: skip
    # Every side once in every position of a block (a Latin square).
    for pos in range(3):
        assert Counter(order[3 * k + pos][1] for k in range(3)) == Counter(sides)
    # Two sides: A B / B A / A B, instance k of A before B's, then after.
    assert [s for _, s in stats.creation_order(3, ("a", "b"))] == list("abbaab")
    with pytest.raises(ValueError):
        stats.creation_order(0, sides)


def _instance(side: str, block: int, rate: float, ttft: float = 10.0) -> dict[str, Any]:
    return {
        "side": side,
        "block": block,
        "median_output_tokens_per_s": rate,
        "latency": {"1": {"ttft_ms": ttft, "itl_ms": 2.0}},
        "warmup_tokens_sha256": "same",
    }


def test_report_calls_a_ratio_inside_the_aa_spread_no_difference(script: ModuleType) -> None:
    # The plugin 3 % slower than Llama in every block (interval excludes 1.0), but the
    # plugin against itself scattered by ±6 %: no difference.
    plugin = [100.0, 100.0, 100.0]
    rows = [_instance("plugin", k, r) for k, r in enumerate(plugin)]
    rows += [_instance("llama", k, r / 0.97 * (1 + 0.001 * k)) for k, r in enumerate(plugin)]
    rows += [_instance("plugin_b", k, r) for k, r in enumerate([94.0, 106.0, 100.0])]
    report = script.build_report(rows, {}, 0.98, True)
    tok = report["comparisons"]["tok/s"]
    assert tok["ab_plugin_over_llama"]["hi"] < 1
    assert tok["aa_spread"][1] > 1 / 0.97
    assert report["verdict"] == "no difference resolved"
    assert report["resolved_below_target"] is False
    assert report["comparisons"]["ttft_ms@1"]["verdict"] == "no difference resolved"

    # The same A/B with a tight A/A: a difference, and below the 0.98 target.
    rows = [r for r in rows if r["side"] != "plugin_b"]
    rows += [_instance("plugin_b", k, r) for k, r in enumerate([100.5, 99.5, 100.2])]
    report = script.build_report(rows, {}, 0.98, True)
    assert report["verdict"] == "difference: plugin slower"
    assert report["resolved_below_target"] is True
    assert report["ratio_plugin_over_llama"] == pytest.approx(0.97, abs=0.002)
    assert report["output_tokens_per_s"]["plugin"] == plugin
    assert report["distinct_warmup_outputs"] == 1


def test_report_uses_complete_blocks_only(script: ModuleType) -> None:
    rows = [_instance(s, 0, 100.0 + i) for i, s in enumerate(("plugin", "llama", "plugin_b"))]
    rows.append(_instance("llama", 1, 90.0))  # block 1 is missing its plugin instances
    report = script.build_report(rows, {}, 0.98, False)
    assert report["complete"] is False
    assert report["comparisons"]["tok/s"]["ab_plugin_over_llama"] is None
    assert report["verdict"] == "not enough instances"
    rows += [_instance("plugin", 1, 95.0), _instance("plugin_b", 1, 96.0)]
    ab = script.build_report(rows, {}, 0.98, False)["comparisons"]["tok/s"]["ab_plugin_over_llama"]
    assert ab["blocks"] == [0, 1] and ab["pair_ratios"] == pytest.approx([100 / 101, 95 / 90])


@pytest.mark.engine
@pytest.mark.timeout(900)
def test_bench_plugin_smoke_on_cpu(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Two fresh instances per side of the tiny model, each as small as the assertions allow:
    an instance's figures come from one process start and one engine start, so its batches
    are the least that still take every path (two rounds, two concurrencies, the latency
    reps); eight decode tokens keep ITL = (decode call - TTFT call) / 7 above the noise of
    a loaded machine (a figure <= 0 has no ratio, and these comparisons need both blocks)."""
    out = tmp_path / "bench-plugin.json"
    env = (
        os.environ
        | {"VLLM_CPU_KVCACHE_SPACE": "1", "MINISTREAM_COMMIT": "0" * 40, "MINISTREAM_DIRTY": "0"}
        | IN_PROCESS_ENGINE
    )
    args = [
        "--model", str(tiny_model_dir), "--out", str(out), "--instances", "2",
        "--prompts", "2", "--prompt-len", "8", "--output-len", "4", "--rounds", "2",
        "--concurrency", "1,4", "--decode-tokens", "8", "--target", "0",
        "--llm-args", '{"max_model_len": 256, "dtype": "float32", "enforce_eager": true}',
    ]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench_plugin.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=840,
        cwd=SCRIPTS.parent,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("] block ") == 6  # one progress line per instance
    assert "A/A spread" in proc.stdout
    report = json.loads(out.read_text())
    assert report["complete"] is True and report["provenance"]["commit"] == "0" * 40
    order = [(i["block"], i["side"]) for i in report["instances"]]
    assert order == [
        (0, "plugin"), (0, "llama"), (0, "plugin_b"), (1, "llama"), (1, "plugin_b"), (1, "plugin")
    ]  # fmt: skip
    for inst in report["instances"]:
        assert len(inst["output_tokens_per_s"]) == 2 and min(inst["output_tokens_per_s"]) > 0
        assert set(inst["latency"]) == {"1", "4"}
        assert len(inst["latency"]["4"]["samples_ttft_itl_ms"]) == 3
        assert inst["init_s"] > 0 and inst["wall_s"] > inst["init_s"]
    assert {s: len(v) for s, v in report["output_tokens_per_s"].items()} == {
        "plugin": 2,
        "llama": 2,
        "plugin_b": 2,
    }
    assert set(report["comparisons"]) == {"tok/s", "ttft_ms@1", "itl_ms@1", "ttft_ms@4", "itl_ms@4"}
    for entry in report["comparisons"].values():
        for key in ("ab_plugin_over_llama", "aa_plugin_over_plugin_b"):
            assert (
                entry[key]["n"] == 2 and entry[key]["lo"] <= entry[key]["ratio"] <= entry[key]["hi"]
            )
        assert entry["verdict"] in ("difference", "no difference resolved")
    # Same weights, float32 on CPU: every instance computed the same greedy tokens.
    assert report["distinct_warmup_outputs"] == 1


def test_a_negative_itl_leaves_its_comparison_out(script: ModuleType) -> None:
    """ITL = (decode call - TTFT call) / tokens: on a loaded machine the decode call can finish
    first. That figure has no ratio; the others are still compared (a CI run crashed here)."""
    rows = [_instance(s, k, 100.0 + k) for k in range(2) for s in ("plugin", "llama", "plugin_b")]
    rows[0]["latency"]["1"]["itl_ms"] = -5.8
    comparisons = script.build_report(rows, {}, 0.98, True)["comparisons"]
    assert comparisons["itl_ms@1"]["ab_plugin_over_llama"] is None
    assert comparisons["tok/s"]["ab_plugin_over_llama"] is not None
