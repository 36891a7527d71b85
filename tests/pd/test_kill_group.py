"""The testkit's crashed-pod kill (`ministream_testkit.processes.kill_group`) on real
processes: the whole group goes, grandchildren included, and a process that is still alive
is described by its pending signals and where each of its threads waits."""

from __future__ import annotations

import contextlib
import subprocess
import time

import psutil

from ministream_testkit.processes import group_members, kill_group, where_it_waits
from ministream_testkit.waiting import wait_until


def _group(script: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    deadline = time.monotonic() + 30
    while len(group_members(proc.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc


def test_every_process_of_the_group_is_gone_and_none_is_reported() -> None:
    proc = _group("sleep 300 & (sleep 300 & wait) & wait")
    members = group_members(proc.pid)
    assert len(members) >= 3, members
    assert kill_group(proc, gone_within=30) == []
    for pid in members:  # read by psutil, not by the code under test
        with contextlib.suppress(psutil.NoSuchProcess):
            assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid


def test_a_live_process_is_described_by_its_threads() -> None:
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        sleeping = psutil.Process(proc.pid)
        wait_until(lambda: sleeping.status() == psutil.STATUS_SLEEPING, 30, 0.01, what="sleep")
        described = where_it_waits(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert described.startswith(f"{proc.pid} sleep (pending "), described
    assert f"{proc.pid}:S:" in described, described
