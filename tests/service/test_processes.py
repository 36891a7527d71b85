"""`ministream_sidecar.processes.Child`: the stop sequence `ministream up` and the rollout
experiment's pods share (SIGTERM to the main process, SIGKILL to the group after the grace
period, leftovers of the group reaped), with real child processes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ministream_sidecar.processes import Child
from ministream_testkit.waiting import wait_until

# A parent that starts a grandchild in its own group and writes both pids, then waits.
_FAMILY = """
import os, signal, subprocess, sys, time
if sys.argv[1] == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[2], "w").write(f"{os.getpid()} {kid.pid}")
time.sleep(600)
"""


def _start(tmp_path: Path, mode: str) -> tuple[Child, int]:
    pids = tmp_path / f"{mode}.pids"
    child = Child(mode, [sys.executable, "-c", _FAMILY, mode, str(pids)], os.environ)
    child.start(tmp_path / f"{mode}.log")
    text = wait_until(
        lambda: pids.is_file() and " " in pids.read_text() and pids.read_text(),
        timeout=60,
        what="the child to write its pids",
    )
    return child, int(text.split()[1])


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie of ours (reaped by init later) counts as gone.
    stat = Path(f"/proc/{pid}/stat")
    return stat.is_file() and stat.read_text().split()[2] == "Z"


def test_sigterm_stops_the_leader_and_the_group_is_reaped(tmp_path: Path) -> None:
    child, grandchild = _start(tmp_path, "obey-term")
    assert child.alive
    status = child.stop(grace=30)
    assert status == -15 and not child.killed and not child.alive
    wait_until(lambda: _gone(grandchild), timeout=10, what="the group's leftover to die")


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    child, grandchild = _start(tmp_path, "ignore-term")
    status = child.stop(grace=0.5)
    assert status == -9 and child.killed
    wait_until(lambda: _gone(grandchild), timeout=10, what="the group's leftover to die")


def test_kill_group_on_a_child_never_started_is_a_no_op() -> None:
    child = Child("never", [sys.executable, "-c", "pass"], os.environ)
    child.kill_group()
    assert child.stop(grace=1) is None and not child.alive
