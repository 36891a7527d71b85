"""vLLM's start, line by line with sub-second stamps, in a file the sidecar can read.

vLLM runs in another container; its own log has one-second stamps and goes to stdout. The
plugin's `register()`, which vLLM calls in every process it starts (API server, engine
core, workers) before they log their first milestone, calls `attach()` when
`MINISTREAM_SIDECAR_STARTUP_LOG` names a file (the chart points it into a volume both
containers mount). The server's top-level process truncates the file and writes its own
start time (from /proc) first; then every `vllm.*` log record becomes one line,
`<epoch seconds> <message>`, until the file reaches `MAX_BYTES` (a start needs ~50 KiB;
the cap keeps a long-running server from filling the volume).

The sidecar reads it back with `read()` and splits the start into phases
(`startup_phases.parse`). Standard library only: this module runs inside vLLM's processes
and in the sidecar, which has neither torch nor vLLM.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The sidecar's setting of the same name (MINISTREAM_SIDECAR_*): both sides read the file
# (docs/architecture.md, "The startup log").
ENV = "MINISTREAM_SIDECAR_STARTUP_LOG"
MAX_BYTES = 1 << 20
START_MARKER = "ministream: server process started"
_LOGGER = "vllm"


def process_start_time() -> float:
    """Epoch seconds at which this process started (Linux /proc), else now."""
    try:
        with open(f"/proc/{os.getpid()}/stat") as f:
            # Field 22 (starttime, clock ticks after boot); split after the ")" of comm,
            # which may itself contain spaces.
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


class _StampingFactory:
    """A log-record factory that also appends `<created> <message>` for each `vllm.*`
    record, up to `max_bytes` in the file.

    A record factory, not a handler: vLLM re-applies its logging config (dictConfig) after
    its plugins load, which would drop a handler from its logger; the factory stays. It
    sees records that passed the logger's level, before any handler. Several processes
    append to the same file: each line is one O_APPEND write. Once a process finds the
    file full it stops opening it (the file only grows until the next server start, which
    is a new process)."""

    def __init__(
        self, previous: Callable[..., logging.LogRecord], path: Path, max_bytes: int
    ) -> None:
        self.previous = previous
        self.path = path
        self.max_bytes = max_bytes
        self.full = False

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record = self.previous(*args, **kwargs)
        if not self.full and (record.name == _LOGGER or record.name.startswith(_LOGGER + ".")):
            try:
                line = f"{record.created:.3f} {record.getMessage()}".replace("\n", " ")
                self.full = not self._append(line + "\n")
            except Exception:  # a log line must never break vLLM
                pass
        return record

    def _append(self, text: str) -> bool:
        """Append `text` unless the file is full; False when it was."""
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size >= self.max_bytes:
                return False
            os.write(fd, text.encode("utf-8", "replace"))
            return True
        finally:
            os.close(fd)


def attach(path: str | Path, max_bytes: int = MAX_BYTES) -> bool:
    """Stamp this process's `vllm` log records into `path` (idempotent per process).

    The server's top-level process (vLLM's API server, or the Python process that builds
    an `LLM`) starts the file afresh with its start time; the engine core and workers
    append. Returns False, and vLLM runs on, if the file cannot be written."""
    path = Path(path)
    if isinstance(logging.getLogRecordFactory(), _StampingFactory):
        return True  # registered twice in one process, or inherited through fork
    try:
        if _starts_the_server(path):
            started = process_start_time()
            path.write_text(f"{started:.3f} {START_MARKER} pid={os.getpid()}\n")
        previous = logging.getLogRecordFactory()
        logging.setLogRecordFactory(_StampingFactory(previous, path, max_bytes))
    except OSError as exc:
        logging.getLogger(__name__).warning("no startup log at %s: %s", path, exc)
        return False
    return True


def _starts_the_server(path: Path) -> bool:
    """True in the process that starts a server: not a multiprocessing child (engine core,
    workers), and not a process that joins a start in progress (a Ray worker on the same
    node: the file's start line names another live process). A restarted container may
    reuse the old pid: a start line with our own pid is a previous start."""
    if multiprocessing.parent_process() is not None:
        return False
    pid = _start_pid(path)
    return pid is None or pid == os.getpid() or not _alive(pid)


def _start_pid(path: Path) -> int | None:
    try:
        with open(path, errors="replace") as f:
            first = f.readline()
    except OSError:
        return None
    _, _, tail = first.partition(f"{START_MARKER} pid=")
    return int(tail) if tail.strip().isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read(path: str | Path) -> list[tuple[float, str]] | None:
    """The last start in `path`: (seconds since its process started, message) per line.

    None when the file is missing or holds no start line."""
    try:
        raw = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return None
    lines: list[tuple[float, str]] = []
    start: float | None = None
    for row in raw:
        stamp, _, text = row.partition(" ")
        try:
            t = float(stamp)
        except ValueError:
            continue  # a line cut by the size cap
        if text.startswith(START_MARKER):
            start, lines = t, []
        elif start is not None:
            lines.append((t - start, text))
    return lines if start is not None else None
