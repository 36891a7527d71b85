"""What every server process the tests and benchmarks start on this machine has: a free
loopback port, the process once started, its URL, and its output in a log file."""

from __future__ import annotations

import io
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ministream_testkit.net import free_port


@dataclass(kw_only=True)
class LocalServer:
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    _reader: threading.Thread | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(
        self,
        command: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        own_group: bool = False,
        on_line: Callable[[str], None] | None = None,
    ) -> None:
        """Start `command` with stdout and stderr into `log_path`; `own_group`: in a process
        group of its own (stop_group then stops what it spawns too); `on_line`: called with
        each line of output (newline removed) as it arrives, from a reader thread, the lines
        still going to the log."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "wb")  # noqa: SIM115 - owned by the child process
        self.process = subprocess.Popen(
            command,
            stdout=log if on_line is None else subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=own_group,
        )
        if on_line is not None:
            self._reader = threading.Thread(
                target=_read_lines, args=(self.process, log, on_line), daemon=True
            )
            self._reader.start()

    def join_reader(self, timeout: float) -> None:
        """With `on_line`: wait up to `timeout` s for the last lines to be handed over."""
        if self._reader is not None:
            self._reader.join(timeout=timeout)


def _read_lines(
    process: subprocess.Popen[bytes], log: io.BufferedWriter, on_line: Callable[[str], None]
) -> None:
    """Hand each output line to `on_line` and write it to the log, until the output ends.
    Lines split as a text-mode pipe splits them (a `\r` of a progress bar ends one)."""
    assert process.stdout is not None
    with log, io.TextIOWrapper(process.stdout, errors="replace") as lines:
        for line in lines:
            on_line(line.rstrip("\n"))
            log.write(line.encode(errors="replace"))
            log.flush()
