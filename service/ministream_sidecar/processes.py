"""Child processes stopped the way a container runtime stops a container: the one lifecycle
implementation behind `ministream up` and the rolling-restart experiment's local pods.

Each child leads its own session (so its process group id is its pid, and a terminal's
Ctrl-C reaches only the parent). Stopping sends SIGTERM to the child's main process only,
as the kubelet does, waits up to a grace period, then SIGKILLs the whole group; the group
is SIGKILLed after a clean exit too, which reaps what the leader left behind (vLLM's engine
core, if orphaned).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from .output_tail import OutputTail


class Child:
    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str]) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.proc: subprocess.Popen[bytes] | None = None
        self.killed = False  # SIGKILLed because the grace period ran out
        self.tail: OutputTail | None = None

    def start(self, log: Path | None = None, *, tail_lines: int = 0) -> Child:
        """Start the child; its output goes to `log` when given, else to ours, and then with
        `tail_lines` its last lines are kept too (`self.tail`)."""
        if log is None and tail_lines > 0:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self.env,
                start_new_session=True,
            )
            assert self.proc.stdout is not None and self.proc.stderr is not None
            self.tail = OutputTail(tail_lines)
            self.tail.follow(self.proc.stdout, sys.stdout.buffer)
            self.tail.follow(self.proc.stderr, sys.stderr.buffer)
            return self
        with open(log, "wb") if log is not None else contextlib.nullcontext() as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT if out is not None else None,
                env=self.env,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was not started"
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        """Send `sig` to the main process only (the container's PID 1)."""
        if self.alive:
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    def kill_group(self) -> None:
        """SIGKILL the whole process group and reap the leader."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    def stop(self, grace: float) -> int | None:
        """SIGTERM, wait up to `grace` seconds, then SIGKILL the group; the exit status."""
        if self.proc is None:
            return None
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=max(grace, 0.0))
        except subprocess.TimeoutExpired:
            self.killed = True
        self.kill_group()
        return self.proc.returncode
