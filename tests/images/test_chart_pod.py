"""The chart's own pod, run from the images: `helm template` for the CPU `local` mode
(ci/cpu-local-tp1-values.yaml, the tiny model on the hostPath), the rendered Deployment's pod played
by `podman kube play` (the closest thing to a kubelet here: no API server; docs/architecture.md §3)
with the translations of `ministream_loadtest.kube_play` (listed in docs/images.md), then:

- the OpenAI API answers on the rendered port, at the pod's own IP as a Service reaches it;
- /readyz, the rendered readiness probe's path and port, turns 200 only after the warmup:
  by then vLLM has served the rendered number of warmup requests;
- both containers run as the rendered non-root user with a read-only root filesystem;
- the rendered `helm test` pod runs from the sidecar image against the pod and passes;
- the rendered preStop command, run inside the vLLM container (podman runs no hooks, so the
  test does what the kubelet would), drains the pod while a request is in flight; SIGTERM
  then stops vLLM well within the rendered grace period.

Marked `images`, `engine` (a real vLLM in the CPU image) and `root`.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from imagekit import ROOT

from ministream_loadtest.kube_play import PlayedPod, pod_manifest, podman
from ministream_testkit.helm import RELEASE, render
from ministream_testkit.vllm_server import TINY_ENGINE_ARGS, request_counts
from ministream_testkit.waiting import wait_until
from tests.support.models import ModelFactory

pytestmark = [
    pytest.mark.images,
    pytest.mark.engine,
    pytest.mark.network,
    pytest.mark.root("buildah --isolation chroot and podman with runc"),
    pytest.mark.timeout(3600),
]

CHART = ROOT / "charts" / "ministream"
VALUES = CHART / "ci" / "cpu-local-tp1-values.yaml"
NAMESPACE = "serving"
# Unique on this machine, as a ReplicaSet's pod names are in a cluster: podman's names (pods,
# containers, the emptyDir volumes) are machine-wide, and two test sessions (two checkouts'
# CI runs on one machine) would otherwise remove each other's pods.
POD_NAME = f"{RELEASE}-ministream-{os.getpid()}"
# What podman 4.3 cannot run as rendered (ministream_loadtest.kube_play, docs/images.md).
EXPECTED_TRANSLATIONS = {
    "Deployment: its pod template as a Pod",
    "native sidecar (initContainer, restartPolicy Always) -> container",
    f"fieldRef metadata.namespace -> value {NAMESPACE!r}",
    "containers[].ports dropped (podman publishes them on the host)",
    "emptyDir medium Memory -> hostPath on the host's /dev/shm (1777)",
    "emptyDir volumes renamed <pod>-<volume> (podman shares by name)",
    "subPath of an emptyDir -> an emptyDir of its own",
}


def _http(url: str, body: dict[str, Any] | None = None, timeout: float = 5) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, repr(exc)


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


@dataclass
class ChartPodRun:
    pod: PlayedPod
    deployment: dict[str, Any]
    docs: list[dict[str, Any]]
    translations: list[str]
    readiness: list[tuple[float, int, str]] = field(default_factory=list)  # (s, status, body)
    health_ok_at: float | None = None
    ready_at: float | None = None
    sidecar_metrics_at_ready: str = ""
    vllm_metrics_at_ready: str = ""

    def container(self, name: str) -> dict[str, Any]:
        spec = self.deployment["spec"]["template"]["spec"]
        for c in spec["containers"] + spec.get("initContainers", []):
            if c["name"] == name:
                return dict(c)
        raise KeyError(name)

    @property
    def api_port(self) -> int:
        return int(self.container("vllm")["ports"][0]["containerPort"])

    @property
    def probe(self) -> dict[str, Any]:
        return dict(self.container("vllm")["readinessProbe"]["httpGet"])

    def url(self, port: int, path: str) -> str:
        return f"http://{self.pod.ip}:{port}{path}"


def _model_on_host_path(models: ModelFactory, folder: Path) -> Path:
    """The tiny model in a folder the pod's non-root user may read (a hostPath, as on kind)."""
    source = models.converted("tiny", "float32")
    target = folder / "ministream-tiny"
    shutil.copytree(source, target)
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return target


def _render(model_dir: Path) -> list[dict[str, Any]]:
    sets = {
        "loading.local.hostPath": str(model_dir.parent),
        "loading.local.modelDir": model_dir.name,
        "vllm.extraArgs": list(TINY_ENGINE_ARGS),
    }
    return render(CHART, [VALUES], sets, namespace=NAMESPACE)


