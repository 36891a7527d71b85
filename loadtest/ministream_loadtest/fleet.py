"""Local pods: a real vLLM (CPU) and a real MiniStream sidecar each, stopped as the kubelet does.

`Pod.start` runs the same two processes as the chart's pod (`chart_pod.ChartPod`, read
from `helm template`): vLLM through the launcher's command line
(`ministream_sidecar.launcher.vllm_command`, with the rendered vLLM arguments,
`ChartPod.vllm_args`) and `python -m ministream_sidecar` with the rendered
MINISTREAM_SIDECAR_* settings.
`Pod.terminate` replays the kubelet's pod shutdown:

1. the rendered preStop command (unless disabled), run with this interpreter in place of the
   image's `python3` and the pod's sidecar port in MINISTREAM_SIDECAR_PORT; it is cut off
   when the grace period runs out, as the kubelet cuts off a hook;
2. SIGTERM to the vLLM container's main process (vLLM then finishes in-flight requests for
   up to `--shutdown-timeout` s);
3. SIGKILL to whatever is left when terminationGracePeriodSeconds (counted from the start of
   the shutdown, preStop included) runs out;
4. the native sidecar container gets SIGTERM once vLLM has exited.

Processes are `ministream_sidecar.processes.Child`ren (the lifecycle `ministream up` uses):
each leads its own process group, so a kill reaches vLLM's engine-core children. This is the
`process` runtime (`ProcessFleet`); the `podman` runtime (`podman_fleet.PodmanPod`) keeps this
lifecycle and carries each step out on the chart's rendered pod, run from the images.

CPU: each pod's vLLM workers are bound to cores of their own while this machine's CPUs
last (`VLLM_CPU_OMP_THREADS_BIND`, unless the caller sets it), as a kubelet's static CPU
manager gives each Guaranteed pod its own cores; a pod in a slot beyond them (the surge pod
on a small machine) is not bound and runs wherever the kernel puts it. vLLM's `auto`
binding would pin every TP=1 engine on the machine to the same core.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ministream_sidecar import client, cpu_memory
from ministream_sidecar.launcher import UpArgs, vllm_command
from ministream_sidecar.processes import Child
from ministream_testkit.net import free_port

from .chart_pod import ChartPod, drain_answer, run_prestop
from .haproxy import Slot

_SIDECAR_STOP_SECONDS = 10.0


@dataclass(frozen=True)
class PodTemplate:
    """What every pod of the fleet runs (the Deployment's pod template)."""

    model: str
    served_name: str
    vllm_args: tuple[str, ...]
    chart: ChartPod
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


def loopback_address(index: int) -> str:
    """The loopback address of the pod in slot `index`: 127.0.0.2 onwards (127.0.0.1 is the
    machine's own, where the sidecars, the router and the stand-in API listen)."""
    if not 0 <= index < 253:
        raise ValueError(f"no loopback address for slot {index}")
    return f"127.0.0.{2 + index}"


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
        self.vllm: Child | None = None
        self.sidecar: Child | None = None
        self.events: dict[str, float] = {}  # created, ready, terminating, sigterm, exited
        self.prestop: dict[str, Any] | None = None
        self.exit_code: int | None = None
        self.killed = False

    @property
    def pool(self) -> str | None:
        """The P/D pool the chart renders this pod in; None without disaggregation."""
        return self.template.chart.pool

    @property
    def api_url(self) -> str:
        return f"http://{self.slot.host}:{self.slot.api_port}"

    @property
    def sidecar_url(self) -> str:
        return self.slot.sidecar_url

    def vllm_command(self) -> list[str]:
        t = self.template
        # The chart's rendered arguments first (--shutdown-timeout, a queue limit, extraArgs),
        # the caller's after them: for a flag given twice, vLLM takes the last.
        args = ["--served-model-name", t.served_name, *t.chart.vllm_args, *t.vllm_args]
        return vllm_command(
            UpArgs(
                model=t.model,
                port=self.slot.api_port,
                sidecar_port=self.slot.sidecar_port,
                host=self.slot.host,
                vllm_args=args,
            )
        )

    def chart_env(self) -> dict[str, str]:
        """The rendered vLLM container's literal NIXL/UCX variables, and those the cluster
        sets to the pod's IP (NIXL's side-channel host) set to this slot's address."""
        chart = self.template.chart
        return {**chart.vllm_env, **{name: self.slot.host for name in chart.pod_ip_env}}

    def cpu_env(self, env: dict[str, str]) -> dict[str, str]:
        """The CPU binding this pod's slot gets (see the module docstring), unless `env`
        already sets one; the variables to add."""
        if "VLLM_CPU_OMP_THREADS_BIND" in env:
            return {}
        bind = cpu_binding(
            self.slot.index,
            tensor_parallel_size(self.template.vllm_args),
            sorted(os.sched_getaffinity(0)),
        )
        added = {"VLLM_CPU_OMP_THREADS_BIND": bind}
        if bind == "nobind" and "OMP_NUM_THREADS" not in env:
            added["OMP_NUM_THREADS"] = "1"  # one thread per rank, as when bound
        return added

    def start(self) -> Pod:
        t = self.template
        t.log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.chart_env(), **t.env}
        vllm_cmd = self.vllm_command()
        # Small engines that share one machine; the caller's own sizing (environment or
        # vLLM flags) wins.
        env.update(cpu_memory.kv_cache_env(env, vllm_cmd, gib=cpu_memory.SHARED_MACHINE_GIB))
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.update(self.cpu_env(env))
        self.events["created"] = self.clock()
        sidecar_env = {
            **env,
            **t.chart.sidecar_settings,
            f"{client.ENV_PREFIX}HOST": self.slot.sidecar_host or self.slot.host,
            f"{client.ENV_PREFIX}PORT": str(self.slot.sidecar_port),
            f"{client.ENV_PREFIX}VLLM_URL": self.api_url,
            f"{client.ENV_PREFIX}MODEL_NAME": t.served_name,
            f"{client.ENV_PREFIX}PROCESS_START_TIME": repr(time.time()),
        }
        self.vllm = Child("vLLM", vllm_cmd, env).start(self._log("vllm"))
        sidecar_cmd = [sys.executable, "-m", "ministream_sidecar"]
        self.sidecar = Child("sidecar", sidecar_cmd, sidecar_env).start(self._log("sidecar"))
        return self

    def _log(self, container: str) -> Path:
        return self.template.log_dir / f"{self.name}-{container}.log"

    def ready(self) -> bool:
        return client.ready(self.sidecar_url)

    def check_alive(self) -> None:
        for child in (self.vllm, self.sidecar):
            if child is not None and child.returncode is not None:
                log = self._log("vllm" if child is self.vllm else "sidecar")
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
                raise RuntimeError(
                    f"pod {self.name}: {child.name} exited with {child.returncode}:\n{tail}"
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
        """Blocking: preStop hook, SIGTERM, grace-period SIGKILL, then the sidecar."""
        chart = self.template.chart
        start = self.events["terminating"] = self.clock()
        deadline = time.monotonic() + chart.termination_grace_period_seconds
        if drain:
            self.prestop = self._run_prestop(deadline - time.monotonic())
        self.events["sigterm"] = self.clock()
        self.exit_code, self.killed = self._stop_vllm(grace=deadline - time.monotonic())
        self.events["exited"] = self.clock()
        self._stop_sidecar()
        self.events["sidecar_exited"] = self.clock()
        assert self.events["exited"] >= start

    def _stop_vllm(self, grace: float) -> tuple[int | None, bool]:
        """SIGTERM to vLLM, SIGKILL after `grace` s: (exit status, whether SIGKILLed)."""
        assert self.vllm is not None
        code = self.vllm.stop(grace=grace)
        return code, self.vllm.killed

    def _stop_sidecar(self) -> None:
        assert self.sidecar is not None
        self.sidecar.stop(grace=_SIDECAR_STOP_SECONDS)

    def _exec_prestop(self, command: list[str], budget: float) -> subprocess.CompletedProcess[str]:
        """The rendered preStop command as the kubelet runs it (`chart_pod.run_prestop`),
        with the fleet's sidecar token if it has one."""
        token = f"{client.ENV_PREFIX}TOKEN"
        env = {token: self.template.env[token]} if self.template.env.get(token) else {}
        return run_prestop(command, self.slot.sidecar_port, timeout=budget, env=env)

    def _run_prestop(self, budget: float) -> dict[str, Any]:
        """The rendered preStop command; cut off after `budget` seconds as the kubelet cuts
        off a hook."""
        command = list(self.template.chart.prestop_command)
        began = self.clock()
        result: dict[str, Any]
        try:
            proc = self._exec_prestop(command, budget)
            result = drain_answer(proc) if proc.stdout.strip() else {"error": proc.stderr[-512:]}
            result["exit_code"] = proc.returncode
        except subprocess.TimeoutExpired:
            result = {"status": None, "error": f"preStop cut off after {budget:.0f}s"}
        except (ValueError, KeyError) as exc:
            result = {"status": None, "error": f"unreadable preStop output: {exc}"}
        result["seconds"] = round(self.clock() - began, 3)
        return result

    # --- the kubelet's restart of a crashed vLLM container (the bad-release experiment) -----
    def vllm_exit_code(self) -> int | None:
        """vLLM's exit status once it has exited; None while it runs."""
        assert self.vllm is not None
        return self.vllm.returncode

    def restart_vllm(self, attempt: int) -> None:
        """Start vLLM again, same command and environment; its log is `-vllm-<attempt>.log`."""
        assert self.vllm is not None
        log = self.template.log_dir / f"{self.name}-vllm-{attempt}.log"
        self.vllm = Child(self.vllm.name, self.vllm.argv, self.vllm.env).start(log)

    def vllm_state(self) -> dict[str, Any]:
        """What shows that vLLM was started once and still runs (the old pods' check)."""
        return {
            "vllm_pid": self.vllm.pid if self.vllm else None,
            "vllm_running_at_end": self.vllm is not None and self.vllm.returncode is None,
        }

    def kill(self) -> None:
        """Immediate cleanup (not a graceful shutdown)."""
        for child in (self.vllm, self.sidecar):
            if child is not None:
                child.kill_group()

    @property
    def exited(self) -> bool:
        return "sidecar_exited" in self.events


class ProcessFleet:
    """Runtime `process`: each pod is two local processes (`Pod`), on ports of 127.0.0.1.

    `loopback=True`: each pod has an address of its own, 127.0.0.2, 127.0.0.3, ..., as pods
    have in a cluster, and every pod's vLLM the same port there (what the router's own
    Kubernetes discovery needs: one port, an address per pod); NIXL's side channel
    advertises that address. The sidecars stay on 127.0.0.1, on ports of their own, where
    the rendered preStop command finds them."""

    name = "process"

    def __init__(self, loopback: bool = False) -> None:
        self.loopback = loopback

    def slots(self, count: int) -> list[Slot]:
        if not self.loopback:
            return [Slot(i, free_port(), free_port()) for i in range(count)]
        api_port = free_port()
        return [
            Slot(i, api_port, free_port(), loopback_address(i), sidecar_host="127.0.0.1")
            for i in range(count)
        ]

    def pod(self, name: str, slot: Slot, template: PodTemplate) -> Pod:
        return Pod(name, slot, template)

    def describe(self) -> dict[str, Any]:
        return {"runtime": self.name, "addresses": "loopback" if self.loopback else "127.0.0.1"}

    def close(self) -> None:
        return None
