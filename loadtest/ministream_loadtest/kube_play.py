"""The chart's rendered pod, run from the images by `podman kube play`: the closest thing to a
kubelet these machines have (no API server, no Docker daemon; docs/architecture.md §3).

`pod_manifest` turns the Deployment that `helm template` renders into the Pod that podman
4.3 (Debian bookworm) runs. Everything is passed through as rendered except these
translations, each for a field that podman 4.3 does not support as Kubernetes does; each
applied one is listed in `PodManifest.translations` (docs/images.md):

- `kind`: the Deployment's pod template becomes a Pod of the given name (what the ReplicaSet
  controller would create);
- native sidecar: an `initContainers` entry with `restartPolicy: Always` moves to the front
  of `containers` (podman runs init containers to completion before the app containers, so
  the sidecar would block vLLM forever); its `restartPolicy` field goes;
- `fieldRef: metadata.namespace` becomes the namespace's literal value (podman supports
  metadata.name and metadata.uid only);
- `containers[].ports` go: podman publishes every containerPort on the host's same port, which
  Kubernetes never does (two pods would collide); pods are reached at their own IP, as in a
  cluster;
- `emptyDir: {medium: Memory}` becomes a `hostPath` to a fresh directory (mode 1777) on this
  host's memory-backed /dev/shm: podman makes a disk volume that only root can write;
- every other `emptyDir` volume is renamed `<pod>-<volume>` (and its mounts with it): podman
  4.3 makes a named volume called by the volume's name, which every pod using that name
  shares (seen here: two replicas' vLLMs in one PROMETHEUS_MULTIPROC_DIR, PIDs colliding
  across their PID namespaces, crashed one with "file is corrupted"); an emptyDir is the
  pod's own. podman removes these volumes with the pod;
- a mount of an emptyDir with a `subPath` gets an emptyDir of its own, `<volume>-<subPath>`
  (podman 4.3 ignores subPath there: the sidecar and vLLM would share one /tmp), which is
  what subdirectories of one fresh empty directory amount to;
- `extra_env` (the rolling-restart experiment only): per-pod variables appended to the vLLM
  container's env, standing in for what the kubelet gives each pod (its CPU set);
- `restart_policy` (the rolling-restart and bad-release experiments): the pod's
  `restartPolicy` (rendered: unset, i.e. Always) replaced: podman restarts an exited
  container at once, with no back-off, so the caller that replays the kubelet's crash-loop
  back-off asks for `Never` and restarts the container itself.

Probes are left as rendered: podman turns the liveness probe into a healthcheck that needs
systemd (absent here, so it never runs) and ignores the others; the caller polls the rendered
readiness probe itself (the test, or HAProxy's check in the experiment). podman runs no
preStop hook either: the caller runs the rendered command with `podman exec`.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ministream_testkit.processes import pid_namespace_members, where_it_waits

PODMAN_HINT = "podman is not installed: run scripts/install_oci.sh"
_MEMORY_ROOT = Path("/dev/shm")
_SUPPORTED_FIELD_REFS = {"metadata.name", "metadata.uid"}


class KubePlayError(RuntimeError):
    """podman refused the pod, or one of its containers failed."""


@dataclass
class PodManifest:
    """A Pod for `podman kube play`, and the translations that made it from the rendering."""

    pod: dict[str, Any]
    translations: list[str] = field(default_factory=list)
    memory_dirs: list[Path] = field(default_factory=list)  # hostPath stand-ins to remove

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])

    def container(self, name: str) -> dict[str, Any]:
        for container in self.pod["spec"]["containers"]:
            if container["name"] == name:
                return dict(container)
        raise KeyError(name)

    def yaml(self) -> str:
        return yaml.safe_dump(self.pod, sort_keys=False)


def _note(translations: list[str], text: str) -> None:
    if text not in translations:
        translations.append(text)


def pod_manifest(
    rendered: Mapping[str, Any],
    name: str,
    *,
    namespace: str = "default",
    extra_env: Mapping[str, str] | None = None,
    env_container: str = "vllm",
    restart_policy: str | None = None,
) -> PodManifest:
    """The rendered Deployment's (or Pod's) pod as a Pod podman 4.3 runs (module docstring)."""
    result = _as_pod(rendered, name)
    spec, translations = result.pod["spec"], result.translations
    if restart_policy is not None:
        rendered_policy = spec.get("restartPolicy", "Always")
        spec["restartPolicy"] = restart_policy
        _note(translations, f"restartPolicy {rendered_policy} -> {restart_policy}")
    _move_native_sidecars(spec, translations)
    _translate_containers(spec, translations, namespace, extra_env, env_container)
    renamed = _translate_empty_dirs(result)
    _split_sub_paths(spec, translations, renamed)
    return result


def _as_pod(rendered: Mapping[str, Any], name: str) -> PodManifest:
    """A Pod named `name` with a copy of the rendered pod's spec and its labels."""
    if rendered.get("kind") == "Deployment":
        template = rendered["spec"]["template"]
        meta = {k: v for k, v in template.get("metadata", {}).items() if k in ("labels",)}
        spec = copy.deepcopy(template["spec"])
        translations = ["Deployment: its pod template as a Pod"]
    else:
        meta = {k: v for k, v in rendered.get("metadata", {}).items() if k in ("labels",)}
        spec = copy.deepcopy(rendered["spec"])
        translations = []
    return PodManifest(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **meta}, "spec": spec},
        translations,
    )


