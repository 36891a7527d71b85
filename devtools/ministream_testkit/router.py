"""vLLM's router (`vllm-router`, the project's `router` extra) in front of local replicas, with
the chart's own command line.

The chart renders the router's arguments (charts/ministream/templates/_router.tpl): policy,
timeouts, health checks, retries, circuit breaker. A local run keeps every one of them and
swaps only what a cluster provides: Kubernetes discovery (`--service-discovery`, its namespace,
port and `--selector`) becomes `--worker-urls` of the local replicas, the API key from the pod's
Secret is dropped, and addresses become free local ports.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ministream_testkit.helm import CHART, render
from ministream_testkit.kube_api import StandInKubeApi
from ministream_testkit.local_server import LocalServer
from ministream_testkit.net import answers, free_port
from ministream_testkit.processes import stop_process
from ministream_testkit.waiting import wait_until

ROUTER_VALUES = CHART / "ci" / "router-values.yaml"
# The wheel's launcher: beside this interpreter, or where MINISTREAM_VLLM_ROUTER says (a wheel
# unpacked with `pip install --target`, as on the GPU host).
VLLM_ROUTER = Path(
    os.environ.get("MINISTREAM_VLLM_ROUTER") or Path(sys.executable).parent / "vllm-router"
)
INSTALL_HINT = "vllm-router is not installed: run `make setup-test` (the project's `router` extra)"
# Flags of a cluster's discovery, each with the number of values it takes (-1: all up to the
# next flag).
_DISCOVERY = {
    "--service-discovery": 0,
    "--service-discovery-namespace": 1,
    "--service-discovery-port": 1,
    "--selector": -1,
    "--prefill-selector": -1,
    "--decode-selector": -1,
    "--api-key": 1,
}


def routed_workers(url: str) -> list[str]:
    """The worker URLs the router at `url` routes to now (its /workers); [] while it does not
    answer."""
    return listed_workers(url) or []


def listed_workers(url: str) -> list[str] | None:
    """The worker URLs the router at `url` lists in its /workers; None when it did not answer
    (which is not the same as an empty list)."""
    try:
        listed = httpx.get(f"{url}/workers", timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return None
    return [w["url"] if isinstance(w, dict) else w for w in listed.get("workers", [])]


def _container_args(docs: list[dict[str, Any]], component: str, container: str) -> list[str]:
    for doc in docs:
        labels = doc.get("metadata", {}).get("labels", {})
        if doc["kind"] == "Deployment" and labels.get("app.kubernetes.io/component") == component:
            for c in doc["spec"]["template"]["spec"]["containers"]:
                if c["name"] == container:
                    return [str(a) for a in c["args"]]
    raise LookupError(f"no {component} Deployment with a {container} container rendered")


def chart_router_args(values: Path = ROUTER_VALUES, *sets: str) -> list[str]:
    """The router container's arguments as `helm template` renders them."""
    return _container_args(render(values_files=[values], set_args=sets), "router", "router")


def chart_router_engine_args(values: Path = ROUTER_VALUES, *sets: str) -> list[str]:
    """What the router adds to the replicas' vLLM arguments (the chart renders them only with
    router.enabled: the render endpoints cache_aware tokenizes through)."""
    on = _container_args(render(values_files=[values], set_args=sets), "server", "vllm")
    off_sets = (*sets, "router.enabled=false")
    off = _container_args(render(values_files=[values], set_args=off_sets), "server", "vllm")
    return [a for a in on if a not in off]


