"""The chart's serving pod and rollout strategy, read from `helm template` output.

The rolling-restart experiment restarts replicas exactly as the chart's objects say, so
every number and command here is taken from the Deployment that `helm template` renders
from the chart (the one that users install), never recomputed: the grace period, the
preStop hook's command, vLLM's `--shutdown-timeout`, the startup, readiness and liveness
probes, the rollout strategy, and the sidecar's `MINISTREAM_SIDECAR_*` settings.

Finding the chart and helm: `--chart` (default `./charts/ministream`, i.e. run from a
checkout of the project) and `--helm` (default: `ministream_testkit.helm.helm_path`'s
order: the project's `.tools/bin/helm`, where `scripts/install_tools.sh` puts it, then helm
on PATH).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from ministream_sidecar.client import ENV_PREFIX
from ministream_testkit.helm import RenderError, helm_path, render
from ministream_testkit.pd import POOL_LABEL, nixl_env, pod_ip_env

DEFAULT_CHART = Path("charts/ministream")
# Kubernetes' defaults for probe fields the chart leaves unset (the API server fills them in).
_K8S_DEFAULT_SUCCESS_THRESHOLD = 1
_K8S_DEFAULT_PERIOD_SECONDS = 10
_K8S_DEFAULT_TIMEOUT_SECONDS = 1
_K8S_DEFAULT_FAILURE_THRESHOLD = 3
_K8S_DEFAULT_PROGRESS_DEADLINE_SECONDS = 600
# Pod wiring that each local pod sets for itself (ports and paths differ per pod on one
# machine).
_POD_WIRING = {"HOST", "PORT", "VLLM_URL", "MODEL_NAME", "STARTUP_LOG"}
_SIDECAR_PREFIX = "MINISTREAM_SIDECAR_"
# vLLM flags (each with one value) that each local pod sets for itself: where the model is,
# its ports and name, and the hardware split (the caller's vLLM arguments say that).
POD_VLLM_FLAGS = frozenset(
    {
        "--model",
        "--served-model-name",
        "--host",
        "--port",
        "--tensor-parallel-size",
        "--load-format",
        "--model-loader-extra-config",
    }
)

RolloutMode = Literal["surge", "inPlace"]
# The label value of the router's objects (charts/ministream/templates/_router.tpl).
ROUTER_COMPONENT = "router"

# What the experiment's own pods are, for the chart to render at all: CPU processes with no
# API key, serving `--model` themselves (the rendered volume and --model are not used). Every
# timing, probe and strategy value stays the chart's default unless the caller overrides it.
LOCAL_RUN_VALUES: dict[str, Any] = {
    "accelerator.type": "cpu",
    "apiKey.enabled": False,
    "loading.mode": "local",
    "loading.local.hostPath": "/models",
}


class ChartError(Exception):
    """The chart could not be found, or helm could not render it."""


ProbeKind = Literal["startup", "liveness", "readiness"]
ProbeTarget = Literal["api", "sidecar"]


@dataclass(frozen=True)
class ProbeSpec:
    """One rendered probe of the vLLM container, with Kubernetes' defaults filled in."""

    kind: ProbeKind
    path: str
    target: ProbeTarget  # "api": vLLM's port; "sidecar": the sidecar's port
    period_seconds: float
    timeout_seconds: float
    failure_threshold: int
    success_threshold: int = _K8S_DEFAULT_SUCCESS_THRESHOLD
    initial_delay_seconds: float = 0.0


@dataclass(frozen=True)
class ChartPod:
    """What the rendered Deployment says about one serving pod and the rollout."""

    chart: str
    rollout_mode: RolloutMode
    max_surge: int
    max_unavailable: int
    min_ready_seconds: int
    # How long a rollout may go without progress before the Deployment reports it stalled
    # (condition Progressing=False, reason ProgressDeadlineExceeded).
    progress_deadline_seconds: int
    termination_grace_period_seconds: int
    prestop_command: tuple[str, ...]
    vllm_shutdown_timeout_seconds: int
    # The rendered vLLM arguments a local pod passes too: all but the pod's wiring and the
    # hardware (POD_VLLM_FLAGS), e.g. --shutdown-timeout, --max-num-queued-reqs, extraArgs.
    vllm_args: tuple[str, ...]
    startup_probe: ProbeSpec
    liveness_probe: ProbeSpec
    readiness_probe: ProbeSpec
    sidecar_settings: dict[str, str]  # MINISTREAM_SIDECAR_* plain values, pod wiring removed
    # The router container's rendered arguments with `router.enabled` (vLLM's router in
    # front of the pods, Kubernetes discovery included); () without the router.
    router_args: tuple[str, ...] = ()
    # The serving pod's labels (what the router's selector and the Service match).
    pod_labels: dict[str, str] = field(default_factory=dict)
    # With `disaggregation.enabled`: the pool this pod belongs to (`ministream.io/pool`), the
    # vLLM container's literal NIXL/UCX environment, and the variables the cluster fills with
    # the pod's own IP (`status.podIP`, e.g. NIXL's side-channel host).
    pool: str | None = None
    vllm_env: dict[str, str] = field(default_factory=dict)
    pod_ip_env: tuple[str, ...] = ()

    @property
    def probes(self) -> tuple[ProbeSpec, ProbeSpec, ProbeSpec]:
        """startup, liveness, readiness: the kubelet runs the last two once the first passed."""
        return (self.startup_probe, self.liveness_probe, self.readiness_probe)

    def setting(self, name: str) -> str:
        """A sidecar setting by its Python name, e.g. `drain_min_seconds`."""
        return self.sidecar_settings[_SIDECAR_PREFIX + name.upper()]

    @property
    def drain_timeout_seconds(self) -> float:
        return float(self.setting("drain_timeout_seconds"))

    @property
    def drain_min_seconds(self) -> float:
        return float(self.setting("drain_min_seconds"))

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "drain_timeout_seconds": self.drain_timeout_seconds,
            "drain_min_seconds": self.drain_min_seconds,
        }


