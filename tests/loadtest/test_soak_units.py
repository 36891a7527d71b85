"""The soak run's measuring parts (no engine): RSS of a process and of a process group, and
the growth verdict. The run itself is `make soak` (30 minutes; its figures are in
docs/benchmarks.md, not in CI)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ministream_loadtest.soak import group_pids, growth, rss_mib
from ministream_testkit.waiting import wait_until


def test_rss_of_a_live_process_and_of_none() -> None:
    assert rss_mib(os.getpid()) > 10  # this interpreter, with pytest loaded
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert rss_mib(child.pid) == 0.0  # gone: no sample, no error


def test_group_pids_finds_a_group_and_its_children() -> None:
    leader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
            "time.sleep(30)",
        ],
        start_new_session=True,
    )
    try:

        def two() -> bool:
            return len(group_pids(leader.pid)) == 2

        wait_until(two, 10, what="the leader and its child in one group")
        assert leader.pid in group_pids(leader.pid)
        assert os.getpid() not in group_pids(leader.pid)
    finally:
        os.killpg(leader.pid, 9)
        leader.wait()


@pytest.mark.parametrize(
    ("samples", "expected_growth", "slope_sign"),
    [
        ([(t, 100.0) for t in range(0, 1800, 10)], 0.0, 0),  # flat
        ([(t, 100.0 + t / 60) for t in range(0, 1800, 10)], 24.0, 1),  # 1 MiB a minute
    ],
)
def test_growth_compares_first_and_last_windows(
    samples: list[tuple[float, float]], expected_growth: float, slope_sign: int
) -> None:
    verdict = growth(samples, warmup_s=60, window_s=300)
    assert verdict["growth_mib"] == pytest.approx(expected_growth, abs=0.2)
    assert (verdict["slope_mib_per_h"] > 1) == (slope_sign > 0)


def test_growth_of_too_short_a_run_is_unknown() -> None:
    assert growth([(0.0, 1.0), (30.0, 2.0)], warmup_s=60, window_s=300)["growth_mib"] is None