@pytest.fixture(scope="module")
def chart_pod(
    built_images: dict[str, Any], models: ModelFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ChartPodRun]:
    model_dir = _model_on_host_path(models, tmp_path_factory.mktemp("hostpath"))
    docs = _render(model_dir)
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    manifest = pod_manifest(deployment, POD_NAME, namespace=NAMESPACE)
    workdir = tmp_path_factory.mktemp("chart-pod")
    pod = PlayedPod(manifest, workdir)
    run = ChartPodRun(pod, deployment, docs, manifest.translations)
    startup = run.container("vllm")["startupProbe"]
    budget = startup["periodSeconds"] * startup["failureThreshold"]
    began = time.monotonic()
    try:
        pod.play()
        probe = run.probe
        while time.monotonic() - began < budget:
            for container in ("vllm", "sidecar"):
                status, code = pod.state(container)
                assert status == "running", f"{container} {status} ({code}); logs in {workdir}"
            now = round(time.monotonic() - began, 2)
            if run.health_ok_at is None and _http(run.url(run.api_port, "/health"))[0] == 200:
                run.health_ok_at = now
            status, body = _http(run.url(probe["port"], probe["path"]))
            run.readiness.append((now, status, body))
            if status == 200:
                run.ready_at = now
                run.sidecar_metrics_at_ready = _http(run.url(probe["port"], "/metrics"))[1]
                run.vllm_metrics_at_ready = _http(run.url(run.api_port, "/metrics"))[1]
                break
            time.sleep(0.5)
        assert run.ready_at is not None, f"not ready within {budget}s; logs in {workdir}"
        yield run
    finally:
        pod.save_logs(workdir)
        pod.remove()


def test_only_the_documented_translations(chart_pod: ChartPodRun) -> None:
    assert set(chart_pod.translations) == EXPECTED_TRANSLATIONS


def test_openai_api_answers_on_the_rendered_port(chart_pod: ChartPodRun) -> None:
    args = chart_pod.container("vllm")["args"]
    assert args[args.index("--port") + 1] == str(chart_pod.api_port)
    served = args[args.index("--served-model-name") + 1]
    status, body = _http(chart_pod.url(chart_pod.api_port, "/v1/models"))
    assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == [served]
    status, body = _http(
        chart_pod.url(chart_pod.api_port, "/v1/completions"),
        {"model": served, "prompt": "hello", "max_tokens": 8, "temperature": 0},
        timeout=120,
    )
    assert status == 200, body
    assert json.loads(body)["usage"]["completion_tokens"] >= 1


def test_ready_only_after_warmup(chart_pod: ChartPodRun) -> None:
    env = {e["name"]: e.get("value") for e in chart_pod.container("sidecar")["env"]}
    warmup = int(env["MINISTREAM_SIDECAR_WARMUP_REQUESTS"])
    not_ready = [(t, json.loads(b)["reasons"]) for t, s, b in chart_pod.readiness if s == 503]
    print(
        f"vLLM /health 200 at {chart_pod.health_ok_at}s, /readyz 200 at {chart_pod.ready_at}s; "
        f"before: {sorted({r for _, reasons in not_ready for r in reasons})}"
    )
    assert not_ready, "the pod was never seen not ready"
    assert chart_pod.health_ok_at is not None and chart_pod.health_ok_at <= chart_pod.ready_at
    sidecar = chart_pod.sidecar_metrics_at_ready
    assert _metric(sidecar, "ministream_warmup_requests_total", outcome="success") == warmup
    assert _metric(chart_pod.vllm_metrics_at_ready, "vllm:request_success_total") >= warmup
    # vLLM's own phases reach the sidecar through the rendered startup-log volume (the
    # plugin in the serving image writes it, the sidecar container reads it read-only).
    phases = {
        p: _metric(sidecar, "ministream_cold_start_phase_seconds", phase=p)
        for p in ("imports", "engine_core_start", "weights", "api_server_up")
    }
    print(f"vLLM start by phase: {phases}")
    assert all(v > 0 for v in phases.values()), phases


