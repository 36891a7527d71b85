"""vLLM's router (the real `vllm-router`, with the chart's rendered arguments) in front of the
rollout's pods, and what the cluster does around it.

In a cluster the router finds the serving pods itself (`--service-discovery`, docs/fleet.md
"vLLM's router"): it adds a pod once it is Running and Ready, and removes it at once when it
turns not Ready or gets a deletionTimestamp. Here nothing else provides that, so this module
plays it:
- the kubelet's readiness probe of each slot's pod: the chart's rendered readiness probe
  (`ChartPod.readiness_probe`: path, period, timeout, failure and success thresholds) run by
  `probes.PodProbes` from the pod's creation, as HAProxy's health check does for the other
  front;
- the router's discovery: a pod that turns Ready is added through the router's worker API
  (`/add_worker`), one that turns not Ready is removed (`/remove_worker`); a terminating pod
  is removed when the orchestrator calls `remove_endpoint`, `endpoint_lag` after its
  termination began (the watch's delivery delay, the same knob as HAProxy's DRAIN).
Everything else is the router's own: its health checks of vLLM's /health, its retries of 5xx
and connection errors on another replica, its circuit breaker, with the chart's values.

With `discovery="kube-api"` the router's own discovery runs instead (the chart's
`--service-discovery` and selectors, unchanged): a stand-in Kubernetes API
(ministream_testkit.kube_api) lists and watches the slots' pods, each with the chart's pod
labels, its slot's address, Ready as its probe says and a deletion mark while it
terminates; the router adds and removes workers itself. Its discovery reaches every pod on
one port, so the slots share their API port and differ by loopback address (127.0.0.x).
The discovery events are then the router's own changes, read from its /workers.

The router logs no per-request line at info level (nor the request id it forwards), so
there is no access log to trace a failure to a pod: the report traces failures by time and
records the router's own counters (retries, per-worker requests, errors) before and after.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ministream_testkit import router as router_kit
from ministream_testkit.kube_api import StandInKubeApi, StandInPod

from .chart_pod import ChartPod
from .haproxy import Slot
from .probes import PodProbes

# The router's own metric families all carry this prefix (vllm-router 0.1.17).
ROUTER_METRIC_PREFIX = "vllm_router_"
# How often the discovery compares what should be routed with what is.
_DISCOVERY_INTERVAL_S = 0.1
# worker-api: the front adds and removes the router's workers (/add_worker, /remove_worker);
# kube-api: the router's own discovery watches a stand-in Kubernetes API.
Discovery = Literal["worker-api", "kube-api"]


def require_router() -> Path:
    """The vllm-router launcher; a missing one is named with how to install it."""
    if not router_kit.VLLM_ROUTER.exists():
        raise FileNotFoundError(router_kit.INSTALL_HINT)
    return router_kit.VLLM_ROUTER


def discovery_changes(desired: Iterable[int], routed: Iterable[int]) -> tuple[list[int], list[int]]:
    """(slots to add, slots to remove) that bring the router's workers to `desired`."""
    want, have = set(desired), set(routed)
    return sorted(want - have), sorted(have - want)


def slot_state(*, routed: bool, endpoint: bool, terminating: bool) -> str:
    """A slot as the StateWatcher reports it, in HAProxy's words so both fronts read alike:
    UP (the router routes to it), DRAIN (terminating, removed), DOWN (a pod not Ready),
    MAINT (no pod)."""
    if routed:
        return "UP"
    if terminating:
        return "DRAIN"
    return "DOWN" if endpoint else "MAINT"


def router_counters(metrics_text: str) -> dict[str, float]:
    """Every counter sample the router exports, keyed `name{label="value",...}`."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.type != "counter" or not family.name.startswith(ROUTER_METRIC_PREFIX):
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


def counter_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What each counter gained between two readings (a series new since `before` counts
    from 0); unchanged series are left out."""
    deltas = {k: v - before.get(k, 0.0) for k, v in after.items()}
    return {k: d for k, d in sorted(deltas.items()) if d}


@dataclass
class _Endpoint:
    """A slot's pod as the cluster sees it: its readiness prober and whether it terminates."""

    slot: Slot
    probes: PodProbes
    terminating: bool = False

    @property
    def ready(self) -> bool:
        return self.probes.logs["readiness"].ready