def find_helm(helm: str | None = None) -> str:
    """`ministream_testkit.helm.helm_path`, with its error as a ChartError."""
    try:
        return helm_path(helm)
    except FileNotFoundError as exc:
        raise ChartError(f"the experiment renders the chart with `helm template`: {exc}") from None


def render_documents(
    chart: Path = DEFAULT_CHART,
    values_files: Sequence[Path] = (),
    sets: dict[str, Any] | None = None,
    helm: str | None = None,
) -> list[dict[str, Any]]:
    """Every object `helm template` renders (values files and `--set-json` pairs applied)."""
    if not (chart / "Chart.yaml").is_file():
        raise ChartError(
            f"no Helm chart at {chart}: pass --chart PATH to the ministream chart "
            "(charts/ministream in the project checkout)"
        )
    try:
        return render(
            chart, values_files, {**LOCAL_RUN_VALUES, **(sets or {})}, helm=find_helm(helm)
        )
    except RenderError as exc:
        raise ChartError(f"helm template {chart} failed: {exc}") from None


def _component(doc: dict[str, Any]) -> str | None:
    return doc.get("metadata", {}).get("labels", {}).get("app.kubernetes.io/component")


def _serving_deployment(
    docs: list[dict[str, Any]], chart: Path, pool: str | None = None
) -> dict[str, Any]:
    """The serving pods' Deployment (with `router.enabled` the router's is rendered too); with
    `disaggregation.enabled` the `pool`'s (prefill or decode)."""
    deployments = [
        d
        for d in docs
        if d.get("kind") == "Deployment"
        and _component(d) != ROUTER_COMPONENT
        and (pool is None or d["metadata"].get("labels", {}).get(POOL_LABEL) == pool)
    ]
    if len(deployments) != 1:
        what = f"{pool} Deployment" if pool else "serving Deployment"
        raise ChartError(f"expected one {what} from {chart}, got {len(deployments)}")
    return deployments[0]


def _router_args(docs: list[dict[str, Any]]) -> tuple[str, ...]:
    """The router container's arguments when the chart renders the router; () otherwise."""
    for doc in docs:
        if doc.get("kind") == "Deployment" and _component(doc) == ROUTER_COMPONENT:
            router = _container(doc["spec"]["template"]["spec"], "router")
            return tuple(str(a) for a in router["args"])
    return ()


def render_deployment(
    chart: Path = DEFAULT_CHART,
    values_files: Sequence[Path] = (),
    sets: dict[str, Any] | None = None,
    helm: str | None = None,
) -> dict[str, Any]:
    """The serving Deployment `helm template` renders (values files and `--set-json` pairs
    applied)."""
    return _serving_deployment(render_documents(chart, values_files, sets, helm), chart)


def _container(spec: dict[str, Any], name: str) -> dict[str, Any]:
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        if c["name"] == name:
            return dict(c)
    raise ChartError(f"the rendered pod has no container {name!r}")


def _flag(args: list[str], flag: str) -> str:
    if flag not in args:
        raise ChartError(f"the rendered vLLM arguments have no {flag}")
    return args[args.index(flag) + 1]


def _without_pod_flags(args: list[str]) -> tuple[str, ...]:
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in POD_VLLM_FLAGS:
            skip = True
        elif arg.split("=", 1)[0] not in POD_VLLM_FLAGS:
            kept.append(str(arg))
    return tuple(kept)