def _move_native_sidecars(spec: dict[str, Any], translations: list[str]) -> None:
    sidecars = [c for c in spec.get("initContainers", []) if c.get("restartPolicy") == "Always"]
    if sidecars:
        spec["initContainers"] = [c for c in spec["initContainers"] if c not in sidecars]
        if not spec["initContainers"]:
            del spec["initContainers"]
        for c in sidecars:
            del c["restartPolicy"]
        spec["containers"] = sidecars + spec["containers"]
        _note(translations, "native sidecar (initContainer, restartPolicy Always) -> container")


def _translate_containers(
    spec: dict[str, Any],
    translations: list[str],
    namespace: str,
    extra_env: Mapping[str, str] | None,
    env_container: str,
) -> None:
    """The namespace's fieldRef as its value, no ports, the per-pod env added."""
    for container in spec.get("containers", []) + spec.get("initContainers", []):
        for env in container.get("env", []):
            ref = env.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            if ref == "metadata.namespace":
                env.pop("valueFrom")
                env["value"] = namespace
                _note(translations, f"fieldRef metadata.namespace -> value {namespace!r}")
            elif ref is not None and ref not in _SUPPORTED_FIELD_REFS:
                raise KubePlayError(f"podman 4.3 cannot set {env['name']} from fieldRef {ref}")
        if container.pop("ports", None):
            _note(translations, "containers[].ports dropped (podman publishes them on the host)")
        if extra_env and container["name"] == env_container:
            container.setdefault("env", []).extend(
                {"name": k, "value": v} for k, v in extra_env.items()
            )
            _note(translations, f"per-pod env added to {env_container}: {sorted(extra_env)}")


def _translate_empty_dirs(result: PodManifest) -> dict[str, str]:
    """Rename disk emptyDirs `<pod>-<volume>` and turn memory ones into hostPaths on
    /dev/shm; return the renames, old name to new."""
    name, spec, translations = result.name, result.pod["spec"], result.translations
    renamed: dict[str, str] = {}
    for volume in spec.get("volumes", []):
        empty = volume.get("emptyDir")
        if empty is not None and empty.get("medium") != "Memory":
            renamed[volume["name"]] = volume["name"] = f"{name}-{volume['name']}"
            _note(translations, "emptyDir volumes renamed <pod>-<volume> (podman shares by name)")
        if empty is not None and empty.get("medium") == "Memory":
            folder = Path(tempfile.mkdtemp(prefix=f"{name}-{volume['name']}-", dir=_MEMORY_ROOT))
            folder.chmod(0o1777)
            result.memory_dirs.append(folder)
            del volume["emptyDir"]
            volume["hostPath"] = {"path": str(folder), "type": "Directory"}
            _note(translations, "emptyDir medium Memory -> hostPath on the host's /dev/shm (1777)")
    return renamed


def _split_sub_paths(
    spec: dict[str, Any], translations: list[str], renamed: dict[str, str]
) -> None:
    """Mounts follow their volume's rename; a subPath of an emptyDir becomes an emptyDir of
    its own (and the volume it was cut from goes when no mount is left on it)."""
    own: dict[str, dict[str, Any]] = {}  # emptyDirs split off by subPath
    for container in spec.get("containers", []) + spec.get("initContainers", []):
        for mount in container.get("volumeMounts", []):
            mount["name"] = renamed.get(mount["name"], mount["name"])
            if mount["name"] in renamed.values() and mount.get("subPath"):
                volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
                split = f"{mount['name']}-{mount.pop('subPath').strip('/').replace('/', '-')}"
                own.setdefault(split, {**copy.deepcopy(volume), "name": split})
                mount["name"] = split
                _note(translations, "subPath of an emptyDir -> an emptyDir of its own")
    if own:
        used = {m["name"] for c in spec["containers"] for m in c.get("volumeMounts", [])}
        spec["volumes"] = [
            v for v in spec["volumes"] if v["name"] in used or v["name"] not in renamed.values()
        ] + list(own.values())


# ------------------------------------------------------------------------------- podman
def find_podman() -> str:
    found = shutil.which("podman")
    if not found:
        raise FileNotFoundError(PODMAN_HINT)
    return found


