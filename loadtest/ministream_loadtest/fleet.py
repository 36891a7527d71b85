"""Local pods: a real vLLM (CPU) and a real MiniStream sidecar each, stopped as the kubelet does.

`Pod.start` runs the same two processes as the chart's pod: vLLM through the launcher's
command line (`ministream_sidecar.launcher.vllm_command`, with the chart's
`--shutdown-timeout`) and `python -m ministream_sidecar` with the chart's
MINISTREAM_SIDECAR_* timing variables. `Pod.terminate` replays the kubelet's pod shutdown:

1. preStop hook (unless disabled): POST /drain to the sidecar, waiting up to
   `sidecar.drainTimeoutSeconds + 5` s like the chart's hook;
2. SIGTERM to the vLLM container's main process (vLLM then finishes in-flight requests for
   up to `--shutdown-timeout` s);
3. SIGKILL to whatever is left when terminationGracePeriodSeconds (counted from the start of
   the shutdown, preStop included) runs out;
4. the native sidecar container gets SIGTERM once vLLM has exited.

Each process leads its own process group, so a kill reaches vLLM's engine-core children.

CPU: each pod's vLLM workers are bound to cores of their own while this machine's CPUs
last (`VLLM_CPU_OMP_THREADS_BIND`, unless the caller sets it), as a kubelet's static CPU
manager gives each Guaranteed pod its own cores; a pod in a slot beyond them (the surge pod
on a small machine) is not bound and runs wherever the kernel puts it. vLLM's `auto`
binding would pin every TP=1 engine on the machine to the same core.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .chart_values import ChartTimings
from .haproxy import Slot

_SIDECAR_STOP_SECONDS = 10.0
_EXIT_POLL_SECONDS = 0.1


@dataclass(frozen=True)
class PodTemplate:
    """What every pod of the fleet runs (the Deployment's pod template)."""

    model: str
    served_name: str
    vllm_args: tuple[str, ...]
    timings: ChartTimings
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)


def tensor_parallel_size(vllm_args: tuple[str, ...] | list[str]) -> int:
    """The TP size a vLLM command line asks for (1 when it names none)."""
    for i, arg in enumerate(vllm_args):
        for flag in ("--tensor-parallel-size", "-tp"):
            if arg == flag and i + 1 < len(vllm_args):
                return int(vllm_args[i + 1])
            if arg.startswith(flag + "="):
                return int(arg.split("=", 1)[1])
    return 1


def cpu_binding(slot_index: int, tp: int, cpus: list[int]) -> str:
    """`VLLM_CPU_OMP_THREADS_BIND` for the pod in `slot_index`: one core of its own per rank
    while the machine's `cpus` last (`"0"`, `"1"` at TP=1; `"0|1"` at TP=2); a slot beyond
    them (the surge pod) is not bound (`"nobind"`): pinned to a core whose engine is
    serving, a starting engine gets a few percent of it and may not finish starting. (A CPU
    list such as `"0,1"` would not float: libgomp pins the main thread to its first CPU.)"""
    if not cpus:
        raise ValueError("no CPUs to bind to")
    first = slot_index * tp
    if first + tp <= len(cpus):
        return "|".join(str(cpus[first + rank]) for rank in range(tp))
    return "nobind"


