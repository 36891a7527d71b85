"""What every server process the tests and benchmarks start on this machine has: a free
loopback port, the process once started, its URL, and its output in a log file."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ministream_testkit.net import free_port


@dataclass(kw_only=True)
class LocalServer:
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

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
    ) -> None:
        """Start `command` with stdout and stderr into `log_path`; `own_group`: in a process
        group of its own (stop_group then stops what it spawns too)."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "wb")  # noqa: SIM115 - owned by the child process
        self.process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=own_group
        )
