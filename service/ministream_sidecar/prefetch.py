"""Read the model and vLLM's compile cache into the page cache while vLLM imports Python.

The sidecar starts before vLLM; vLLM spends its first ~10-14 s importing Python before it
opens a weight file. A reader started with the sidecar fills the page cache in that time, so
vLLM's own reads hit memory: on an H200 node whose page cache did not hold the model, the
weight read went 1.8 s -> 0.5 s and the start after imports 17.3 -> 15.3 s
(docs/benchmarks.md, run 13).

The reads are charged to the memory cgroup of the container doing them, the sidecar's (a page
belongs to the cgroup that first brought it in: Linux's admin-guide/cgroup-v2.rst, "Memory
Ownership"): past its limit the kernel reclaims that cgroup's own pages, the ones read first.
So the reader stops at the cgroup's headroom instead of cycling the cache for nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CHUNK_BYTES = 16 * 1024 * 1024
# Left free under the cgroup's limit for the sidecar's own (anonymous) memory to grow.
HEADROOM_MARGIN_BYTES = 64 * 1024 * 1024
# Below the default nice of 0, so the reader yields CPU (and, with the BFQ/CFQ schedulers,
# disk: their best-effort I/O priority follows nice) to vLLM's imports.
READER_NICE = 10
_CGROUP = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class PrefetchResult:
    bytes_read: int
    files: int
    seconds: float
    truncated: bool  # stopped at the memory budget before reading everything


def memory_budget(cgroup: Path = _CGROUP) -> int | None:
    """Bytes the page cache of this cgroup can grow by before the kernel reclaims it (cgroup
    v2, then v1); None when there is no limit or it cannot be read."""
    for limit_file, usage_file in (
        ("memory.max", "memory.current"),
        ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"),
    ):
        try:
            limit = (cgroup / limit_file).read_text().strip()
            usage = int((cgroup / usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        # cgroup v1 writes "no limit" as a huge page-aligned number.
        if limit == "max" or int(limit) >= 1 << 60:
            return None
        return max(0, int(limit) - usage - HEADROOM_MARGIN_BYTES)
    return None


def _files(path: str) -> Iterator[Path]:
    """Every regular file under `path` (or `path` itself), in a stable order; unreadable
    directories are logged and skipped."""
    root = Path(path)
    if root.is_file():
        yield root
        return
    if not root.is_dir():
        what = "is neither a file nor a directory" if root.exists() else "does not exist"
        log.warning("prefetch: %s %s; skipped", path, what)
        return

    def on_error(error: OSError) -> None:
        log.warning("prefetch: cannot list %s: %s; skipped", error.filename, error.strerror)

    for dirpath, dirnames, filenames in os.walk(root, onerror=on_error):
        dirnames.sort()
        for name in sorted(filenames):
            file = Path(dirpath, name)
            if file.is_file() and not file.is_symlink():
                yield file


def _read(file: Path, buffer: bytearray, limit: int | None) -> int:
    """Read `file` (at most `limit` bytes) into `buffer`, chunk by chunk; bytes read."""
    view = memoryview(buffer)
    done = 0
    with open(file, "rb", buffering=0) as handle:
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while limit is None or done < limit:
            want = CHUNK_BYTES if limit is None else min(CHUNK_BYTES, limit - done)
            n = handle.readinto(view[:want])
            if not n:
                break
            done += n
    return done


def prefetch(paths: tuple[str, ...], *, budget: int | None = None) -> PrefetchResult:
    """Read every file under `paths` once, in order, at most `budget` bytes in all.

    An object-store URI (``s3://``...) is skipped: the Run:ai streamer reads it, not the
    page cache. A missing or unreadable path is a warning, never an error."""
    start = time.monotonic()
    buffer = bytearray(CHUNK_BYTES)
    total = files = 0
    truncated = False
    for path in paths:
        if "://" in path:
            log.info("prefetch: %s is not a local path; skipped", path)
            continue
        for file in _files(path):
            left = None if budget is None else budget - total
            if left is not None and left <= 0:
                truncated = True
                break
            try:
                n = _read(file, buffer, left)
                truncated = n == left and file.stat().st_size > n
            except OSError as error:
                log.warning("prefetch: cannot read %s: %s; skipped", file, error.strerror)
                continue
            total += n
            files += 1
        if truncated:
            break
    return PrefetchResult(total, files, time.monotonic() - start, truncated)


def start_prefetch(
    paths: tuple[str, ...], on_done: Callable[[PrefetchResult], None]
) -> threading.Thread | None:
    """Run `prefetch` in a daemon thread at low priority, then `on_done` with its result.
    Nothing waits on it: the sidecar serves (and reports live) meanwhile."""
    if not paths:
        return None

    def run() -> None:
        # Linux applies a thread id's nice to that thread alone.
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), READER_NICE)
        try:
            budget = memory_budget()
            result = prefetch(paths, budget=budget)
        except Exception:  # never let a page-cache warm-up take the sidecar down
            log.warning("prefetch failed", exc_info=True)
            return
        log.info(
            "prefetch: read %d bytes in %d files in %.1f s%s",
            result.bytes_read,
            result.files,
            result.seconds,
            " (stopped at the container's memory limit: raise it to keep more cached)"
            if result.truncated
            else "",
            extra={"paths": list(paths), "budget_bytes": budget},
        )
        on_done(result)

    thread = threading.Thread(target=run, name="prefetch", daemon=True)
    thread.start()
    return thread