def _killpg(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


class Pod:
    def __init__(
        self,
        name: str,
        slot: Slot,
        template: PodTemplate,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.name = name
        self.slot = slot
        self.template = template
        self.clock = clock
        self.vllm: subprocess.Popen[bytes] | None = None
        self.sidecar: subprocess.Popen[bytes] | None = None
        self.events: dict[str, float] = {}  # created, ready, terminating, sigterm, exited
        self.prestop: dict[str, Any] | None = None
        self.exit_code: int | None = None
        self.killed = False

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.slot.api_port}"

    @property
    def sidecar_url(self) -> str:
        return f"http://127.0.0.1:{self.slot.sidecar_port}"

    def vllm_command(self) -> list[str]:
        from ministream_sidecar.launcher import UpArgs, vllm_command

        t = self.template
        args = [
            "--served-model-name",
            t.served_name,
            "--shutdown-timeout",
            str(t.timings.vllm_shutdown_timeout_seconds),
            *t.vllm_args,
        ]
        return vllm_command(
            UpArgs(
                model=t.model,
                port=self.slot.api_port,
                sidecar_port=self.slot.sidecar_port,
                host="127.0.0.1",
                vllm_args=args,
            )
        )

    def start(self) -> Pod:
        t = self.template
        t.log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **t.env}
        # Small engines that share a 2-core box (DESIGN §8); the caller's environment wins.
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("HF_HUB_OFFLINE", "1")
        if "VLLM_CPU_OMP_THREADS_BIND" not in env:
            env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_binding(
                self.slot.index, tensor_parallel_size(t.vllm_args), sorted(os.sched_getaffinity(0))
            )
            if env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind":
                env.setdefault("OMP_NUM_THREADS", "1")  # one thread per rank, as when bound
        self.events["created"] = self.clock()
        sidecar_env = {
            **env,
            **t.timings.sidecar_env(),
            "MINISTREAM_SIDECAR_HOST": "127.0.0.1",
            "MINISTREAM_SIDECAR_PORT": str(self.slot.sidecar_port),
            "MINISTREAM_SIDECAR_VLLM_URL": self.api_url,
            "MINISTREAM_SIDECAR_MODEL_NAME": t.served_name,
            "MINISTREAM_SIDECAR_PROCESS_START_TIME": repr(time.time()),
        }
        with (
            open(t.log_dir / f"{self.name}-vllm.log", "wb") as vlog,
            open(t.log_dir / f"{self.name}-sidecar.log", "wb") as slog,
        ):
            self.vllm = subprocess.Popen(
                self.vllm_command(),
                stdout=vlog,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
            self.sidecar = subprocess.Popen(
                [sys.executable, "-m", "ministream_sidecar"],
                stdout=slog,
                stderr=subprocess.STDOUT,
                env=sidecar_env,
                start_new_session=True,
            )
        return self

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.sidecar_url}/readyz", timeout=3) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def check_alive(self) -> None:
        for name, proc in (("vLLM", self.vllm), ("sidecar", self.sidecar)):
            if proc is not None and proc.poll() is not None:
                log = self.template.log_dir / f"{self.name}-{name.lower()}.log"
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
                raise RuntimeError(
                    f"pod {self.name}: {name} exited with {proc.returncode}:\n{tail}"
                )

    def wait_ready(self, timeout: float) -> float:
        """Poll /readyz until 200; the time it turned ready."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            if self.ready():
                return self.clock()
            time.sleep(0.5)
        raise TimeoutError(f"pod {self.name} not ready after {timeout:.0f}s")

    # --- shutdown, as the kubelet does it ---------------------------------------------------
    def terminate(self, *, drain: bool) -> None:
        """Blocking: preStop drain, SIGTERM, grace-period SIGKILL, then the sidecar."""
        assert self.vllm is not None and self.sidecar is not None
        timings = self.template.timings
        start = self.events["terminating"] = self.clock()
        deadline = time.monotonic() + timings.termination_grace_period_seconds
        if drain:
            self.prestop = self._prestop_drain(
                min(timings.prestop_http_timeout_seconds, timings.termination_grace_period_seconds)
            )
        self.events["sigterm"] = self.clock()
        with contextlib.suppress(ProcessLookupError):
            self.vllm.send_signal(signal.SIGTERM)  # the container's main process only
        while self.vllm.poll() is None and time.monotonic() < deadline:
            time.sleep(_EXIT_POLL_SECONDS)
        if self.vllm.poll() is None:
            self.killed = True
            _killpg(self.vllm, signal.SIGKILL)
            self.vllm.wait()
        self.exit_code = self.vllm.returncode
        _killpg(self.vllm, signal.SIGKILL)  # the container's leftovers die with it
        self.events["exited"] = self.clock()
        self.sidecar.send_signal(signal.SIGTERM)
        try:
            self.sidecar.wait(_SIDECAR_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            _killpg(self.sidecar, signal.SIGKILL)
            self.sidecar.wait()
        _killpg(self.sidecar, signal.SIGKILL)
        self.events["sidecar_exited"] = self.clock()
        assert self.events["exited"] >= start

    def _prestop_drain(self, timeout: float) -> dict[str, Any]:
        began = self.clock()
        request = urllib.request.Request(f"{self.sidecar_url}/drain", data=b"", method="POST")
        token = self.template.env.get("MINISTREAM_SIDECAR_TOKEN")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        result: dict[str, Any] = {}
        try:
            with urllib.request.urlopen(request, timeout=timeout) as resp:
                result = {"status": resp.status, "body": json.loads(resp.read() or b"{}")}
        except urllib.error.HTTPError as exc:
            result = {"status": exc.code, "error": exc.read(512).decode(errors="replace")}
        except (OSError, ValueError) as exc:
            result = {"status": None, "error": str(exc)}
        result["seconds"] = round(self.clock() - began, 3)
        return result

    def kill(self) -> None:
        """Immediate cleanup (not a graceful shutdown)."""
        for proc in (self.vllm, self.sidecar):
            if proc is not None:
                _killpg(proc, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)

    @property
    def exited(self) -> bool:
        return "sidecar_exited" in self.events