def podman(*args: str, check: bool = True, timeout: float = 300.0) -> str:
    proc = subprocess.run([find_podman(), *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise KubePlayError(f"podman {' '.join(args[:3])} failed: {proc.stderr.strip()[-2000:]}")
    return proc.stdout


@dataclass(frozen=True)
class Stopped:
    """How a container stopped: its exit code, whether the grace period ran out (SIGKILL),
    and where its processes were at that moment (`where_it_waits`, one line each)."""

    code: int
    killed: bool
    lingering: list[str] = field(default_factory=list)


@dataclass
class PlayedPod:
    """A pod started by `podman kube play`; its containers are `<pod>-<container>`."""

    manifest: PodManifest
    workdir: Path
    network: str | None = None
    ip: str | None = None

    @property
    def name(self) -> str:
        return self.manifest.name

    def container_id(self, container: str) -> str:
        return f"{self.name}-{container}"

    def play(self, *, address: bool = True) -> PlayedPod:
        """`podman kube play` the manifest; with `address`, record the pod's IP. A pod that
        runs to completion (a `helm test` Pod) passes False: once its last container exits,
        podman may have stopped the pod's network before the address is read."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        path = self.workdir / f"{self.name}.yaml"
        path.write_text(self.manifest.yaml())
        args = ["kube", "play", "--quiet"]
        if self.network:
            args += ["--network", self.network]
        if self.ip:
            args += ["--ip", self.ip]
        podman(*args, str(path))
        if self.ip is None and address:
            self.ip = self.inspect_ip()
        return self

    def inspect_ip(self) -> str:
        infra = json.loads(podman("pod", "inspect", self.name))
        infra = infra[0] if isinstance(infra, list) else infra
        networks = json.loads(podman("inspect", infra["InfraContainerID"]))[0]
        for net in networks["NetworkSettings"]["Networks"].values():
            if net.get("IPAddress"):
                return str(net["IPAddress"])
        raise KubePlayError(f"pod {self.name} has no IP address")

    def started_at(self, container: str) -> str:
        """When the container last started (podman's State.StartedAt)."""
        return podman(
            "inspect", "--format", "{{.State.StartedAt}}", self.container_id(container)
        ).strip()

    def start(self, container: str) -> None:
        """Start an exited container of the pod again (`podman start`)."""
        podman("start", self.container_id(container))

    def state(self, container: str) -> tuple[str, int]:
        """(status, exit code) of one container: running, exited, ..."""
        out = podman(
            "inspect",
            "--format",
            "{{.State.Status}} {{.State.ExitCode}}",
            self.container_id(container),
        )
        status, code = out.split()
        return status, int(code)

    def exec(
        self, container: str, command: list[str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [find_podman(), "exec", self.container_id(container), *command],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def stop(self, container: str, grace: float) -> Stopped:
        """SIGTERM, then SIGKILL after `grace` s (`podman stop -t`, which also keeps the pod's
        restart policy from starting it again). A second before the SIGKILL is due, a
        container still running has its processes described (each thread's state, wait
        channel and kernel stack): a stop that outlives its grace period says where it was."""
        cid = self.container_id(container)
        init = int(podman("inspect", "--format", "{{.State.Pid}}", cid).strip())
        seconds = max(0, int(grace))
        began = time.monotonic()
        stopping = subprocess.Popen(
            [find_podman(), "stop", "-t", str(seconds), cid],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        lingering: list[str] = []
        try:
            stopping.wait(timeout=max(0, seconds - 1))
        except subprocess.TimeoutExpired:
            lingering = [where_it_waits(pid) for pid in pid_namespace_members(init)]
            stopping.wait(timeout=60)
        _, code = self.state(container)
        # 137 = 128 + SIGKILL: the grace period ran out (podman also logs it).
        killed = code == 137 and time.monotonic() - began >= seconds
        return Stopped(code, killed, lingering if killed else [])

    def logs(self, container: str) -> str:
        """The container's output so far, stdout then stderr (`podman logs`)."""
        proc = subprocess.run(
            [find_podman(), "logs", self.container_id(container)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return proc.stdout + proc.stderr

    def save_logs(self, log_dir: Path, prefix: str | None = None) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        for container in self.manifest.pod["spec"]["containers"]:
            name = container["name"]
            (log_dir / f"{prefix or self.name}-{name}.log").write_text(self.logs(name))

    def remove(self) -> None:
        podman("pod", "rm", "--force", "--time", "0", self.name, check=False, timeout=120)
        # podman removes the pod's emptyDir volumes with it, but once left one behind.
        for volume in self.manifest.pod["spec"].get("volumes", []):
            if "emptyDir" in volume:
                podman("volume", "rm", "--force", volume["name"], check=False, timeout=60)
        for folder in self.manifest.memory_dirs:
            shutil.rmtree(folder, ignore_errors=True)


def oci_env_ready() -> str | None:
    """Why this process cannot run podman here (None when it can)."""
    if os.geteuid() != 0:
        return "needs root (podman with runc, as configured by scripts/images.py)"
    if shutil.which("podman") is None:
        return PODMAN_HINT
    if not os.environ.get("CONTAINERS_CONF"):
        return "CONTAINERS_CONF is not set: run `eval $(python3 scripts/images.py env)` first"
    return None