def test_containers_run_as_the_rendered_user_read_only(chart_pod: ChartPodRun) -> None:
    spec = chart_pod.deployment["spec"]["template"]["spec"]
    uid, gid = spec["securityContext"]["runAsUser"], spec["securityContext"]["runAsGroup"]
    for name in ("vllm", "sidecar"):
        assert chart_pod.container(name)["securityContext"]["readOnlyRootFilesystem"] is True
        proc = chart_pod.pod.exec(name, ["sh", "-c", "id -u; id -g; touch /opt/x"], timeout=60)
        assert proc.stdout.split() == [str(uid), str(gid)], proc.stdout
        assert "Read-only file system" in proc.stderr
        flag = podman(
            "inspect",
            "--format",
            "{{.HostConfig.ReadonlyRootfs}}",
            chart_pod.pod.container_id(name),
        )
        assert flag.strip() == "true"


def test_helm_test_pod_passes(chart_pod: ChartPodRun, tmp_path: Path) -> None:
    """The rendered `helm test` Pod, from the sidecar image. Its BASE_URL names the Service
    (`<release>-ministream.<ns>.svc`), which no cluster DNS resolves here: it is pointed at
    the pod's own address, where the Service forwards (its targetPort is the vLLM port)."""
    [service] = [d for d in chart_pod.docs if d["kind"] == "Service"]
    assert service["spec"]["ports"][0]["targetPort"] in ("http", chart_pod.api_port)
    [test_pod] = [d for d in chart_pod.docs if d["kind"] == "Pod"]
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    manifest = pod_manifest(test_pod, f"{POD_NAME}-test", namespace=NAMESPACE)
    [container] = manifest.pod["spec"]["containers"]
    for env in container["env"]:
        if env["name"] == "BASE_URL":
            assert env["value"].startswith(f"http://{service['metadata']['name']}.{NAMESPACE}.svc")
            env["value"] = chart_pod.url(chart_pod.api_port, "")
    played = PlayedPod(manifest, tmp_path)
    try:
        played.play(address=False)  # it calls out and exits; nothing calls it
        code = podman("wait", played.container_id(container["name"]), timeout=300).strip()
        logs = podman("logs", played.container_id(container["name"]), check=False)
        print(logs)
        assert code == "0", logs
        assert "completion:" in logs
    finally:
        played.remove()


def test_prestop_drains_the_pod(chart_pod: ChartPodRun) -> None:
    """Last in this module: the pod is drained and stopped."""
    vllm = chart_pod.container("vllm")
    command = vllm["lifecycle"]["preStop"]["exec"]["command"]
    grace = chart_pod.deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    served = vllm["args"][vllm["args"].index("--served-model-name") + 1]
    in_flight: list[tuple[int, str]] = []
    request = threading.Thread(
        target=lambda: in_flight.append(
            _http(
                chart_pod.url(chart_pod.api_port, "/v1/completions"),
                {"model": served, "prompt": "a", "max_tokens": 480, "ignore_eos": True},
                timeout=300,
            )
        )
    )
    request.start()
    # The hook should find the request running in vLLM (480 tokens: seconds on the tiny
    # model). On a starved machine one /metrics poll can outlast the whole request, so a
    # request already finished ends the wait too, as the fixed sleep did.
    wait_until(
        lambda: (
            not request.is_alive()
            or request_counts(chart_pod.url(chart_pod.api_port, "")).running >= 1
        ),
        timeout=60,
        what="the completion to be running in the pod's vLLM, or done",
    )
    began = time.monotonic()
    hook = chart_pod.pod.exec("vllm", command, timeout=grace)
    hook_seconds = time.monotonic() - began
    print(f"preStop {command}: exit {hook.returncode} after {hook_seconds:.1f}s: {hook.stdout}")
    assert hook.returncode == 0, hook.stdout + hook.stderr
    drain = json.loads(hook.stdout.strip().splitlines()[-1])["drain"]
    assert drain["status"] == 200
    request.join(300)
    assert in_flight and in_flight[0][0] == 200, in_flight  # finished during the drain
    probe = chart_pod.probe
    status, body = _http(chart_pod.url(probe["port"], probe["path"]))
    assert status == 503 and "draining" in json.loads(body)["reasons"]
    stopped = chart_pod.pod.stop("vllm", grace=grace - hook_seconds)
    print(f"vLLM exit code {stopped.code} after SIGTERM")
    shutdown = [
        line for line in chart_pod.pod.logs("vllm").splitlines() if "shutdown" in line.lower()
    ]
    assert not stopped.killed and stopped.code == 0, (
        f"vLLM's stop outlived the grace period ({grace - hook_seconds:.0f} s left after the "
        "hook); where its processes were at the SIGKILL:\n"
        + "\n".join(stopped.lingering)
        + "\nits shutdown log:\n"
        + "\n".join(shutdown[-20:])
    )