def local_args(
    chart_args: Sequence[str],
    workers: Sequence[str],
    pd: tuple[str, str] | None = None,
    *,
    discovery_port: int | None = None,
    **overrides: str,
) -> list[str]:
    """The chart's arguments with discovery swapped for `workers` and `overrides` applied
    (`policy="round_robin"`, `port="8123"`: flag names without dashes, `_` for `-`). In P/D
    mode (the chart's `--vllm-pd-disaggregation`), `pd` is the (prefill, decode) pair of URLs
    in place of the pools' selectors. With `discovery_port`, the chart's discovery stays (the
    router watches a Kubernetes API: kube_api's stand-in) and finds the pods' API on that
    port; `workers` and `pd` are unused."""
    out: list[str] = []
    i = 0
    args = list(chart_args)
    while i < len(args):
        flag = args[i]
        if flag in _DISCOVERY and (discovery_port is None or flag == "--api-key"):
            n = _DISCOVERY[flag]
            i += 1
            while i < len(args) and (n < 0 or n > 0) and not args[i].startswith("--"):
                i += 1
                n -= 1
            continue
        out.append(flag)
        i += 1
    if discovery_port is not None:
        overrides = {**overrides, "service_discovery_port": str(discovery_port)}
    for name, value in overrides.items():
        flag = "--" + name.replace("_", "-")
        if flag in out:
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
    if discovery_port is not None:
        return out
    if pd is not None:
        return [*out, "--prefill", pd[0], "--decode", pd[1]]
    return [*out, "--worker-urls", *workers]


@dataclass
class RouterProcess(LocalServer):
    """One vllm-router on 127.0.0.1 in front of `workers`, its log in `log_path`."""

    workers: Sequence[str]
    log_path: Path
    policy: str | None = None  # None: the chart's `--policy`
    chart_args: Sequence[str] = field(default_factory=chart_router_args)
    extra: dict[str, str] = field(default_factory=dict)
    more_args: Sequence[str] = ()  # appended as they are (flags that repeat)
    pd: tuple[str, str] | None = None  # P/D mode: (prefill URL, decode URL); workers unused
    metrics_port: int = field(default_factory=free_port)
    # The router's own discovery against this stand-in API (the pods' API on
    # `discovery_port`) instead of `workers`/`pd`.
    kube_api: StandInKubeApi | None = None
    discovery_port: int | None = None

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def command(self) -> list[str]:
        return [
            str(VLLM_ROUTER),
            *local_args(
                self.chart_args,
                self.workers,
                self.pd,
                discovery_port=self.discovery_port if self.kube_api else None,
                host="127.0.0.1",
                port=str(self.port),
                prometheus_host="127.0.0.1",
                prometheus_port=str(self.metrics_port),
                **({"policy": self.policy} if self.policy else {}),
                **self.extra,
            ),
            *self.more_args,
        ]

    def start(self, timeout: float = 120.0) -> RouterProcess:
        if not VLLM_ROUTER.exists():
            raise FileNotFoundError(INSTALL_HINT)
        env = None
        if self.kube_api is not None:
            kubeconfig = self.kube_api.write_kubeconfig(self.log_path.with_suffix(".kubeconfig"))
            env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        self.launch(self.command(), self.log_path, env=env)

        def up() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"vllm-router exited with {self.process.returncode}: {self.log_path}"
                )
            if self.kube_api is not None:  # its workers come and go with the pods
                return answers(f"{self.url}/liveness")
            expected = len(self.pd) if self.pd else len(self.workers)
            return answers(f"{self.url}/liveness") and len(self.routed_workers()) == expected

        wait_until(up, timeout, 0.25, what=f"vllm-router at {self.url} with its workers")
        return self

    def routed_workers(self) -> list[str]:
        return routed_workers(self.url)

    def wait_workers_healthy(self, timeout: float) -> None:
        """Wait until the router counts every worker healthy (its own /health checks: a worker
        listed at start may still be ejected by them)."""
        expected = len(self.pd) if self.pd else len(self.workers)

        def healthy() -> bool:
            listed = httpx.get(f"{self.url}/workers", timeout=30).json()["workers"]
            return len(listed) == expected and all(w["is_healthy"] for w in listed)

        wait_until(healthy, timeout, 0.5, what=f"{expected} healthy workers at {self.url}")

    def stop(self) -> None:
        stop_process(self.process)
