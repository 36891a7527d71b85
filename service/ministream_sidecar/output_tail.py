"""A child's output passed through live and its last lines kept: when vLLM refuses to start,
`ministream up` ends with vLLM's own reason instead of an exit status alone.

Each of the child's streams goes on to the same stream of ours (the terminal sees what it saw
before, stdout and stderr apart) and into one bounded buffer of lines.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections import deque
from typing import IO

_MAX_LINE_BYTES = 16384  # a longer line is kept in pieces
# vLLM's log prefix, `(EngineCore pid=12) ERROR 12-03 08:41:51 [core.py:1510] `, and colours.
_LOG_PREFIX = re.compile(r"^(?:\(\S+ pid=\d+\) )?(?:[A-Z]+ \d\d-\d\d [\d:]+ \[[^\]]*\] )?")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EXCEPTION = re.compile(r"^(?:\w+\.)*\w*(?:Error|Exception): \S")
_ARGPARSE_ERROR = re.compile(r"^\S+: error: \S")
# Python's wrappers around a root cause that vLLM printed earlier: they name no reason.
_WRAPPER = "root cause"


class OutputTail:
    def __init__(self, size: int) -> None:
        self._lines: deque[str] = deque(maxlen=size)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def follow(self, source: IO[bytes], sink: IO[bytes]) -> None:
        """Copy `source` to `sink` line by line in a thread, keeping the last lines."""
        thread = threading.Thread(target=self._copy, args=(source, sink), daemon=True)
        thread.start()
        self._threads.append(thread)

    def _copy(self, source: IO[bytes], sink: IO[bytes]) -> None:
        with source:
            for line in iter(lambda: source.readline(_MAX_LINE_BYTES), b""):
                with contextlib.suppress(OSError, ValueError):  # our own output closed
                    sink.write(line)
                    sink.flush()
                with self._lock:
                    self._lines.append(line.decode(errors="replace").rstrip("\r\n"))

    def wait(self, timeout: float) -> None:
        """Wait for the streams to end (the child and all that inherited them exited)."""
        for thread in self._threads:
            thread.join(timeout)

    def lines(self) -> list[str]:
        with self._lock:
            return list(self._lines)


def exit_reason(lines: list[str]) -> str | None:
    """The line that says why the process failed: the last exception message that is not
    a wrapper pointing at an earlier one, else the last argparse error, else None."""
    cleaned = [_LOG_PREFIX.sub("", _ANSI.sub("", line)).strip() for line in lines]
    exceptions = [line for line in cleaned if _EXCEPTION.match(line)]
    causes = [line for line in exceptions if _WRAPPER not in line]
    if causes or exceptions:
        return (causes or exceptions)[-1]
    errors = [line for line in cleaned if _ARGPARSE_ERROR.match(line)]
    return errors[-1] if errors else None
