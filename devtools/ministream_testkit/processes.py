"""Process and page-cache helpers shared by the test launchers and the benchmark scripts."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterable
from pathlib import Path


def stop_group(
    proc: subprocess.Popen[bytes] | subprocess.Popen[str] | None, grace_s: float = 30.0
) -> None:
    """SIGTERM the process group `proc` leads (started with start_new_session), then SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def kill_group(proc: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    """SIGKILL the process group `proc` leads, with no grace (a crashed or OOM-killed pod's
    container), and reap the leader."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def stop_process(
    proc: subprocess.Popen[bytes] | subprocess.Popen[str] | None, grace_s: float = 10.0
) -> None:
    """SIGTERM one process (not a group leader), then SIGKILL after `grace_s`."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def evict_from_page_cache(paths: Iterable[Path]) -> None:
    """Drop the files' pages from the page cache so the next read comes from storage."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
