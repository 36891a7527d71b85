"""The testkit's crashed-pod kill (`ministream_testkit.processes.kill_group`) on real
processes: the whole group goes, grandchildren included, and a process that is still alive
is described by its pending signals and where each of its threads waits; a container's
processes are found by its PID namespace (`pid_namespace_members`), as the played pod's stop
describes them when its grace period runs out."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import psutil
import pytest

from ministream_testkit.processes import (
    group_members,
    kill_group,
    pid_namespace_members,
    where_it_waits,
)
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


@pytest.mark.root("unshare --pid")
def test_a_pid_namespace_holds_just_its_own_processes() -> None:
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "sleep", "300"], start_new_session=True)
    try:
        wait_until(lambda: len(group_members(proc.pid)) == 2, 30, 0.01, what="unshare's child")
        [inner] = [pid for pid in group_members(proc.pid) if pid != proc.pid]
        assert pid_namespace_members(inner) == [inner]
        ours = pid_namespace_members(os.getpid())
        assert os.getpid() in ours and proc.pid in ours and inner not in ours
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # Once it is gone (or a zombie) there is no namespace to read.
    wait_until(lambda: pid_namespace_members(inner) == [], 30, 0.01, what="the namespace gone")
