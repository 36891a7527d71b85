"""Runtime `podman` of the rolling-restart experiment: each pod is the chart's rendered pod,
run from the project's images by `podman kube play` (`kube_play`), not a re-creation of it.

- `PodmanFleet` renders the chart (the same `helm template` call that `chart_pod` reads
  the grace period, preStop command and probes from, plus the values that put a pod
  template's model and engine flags into the pod: `template_values`), once per pod template
  (the bad-release experiment's bad releases are templates of their own: what `helm upgrade`
  would render), creates a podman network of its own, and gives each slot a fixed pod IP on
  it; HAProxy stays the Service's stand-in and sends requests to `<pod IP>:<rendered vLLM
  port>`, its health check to the rendered readiness probe's port and path.
- `PodmanPod` keeps `fleet.Pod`'s lifecycle and replaces only how it is carried out: start is
  `podman kube play`; the preStop hook is the rendered command run inside the vLLM container
  (`podman exec`, cut off when the grace period runs out); SIGTERM and the grace-period
  SIGKILL are `podman stop -t <rest of the grace period>` of the vLLM container; then the
  sidecar container is stopped, as the kubelet stops a native sidecar after the app. The pod
  runs with `restartPolicy: Never` (podman would restart a crashed container at once); a
  crashed vLLM container is restarted by the caller (`restart_vllm`: `podman start`), which
  replays the kubelet's back-off (`bad_release.CrashLoop`).

Needs root, podman and the images (`make images`), with CONTAINERS_CONF/
CONTAINERS_STORAGE_CONF from `scripts/images.py env` (`make bench-serve` sets them).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import subprocess
from pathlib import Path
from typing import Any

from ministream_sidecar import cpu_memory

from .chart_pod import render_deployment
from .fleet import _SIDECAR_STOP_SECONDS, Pod, PodTemplate, tensor_parallel_size
from .haproxy import Slot
from .kube_play import KubePlayError, PlayedPod, oci_env_ready, pod_manifest, podman

_SUBNET_PREFIX = "10.213"
_FIRST_HOST = 10


def podman_chart_values(
    model: str, served_name: str, vllm_args: tuple[str, ...], env: dict[str, str]
) -> dict[str, Any]:
    """Values that put this run's model, served name, engine flags and engine environment into
    the rendered pod (the process runtime passes the same on its command lines)."""
    model_dir = Path(model).resolve()
    # Small engines that share one machine; the caller's own sizing (environment or vLLM
    # flags) wins. A pod inherits nothing from this process: the variable is passed on.
    caller = {k: v for k, v in os.environ.items() if k == cpu_memory.ENV}
    engine_env = {
        **caller,
        **cpu_memory.kv_cache_env(caller, vllm_args, gib=cpu_memory.SHARED_MACHINE_GIB),
        "VLLM_NO_USAGE_STATS": "1",
        "HF_HUB_OFFLINE": "1",
        **env,
    }
    args, loading = _loading_values(vllm_args, model_dir.name)
    return {
        "loading.local.hostPath": str(model_dir.parent),
        "loading.local.modelDir": model_dir.name,
        **loading,
        "model.name": served_name,
        "vllm.extraArgs": args,
        "vllm.extraEnv": [{"name": k, "value": v} for k, v in engine_env.items()],
        # No API server here to send Events to, and its token volume is a projected one.
        "sidecar.events.enabled": False,
    }


def _loading_values(vllm_args: tuple[str, ...], model_dir: str) -> tuple[list[str], dict[str, Any]]:
    """The chart owns `--load-format` (its `loading.mode`; the schema refuses it in
    vllm.extraArgs): a `--load-format sharded_state` on the command line (the bad-release
    experiment's `wrong-tp` kind) becomes mode `shardedState` with the shard set made
    beforehand at `model_dir`. (vLLM takes the last of a repeated flag; so does this.)"""
    args: list[str] = []
    load_format = None
    rest = iter(vllm_args)
    for arg in rest:
        if arg == "--load-format":
            load_format = next(rest, None)
        elif arg.startswith("--load-format="):
            load_format = arg.split("=", 1)[1]
        else:
            args.append(arg)
    if load_format in (None, "auto"):
        return args, {}
    if load_format != "sharded_state":
        raise ValueError(
            f"--runtime podman: --load-format {load_format} is not a local loading mode of the "
            "chart; set it with --chart-set loading.mode=... instead"
        )
    return args, {
        "loading.mode": "shardedState",
        # The sharded modes need the TP said (the chart: a shard set serves only its own TP).
        "parallelism.tensor": tensor_parallel_size(vllm_args),
        "loading.sharded.path": model_dir,
        "loading.sharded.prepare.mode": "none",
    }


def template_values(template: PodTemplate) -> dict[str, Any]:
    """`podman_chart_values` of a pod template: what its rendered pod runs."""
    return podman_chart_values(template.model, template.served_name, template.vllm_args, {})


def _port(value: Any, ports: dict[str, int]) -> int:
    return ports[value] if isinstance(value, str) else int(value)


class PodmanFleet:
    name = "podman"

    def __init__(
        self,
        chart: Path,
        values_files: tuple[Path, ...],
        sets: dict[str, Any],
        helm: str | None,
        workdir: Path,
    ) -> None:
        if reason := oci_env_ready():
            raise KubePlayError(f"--runtime podman: {reason}")
        self._render = (chart, values_files, sets, helm)
        # Ports and images come from this rendering; every template renders the same ones.
        self.deployment = render_deployment(chart, values_files, sets, helm)
        self._deployments: dict[str, dict[str, Any]] = {}
        self.workdir = workdir
        self.prefix = f"ms-rollout-{os.getpid()}"
        spec = self.deployment["spec"]["template"]["spec"]
        vllm = next(c for c in spec["containers"] if c["name"] == "vllm")
        ports = {p["name"]: int(p["containerPort"]) for p in vllm.get("ports", []) if "name" in p}
        self.api_port = ports["http"]
        self.sidecar_port = _port(vllm["readinessProbe"]["httpGet"]["port"], ports)
        self.network, self.subnet = self._create_network()
        self.translations: list[str] = []

    def _create_network(self) -> tuple[str, ipaddress.IPv4Network]:
        name = self.prefix
        taken = set(podman("network", "ls", "--format", "{{.Subnets}}").split())
        for third in random.sample(range(100, 250), 150):
            subnet = ipaddress.IPv4Network(f"{_SUBNET_PREFIX}.{third}.0/24")
            if any(str(subnet) in entry for entry in taken):
                continue
            proc = subprocess.run(
                ["podman", "network", "create", "--subnet", str(subnet), name],
                capture_output=True,
                text=True,
            )
            if proc.returncode == 0:
                return name, subnet
        raise KubePlayError("no free subnet for the experiment's podman network")

    def slots(self, count: int) -> list[Slot]:
        hosts = list(self.subnet.hosts())
        return [
            Slot(i, self.api_port, self.sidecar_port, str(hosts[_FIRST_HOST + i]))
            for i in range(count)
        ]

    def deployment_for(self, template: PodTemplate) -> dict[str, Any]:
        """The Deployment rendered with `template`'s model and engine flags (cached)."""
        values = template_values(template)
        key = json.dumps(values, sort_keys=True)
        if key not in self._deployments:
            chart, values_files, sets, helm = self._render
            self._deployments[key] = render_deployment(
                chart, values_files, {**sets, **values}, helm
            )
        return self._deployments[key]

    def pod(self, name: str, slot: Slot, template: PodTemplate) -> PodmanPod:
        return PodmanPod(name, slot, template, self)

    def describe(self) -> dict[str, Any]:
        return {
            "runtime": self.name,
            "network": self.network,
            "subnet": str(self.subnet),
            "images": sorted(
                {
                    c["image"]
                    for c in self.deployment["spec"]["template"]["spec"]["containers"]
                    + self.deployment["spec"]["template"]["spec"].get("initContainers", [])
                }
            ),
            "translations": self.translations,
        }

    def close(self) -> None:
        podman("network", "rm", "--force", self.network, check=False)


class PodmanPod(Pod):
    """`fleet.Pod`'s lifecycle, carried out by podman on the chart's rendered pod."""

    def __init__(self, name: str, slot: Slot, template: PodTemplate, fleet: PodmanFleet) -> None:
        super().__init__(name, slot, template)
        self.fleet = fleet
        self.played: PlayedPod | None = None

    def start(self) -> PodmanPod:
        self.template.log_dir.mkdir(parents=True, exist_ok=True)
        manifest = pod_manifest(
            self.fleet.deployment_for(self.template),
            f"{self.fleet.prefix}-{self.name}",
            extra_env=self.cpu_env(dict(self.template.env)),  # the kubelet's CPU manager
            restart_policy="Never",  # the caller restarts a crashed vLLM (module docstring)
        )
        for note in manifest.translations:
            if note not in self.fleet.translations:
                self.fleet.translations.append(note)
        self.events["created"] = self.clock()
        self.played = PlayedPod(
            manifest, self.template.log_dir, network=self.fleet.network, ip=self.slot.host
        )
        self.played.play()
        return self

    def check_alive(self) -> None:
        assert self.played is not None
        for container in ("vllm", "sidecar"):
            status, code = self.played.state(container)
            if status not in ("running", "created", "configured"):
                self.played.save_logs(self.template.log_dir, self.name)
                log = self.template.log_dir / f"{self.name}-{container}.log"
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
                raise RuntimeError(
                    f"pod {self.name}: container {container} {status} ({code}):\n{tail}"
                )

    def _exec_prestop(self, command: list[str], budget: float) -> subprocess.CompletedProcess[str]:
        """The rendered command inside the vLLM container, with that container's own env."""
        assert self.played is not None
        return self.played.exec("vllm", command, timeout=budget)

    def _stop_vllm(self, grace: float) -> tuple[int | None, bool]:
        assert self.played is not None
        stopped = self.played.stop("vllm", grace)
        return stopped.code, stopped.killed

    def _stop_sidecar(self) -> None:
        assert self.played is not None
        self.played.stop("sidecar", _SIDECAR_STOP_SECONDS)
        # Both containers are stopped: their logs are final (the report reads the sidecar's).
        self.played.save_logs(self.template.log_dir, self.name)

    def vllm_exit_code(self) -> int | None:
        assert self.played is not None
        status, code = self.played.state("vllm")
        return code if status in ("exited", "stopped") else None

    def restart_vllm(self, attempt: int) -> None:
        assert self.played is not None
        self.played.start("vllm")

    def vllm_state(self) -> dict[str, Any]:
        assert self.played is not None
        status, _ = self.played.state("vllm")
        return {
            "vllm_container": self.played.container_id("vllm"),
            "vllm_started_at": self.played.started_at("vllm"),
            "vllm_running_at_end": status == "running",
        }

    def kill(self) -> None:
        if self.played is not None:
            with contextlib.suppress(KubePlayError, subprocess.SubprocessError, OSError):
                self.played.save_logs(self.template.log_dir, self.name)
            self.played.remove()