@dataclass
class RouterFront:
    """The router and its discovery, with the interface `fronts.Front` names."""

    workdir: Path
    slots: list[Slot]
    chart: ChartPod
    clock: Callable[[], float] = time.perf_counter
    name: str = "router"
    discovery: Discovery = "worker-api"
    # kube-api: a slot's pod labels where they are not the chart's `pod_labels` (P/D: each
    # pool's pods have their own, which the router's pool selectors match)
    slot_labels: Mapping[int, dict[str, str]] = field(default_factory=dict)
    # (clock time, slot server, "added" | "removed: not ready" | "removed: terminating")
    discovery_events: list[tuple[float, str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.chart.router_args:
            raise ValueError("the chart rendered no router: the router front needs router.enabled")
        require_router()
        self.kube: StandInKubeApi | None = None
        if self.discovery == "kube-api":
            self.kube = StandInKubeApi(_namespace(self.chart.router_args)).start()
        self.router = router_kit.RouterProcess(
            workers=[],
            log_path=self.workdir / "router.log",
            chart_args=self.chart.router_args,
            kube_api=self.kube,
            discovery_port=_one_port(self.slots) if self.kube else None,
        )
        # kube-api: the pod each slot holds now (its name carries a generation) as published
        self._pods: dict[int, StandInPod] = {}
        self._generation = 0
        self._endpoints: dict[int, _Endpoint] = {}
        self._routed: set[int] = set()
        # `_lock` guards the endpoints and is never held across a call of the router;
        # `_sync_lock` makes one sync at a time (so `_routed` is only touched by it).
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._discover, name="discovery", daemon=True)
        self.counters_before: dict[str, float] = {}
        self.counters_after: dict[str, float] = {}

    @property
    def url(self) -> str:
        return self.router.url

    def worker_url(self, slot: Slot) -> str:
        return f"http://{slot.host}:{slot.api_port}"

    def start(self) -> RouterFront:
        self.router.start()
        self.counters_before = self._counters()
        self._thread.start()
        return self

    # --- the endpoints, as the orchestrator changes them ------------------------------------
    def add_endpoint(self, slot: Slot) -> None:
        """A new pod in `slot`: probed from now on, routed once Ready."""
        urls = {"sidecar": slot.sidecar_url, "api": self.worker_url(slot)}
        probes = PodProbes((self.chart.readiness_probe,), urls, self.clock(), self.clock)
        if self.kube is not None:
            self._new_pod(slot)
        with self._lock:
            old = self._endpoints.pop(slot.index, None)
            self._endpoints[slot.index] = _Endpoint(slot, probes.start())
        # A slot still routed for its previous pod (one whose removal never came, e.g.
        # `--endpoint-lag inf` before its probe failed) leaves the router now.
        self._sync()
        if old is not None:
            self._stop_probes(old)

    def mark_unready(self, slot: Slot) -> None:
        """Forget the pod's readiness: Ready again only after its probe passes anew."""
        self.add_endpoint(slot)

    def remove_endpoint(self, slot: Slot) -> None:
        """A terminating pod: its deletion reaches the router's watch now, which removes it;
        requests in flight run on."""
        with self._lock:
            endpoint = self._endpoints.get(slot.index)
            if endpoint is None:
                return
            endpoint.terminating = True
        self._sync()
        self._stop_probes(endpoint)

    def _stop_probes(self, endpoint: _Endpoint) -> None:
        # In the background: a probe in flight may take its whole timeout to end.
        threading.Thread(target=endpoint.probes.stop, daemon=True).start()

    # --- the router's discovery ---------------------------------------------------------
    def _discover(self) -> None:
        while not self._stop.wait(_DISCOVERY_INTERVAL_S):
            self._sync()

    def _sync(self) -> None:
        if self.kube is not None:
            with self._sync_lock:  # one pass at a time, as _sync_workers
                self._publish_pods(self.kube)
                self._read_routed()
        else:
            self._sync_workers()

    def _publish_pods(self, kube: StandInKubeApi) -> None:
        """The cluster's view of each slot's pod, published where it changed: a new pod in a
        slot replaces the old one (DELETED, then ADDED under a new name)."""
        with self._lock:
            for i, endpoint in self._endpoints.items():
                old = self._pods.get(i)
                if old is None:
                    continue
                pod = replace(old, ready=endpoint.ready, deleting=endpoint.terminating)
                if pod != old:
                    kube.apply(pod)
                    self._pods[i] = pod

    def _new_pod(self, slot: Slot) -> None:
        """kube-api: the slot's pod replaced by a new one, not Ready."""
        assert self.kube is not None
        with self._sync_lock, self._lock:
            old = self._pods.pop(slot.index, None)
            if old is not None:
                self.kube.delete(old.name)
            self._generation += 1
            labels = self.slot_labels.get(slot.index, self.chart.pod_labels)
            pod = StandInPod(f"{slot.server}-{self._generation}", labels, slot.host)
            self.kube.apply(pod)
            self._pods[slot.index] = pod

    def _read_routed(self) -> None:
        """kube-api: the router's own changes, from its /workers, as discovery events (a pass
        where the router did not answer in time changes nothing)."""
        listed = router_kit.listed_workers(self.url)
        if listed is None:
            return
        urls = set(listed)
        with self._lock:
            now = {i for i, e in self._endpoints.items() if self.worker_url(e.slot) in urls}
            for i in sorted(now - self._routed):
                self._event(i, "added")
            for i in sorted(self._routed - now):
                self._event(i, f"removed: {_removal_reason(self._endpoints.get(i))}")
            self._routed = now

    def _sync_workers(self) -> None:
        """Bring the router's workers to the Ready, non-terminating pods: the changes are
        worked out under the lock and the router is called outside it, so a slow router
        never holds up the orchestrator or the watcher; a change whose endpoint moved on
        meanwhile is put right by the next pass."""
        with self._sync_lock:
            with self._lock:
                desired = [i for i, e in self._endpoints.items() if e.ready and not e.terminating]
                add, remove = discovery_changes(desired, self._routed)
                adds = [(i, self._endpoints[i].slot) for i in add]
                removes = []
                for i in remove:
                    endpoint = self._endpoints.get(i)
                    slot = endpoint.slot if endpoint else self.slots[i]
                    removes.append((i, slot, _removal_reason(endpoint)))
            added = [i for i, slot in adds if self._call("add_worker", slot)]
            removed = [(i, why) for i, slot, why in removes if self._call("remove_worker", slot)]
            with self._lock:
                for i in added:
                    self._routed.add(i)
                    self._event(i, "added")
                for i, why in removed:
                    self._routed.discard(i)
                    self._event(i, f"removed: {why}")

    def _call(self, action: str, slot: Slot) -> bool:
        """One call of the router's worker API; False to try again on the next pass."""
        try:
            answer = httpx.post(
                f"{self.url}/{action}", params={"url": self.worker_url(slot)}, timeout=30
            )
        except httpx.HTTPError:
            return False
        return answer.status_code < 300

    def _event(self, index: int, what: str) -> None:
        self.discovery_events.append((self.clock(), self.slots[index].server, what))

    # --- what the StateWatcher and the report read --------------------------------------
    def states(self) -> dict[str, str]:
        """Slot server -> its state, UP from the router's own /workers list."""
        routed = set(router_kit.routed_workers(self.url))
        with self._lock:
            endpoints = dict(self._endpoints)
        return {
            slot.server: slot_state(
                routed=self.worker_url(slot) in routed,
                endpoint=slot.index in endpoints,
                terminating=slot.index in endpoints and endpoints[slot.index].terminating,
            )
            for slot in self.slots
        }

    def access_log(self) -> None:
        """The router writes no per-request log: failures are traced by time."""
        return None

    def _counters(self) -> dict[str, float]:
        try:
            return router_counters(httpx.get(self.router.metrics_url, timeout=10).text)
        except httpx.HTTPError:
            return {}

    def describe(self, t0: float) -> dict[str, Any]:
        """The front for the report: the router's command line, its discovery's events
        (seconds after `t0`) and what its counters gained over the run."""
        return {
            "name": self.name,
            "router_command": self.router.command()[1:],
            "router_log": str(self.router.log_path),
            "readiness_probe": asdict(self.chart.readiness_probe),
            "discovery_events": [
                {"t_s": round(t - t0, 3), "server": s, "event": e}
                for t, s, e in self.discovery_events
            ],
            "router_counters": counter_deltas(self.counters_before, self.counters_after),
            "failure_tracing": "by time: the router logs no per-request line",
        }

    def stop(self) -> None:
        if self.router.process is not None and self.router.process.poll() is None:
            self.counters_after = self._counters()
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        with self._lock:
            endpoints = list(self._endpoints.values())
        for endpoint in endpoints:
            with contextlib.suppress(RuntimeError):
                endpoint.probes.stop()
        self.router.stop()
        if self.kube is not None:
            self.kube.stop()


def _removal_reason(endpoint: _Endpoint | None) -> str:
    """Why a slot left the router: its pod terminates, or it is not Ready (or gone)."""
    return "terminating" if endpoint and endpoint.terminating else "not ready"


def _namespace(router_args: tuple[str, ...]) -> str:
    """The namespace the chart's router watches (`--service-discovery-namespace`)."""
    return router_args[router_args.index("--service-discovery-namespace") + 1]


def _one_port(slots: list[Slot]) -> int:
    """The API port every slot shares: the router's discovery reaches each pod's address on
    one port (`--service-discovery-port`), as in a cluster where each pod has its own IP."""
    ports, hosts = {s.api_port for s in slots}, [s.host for s in slots]
    if len(ports) != 1 or len(set(hosts)) != len(hosts):
        raise ValueError(
            "the router's own discovery needs slots on one API port and distinct addresses "
            f"(ports {sorted(ports)}, hosts {hosts})"
        )
    return ports.pop()