def _probe(kind: ProbeKind, container: dict[str, Any]) -> ProbeSpec:
    """The container's `<kind>Probe`, with the API server's defaults for unset fields (period
    10 s, timeout 1 s, failure threshold 3, success threshold 1, no initial delay)."""
    probe = container.get(f"{kind}Probe")
    if not probe or "httpGet" not in probe:
        raise ChartError(f"the rendered vllm container has no HTTP {kind}Probe")
    port = probe["httpGet"]["port"]
    named = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    # A named port is one of the vLLM container's own (vLLM's API); a number that is not one
    # of them is the sidecar's, which shares the pod's network namespace.
    own = isinstance(port, str) or port in named.values()
    return ProbeSpec(
        kind=kind,
        path=probe["httpGet"].get("path", "/"),
        target="api" if own else "sidecar",
        period_seconds=float(probe.get("periodSeconds", _K8S_DEFAULT_PERIOD_SECONDS)),
        timeout_seconds=float(probe.get("timeoutSeconds", _K8S_DEFAULT_TIMEOUT_SECONDS)),
        failure_threshold=int(probe.get("failureThreshold", _K8S_DEFAULT_FAILURE_THRESHOLD)),
        success_threshold=int(probe.get("successThreshold", _K8S_DEFAULT_SUCCESS_THRESHOLD)),
        initial_delay_seconds=float(probe.get("initialDelaySeconds", 0)),
    )


def _mode(max_surge: int, max_unavailable: int) -> RolloutMode:
    if max_surge >= 1 and max_unavailable == 0:
        return "surge"
    if max_surge == 0 and max_unavailable >= 1:
        return "inPlace"
    raise ChartError(
        f"the experiment replays maxSurge 1/maxUnavailable 0 or 0/1, not "
        f"{max_surge}/{max_unavailable}"
    )


def chart_pod(
    chart: Path = DEFAULT_CHART,
    values_files: Sequence[Path] = (),
    sets: dict[str, Any] | None = None,
    helm: str | None = None,
    pool: str | None = None,
) -> ChartPod:
    """The rendered serving pod; `pool`: with `disaggregation.enabled`, the prefill or decode
    Deployment's."""
    docs = render_documents(chart, values_files, sets, helm)
    deployment = _serving_deployment(docs, chart, pool)
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    vllm, sidecar = _container(pod, "vllm"), _container(pod, "sidecar")
    rolling = spec["strategy"]["rollingUpdate"]
    max_surge, max_unavailable = int(rolling["maxSurge"]), int(rolling["maxUnavailable"])
    settings = {
        e["name"]: e["value"]
        for e in sidecar.get("env", [])
        if e["name"].startswith(_SIDECAR_PREFIX)
        and "value" in e
        and e["name"].removeprefix(_SIDECAR_PREFIX) not in _POD_WIRING
    }
    return ChartPod(
        chart=str(chart),
        rollout_mode=_mode(max_surge, max_unavailable),
        max_surge=max_surge,
        max_unavailable=max_unavailable,
        min_ready_seconds=int(spec.get("minReadySeconds", 0)),
        progress_deadline_seconds=int(
            spec.get("progressDeadlineSeconds", _K8S_DEFAULT_PROGRESS_DEADLINE_SECONDS)
        ),
        termination_grace_period_seconds=int(pod["terminationGracePeriodSeconds"]),
        prestop_command=tuple(vllm["lifecycle"]["preStop"]["exec"]["command"]),
        vllm_shutdown_timeout_seconds=int(_flag(vllm["args"], "--shutdown-timeout")),
        vllm_args=_without_pod_flags(vllm["args"]),
        startup_probe=_probe("startup", vllm),
        liveness_probe=_probe("liveness", vllm),
        readiness_probe=_probe("readiness", vllm),
        sidecar_settings=settings,
        router_args=_router_args(docs),
        pod_labels=dict(spec["template"]["metadata"]["labels"]),
        pool=pool,
        vllm_env=nixl_env(vllm),
        pod_ip_env=pod_ip_env(vllm),
    )


def run_prestop(
    command: Sequence[str],
    sidecar_port: int,
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """The rendered preStop `command` run as the kubelet runs it in the pod, here: this
    interpreter standing in for the image's python3, the pod's sidecar port in
    MINISTREAM_SIDECAR_PORT (and `env`'s variables beside it, e.g. the token). Raises
    subprocess.TimeoutExpired after `timeout` s, as the kubelet cuts off a hook."""
    argv = list(command)
    if argv[0] == "python3":
        argv[0] = sys.executable
    return subprocess.run(
        argv,
        env={**os.environ, **(env or {}), f"{ENV_PREFIX}PORT": str(sidecar_port)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def drain_answer(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """What the preStop command printed on its last line: `{"drain": {...}}`, the sidecar's
    drain (status, and the /drain body). Raises ValueError or KeyError when it printed
    something else."""
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])["drain"]
    return answer
