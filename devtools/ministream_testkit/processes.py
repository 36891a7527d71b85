"""Process and page-cache helpers shared by the test launchers and the benchmark scripts."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
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


def kill_group(
    proc: subprocess.Popen[bytes] | subprocess.Popen[str], gone_within: float = 30.0
) -> list[str]:
    """SIGKILL the process group `proc` leads, with no grace (a crashed or OOM-killed pod's
    container), reap the leader, and wait up to `gone_within` s until every process of the
    group is gone, as a container's are. Returns the processes still alive then, each with
    its pending signals and where its threads wait: a survivor keeps its sockets open, so its
    peers see no reset (empty when all are gone)."""
    members = group_members(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    deadline = time.monotonic() + gone_within
    while (left := [pid for pid in members if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [where_it_waits(pid) for pid in left]


def group_members(pgid: int) -> list[int]:
    """The processes of group `pgid` (read from /proc)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.getpgid(int(entry.name)) == pgid:
                    members.append(int(entry.name))
    return members


def _state(stat: Path) -> str:
    """The state letter (R, S, D, T, Z, ...) in a /proc `stat` file of a process or thread;
    OSError once it is gone."""
    return stat.read_text().rsplit(")", 1)[1].split()[0]


def _alive(pid: int) -> bool:
    """Running, sleeping or stopped: neither gone nor a zombie (whose sockets are closed)."""
    try:
        return _state(Path(f"/proc/{pid}/stat")) not in ("Z", "X")
    except OSError:
        return False


def where_it_waits(pid: int) -> str:
    """A process's name, pending signals, and each thread's state and kernel wait channel;
    for a thread running or in uninterruptible sleep, the top of its kernel stack too (root
    only), which shows a process stuck in the kernel, e.g. tearing down its memory on exit."""
    proc = Path(f"/proc/{pid}")
    with contextlib.suppress(OSError):
        status = dict(
            line.split(":", 1) for line in proc.joinpath("status").read_text().splitlines()
        )
        threads = []
        for task in sorted(proc.joinpath("task").iterdir(), key=lambda t: int(t.name)):
            with contextlib.suppress(OSError):
                state = _state(task.joinpath("stat"))
                where = f"{task.name}:{state}:{task.joinpath('wchan').read_text()}"
                if state in ("R", "D"):
                    where += _kernel_stack(task)
                threads.append(where)
        return (
            f"{pid} {status['Name'].strip()} (pending {status['ShdPnd'].strip()}, "
            f"threads {', '.join(threads)})"
        )
    return f"{pid} (gone while read)"


def _kernel_stack(task: Path, frames: int = 4) -> str:
    """The innermost kernel frames of a thread as " [f1 < f2 < ...]"; "" where unreadable."""
    try:
        lines = task.joinpath("stack").read_text().splitlines()
    except OSError:
        return ""
    names = [line.split("] ", 1)[-1].split("+", 1)[0] for line in lines[:frames]]
    return f" [{' < '.join(names)}]" if names else ""


def pid_namespace_members(pid: int) -> list[int]:
    """The processes in `pid`'s PID namespace (a container's, given its init's host PID)."""
    try:
        namespace = os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return []
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(entry / "ns" / "pid") == namespace:
                    members.append(int(entry.name))
    return sorted(members)


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
