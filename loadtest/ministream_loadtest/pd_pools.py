"""The rolling-restart experiment on prefill/decode disaggregation (`rollout --front router
--pd-pool prefill|decode`): which pool rolls, where each pool's pods run, and what the decode
pods' NIXL counters say about the KV transfers while it rolls.

The chart renders the two pools with `disaggregation.enabled=true` (and `router.enabled`):
a prefill and a decode Deployment of the same pod, told apart by `ministream.io/pool`, and the
router in P/D mode with a selector per pool. The experiment rolls one pool (`--replicas` pods)
and keeps the other at one pod (`FIXED_POOL_REPLICAS`); both are rendered with those replica
counts. Every pod runs its pool's rendered vLLM arguments and environment (NIXL's side channel
on the pod's own loopback address, `fleet.ProcessFleet(loopback=True)`), and the router's own
Kubernetes discovery finds each pod by its pool's labels in the stand-in API
(`router_front`'s `kube-api` discovery).

The decode pods count the KV they pulled (`vllm:nixl_xfer_time_seconds_count`) and the pulls
that failed (`vllm:nixl_num_failed_transfers_total`, handshake and notification failures
included). The prefill pods count the requests whose KV they released unfetched when its lease
expired (`vllm:nixl_num_kv_expired_reqs_total`) and the decode pods' notices about such
released KV (`vllm:nixl_num_notifications_after_expiry_total`, `read_late`): mostly a read that
finished late, a request a decode pod answered from blocks that may have been reused, with a
200, so the load counts it as succeeded (the same notice comes for a request the decode pod
aborted before pulling, or found whole in its own prefix cache). A prefill pod counts a notice
on its next engine step, so one that exits right after may never count it.
`NixlSampler` reads each pod's counters while it runs, so a pod that has exited is reported with
its last reading.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast, get_args

import httpx

from ministream_testkit.vllm_server import sum_samples

PDPool = Literal["prefill", "decode"]
PD_POOLS: tuple[PDPool, ...] = get_args(PDPool)
# The pool that does not roll runs this many pods: the smallest fleet with both pools.
FIXED_POOL_REPLICAS = 1
# vLLM's metric names, as ministream_observability.catalog lists them (a development package
# this one may not import; test_pd_rollout_units.py holds the two equal).
NIXL_TRANSFERS = "vllm:nixl_xfer_time_seconds_count"
NIXL_FAILED = "vllm:nixl_num_failed_transfers_total"
NIXL_EXPIRED = "vllm:nixl_num_kv_expired_reqs_total"
NIXL_READ_LATE = "vllm:nixl_num_notifications_after_expiry_total"
# What the report counts of each pool's pods, by key.
NIXL_COUNTED: dict[PDPool, dict[str, str]] = {
    "decode": {"transfers": NIXL_TRANSFERS, "failed": NIXL_FAILED},
    "prefill": {"expired": NIXL_EXPIRED, "read_late": NIXL_READ_LATE},
}
REQUEST_SUCCESS = "vllm:request_success_total"
_SAMPLE_INTERVAL_S = 1.0


def other_pool(pool: PDPool) -> PDPool:
    return "decode" if pool == "prefill" else "prefill"


def pd_chart_values(rolled: PDPool, replicas: int) -> dict[str, Any]:
    """The chart values of a P/D release whose `rolled` pool has `replicas` pods and the other
    FIXED_POOL_REPLICAS (the router front adds `router.enabled`)."""
    return {
        "disaggregation.enabled": True,
        f"disaggregation.{rolled}.replicas": replicas,
        f"disaggregation.{other_pool(rolled)}.replicas": FIXED_POOL_REPLICAS,
    }


@dataclass(frozen=True)
class PoolSlots:
    """The slots each pool's pods run in: the fixed pool's first (so its pod gets the first
    core of its own), then the rolled pool's replicas and the surge slot."""

    rolled: PDPool
    fixed: tuple[int, ...]
    rolling: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.fixed) + len(self.rolling)


def pool_slots(rolled: PDPool, rolling_slots: int) -> PoolSlots:
    """The fixed pool's FIXED_POOL_REPLICAS slots, then `rolling_slots` of the rolled pool
    (its replicas, plus one with maxSurge 1)."""
    if rolling_slots < 1:
        raise ValueError("the rolled pool needs at least one slot")
    fixed = tuple(range(FIXED_POOL_REPLICAS))
    rolling = tuple(range(FIXED_POOL_REPLICAS, FIXED_POOL_REPLICAS + rolling_slots))
    return PoolSlots(rolled, fixed, rolling)


class PoolPod(Protocol):
    """What `running_pd_pods` reads of a fleet pod (fleet.Pod)."""

    name: str

    @property
    def api_url(self) -> str: ...

    @property
    def pool(self) -> str | None: ...

    @property
    def exited(self) -> bool: ...


def running_pd_pods(pods: Iterable[PoolPod]) -> list[tuple[str, str, PDPool]]:
    """(name, API URL, pool) of the pods of either pool not yet exited: what `NixlSampler`
    reads. An exited pod's address can already serve its replacement (same slot), whose
    counters are not its."""
    return [
        (p.name, p.api_url, cast(PDPool, p.pool))
        for p in pods
        if p.pool in PD_POOLS and not p.exited
    ]


def nixl_counts(metrics_text: str, pool: PDPool) -> dict[str, float]:
    """A pod's NIXL counters from its /metrics, those its pool keeps (`NIXL_COUNTED`)."""
    return {key: sum_samples(metrics_text, name) for key, name in NIXL_COUNTED[pool].items()}


def nixl_report(
    baseline: Mapping[str, Mapping[str, float]],
    last: Mapping[str, Mapping[str, float]],
    pools: Mapping[str, PDPool],
) -> dict[str, Any]:
    """What each pod's counters gained from `baseline` (before the load; a pod created later
    counts from 0) to its `last` reading, per pool, and the totals."""
    gained = {
        pod: {k: int(v - baseline.get(pod, {}).get(k, 0.0)) for k, v in counts.items()}
        for pod, counts in sorted(last.items())
    }
    report: dict[str, Any] = {
        "metrics": {pool: sorted(names.values()) for pool, names in NIXL_COUNTED.items()}
    }
    for pool, names in NIXL_COUNTED.items():
        per_pod = {pod: c for pod, c in gained.items() if pools[pod] == pool}
        report[f"per_{pool}_pod"] = per_pod
        report.update({k: sum(c[k] for c in per_pod.values()) for k in names})
    return report


class NixlSampler:
    """Reads the NIXL counters of every pod `pods()` names ((name, API URL, pool)) every
    second, keeping each pod's last reading: a pod that has exited keeps the one before its
    exit. `baseline()` freezes the readings the report counts from."""

    def __init__(self, pods: Callable[[], Sequence[tuple[str, str, PDPool]]]) -> None:
        self.pods = pods
        self.last: dict[str, dict[str, float]] = {}
        self.pools: dict[str, PDPool] = {}
        self.start_counts: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nixl-sampler", daemon=True)

    def start(self) -> NixlSampler:
        self._thread.start()
        return self

    def sample(self) -> None:
        for name, url, pool in self.pods():
            text = scrape(url)
            if text is None:
                continue  # not up yet, or gone: its last reading stands
            with self._lock:
                self.last[name] = nixl_counts(text, pool)
                self.pools[name] = pool

    def baseline(self) -> None:
        self.sample()
        with self._lock:
            self.start_counts = {k: dict(v) for k, v in self.last.items()}

    def _run(self) -> None:
        while not self._stop.wait(_SAMPLE_INTERVAL_S):
            self.sample()

    def stop(self) -> dict[str, Any]:
        """One last reading of the pods still up, then the report."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self.sample()
        with self._lock:
            return nixl_report(self.start_counts, self.last, self.pools)


def warm_prompt(tokens: int, seed: int) -> list[int]:
    """Prompt token ids for the `seed`-th warm-up request, `tokens` long and unlike the others'
    (no prefix-cache hit): NIXL moves whole KV blocks only, so it is as long as the load's
    prompts."""
    return [3 + (seed * 7 + i) % 97 for i in range(tokens)]


def warm_up(
    router_url: str,
    model: str,
    tokens: int,
    warm: Callable[[], bool],
    attempts: int,
    timeout: float = 300.0,
) -> dict[str, Any]:
    """Send requests through the router, one at a time, until `warm()` (every pod of both
    pools has served one: each pair's NIXL handshake made) or `attempts` were sent. A pair's
    first request makes NIXL's handshake, whose side-channel answer vLLM waits 5 s for; a
    loaded machine can miss it, and that request fails (a 500), so it is asked again, as the
    P/D live test's fixture does. What was sent and how each failed goes in the report."""
    sent = 0
    failures: list[str] = []
    while not warm():
        if sent >= attempts:
            raise RuntimeError(
                f"the P/D fleet was not warm after {attempts} requests through the router "
                f"(failures: {failures})"
            )
        body = {"model": model, "prompt": warm_prompt(tokens, sent), "max_tokens": 2}
        sent += 1
        try:
            answer = httpx.post(f"{router_url}/v1/completions", json=body, timeout=timeout)
            if answer.status_code != 200:
                failures.append(f"HTTP {answer.status_code}: {answer.text[:200]}")
        except httpx.HTTPError as exc:
            failures.append(repr(exc))
    return {"sent": sent, "failed": len(failures), "failures": failures}


def scrape(url: str) -> str | None:
    """The /metrics page of the vLLM at `url`; None when it does not answer."""
    try:
        return httpx.get(f"{url}/metrics", timeout=5).text
    except httpx.HTTPError:
        return None


def paired_count(pool: str | None, metrics_text: str | None) -> float:
    """What grows when a pod serves through the pair: a decode pod's KV pulls over NIXL, a
    prefill pod's finished requests (its sidecar's warm-up requests, sent before it was
    ready, count too: compare with a reading taken once it was ready); 0 unread."""
    if metrics_text is None:
        return 0.0
    if pool == "decode":
        return sum_samples(metrics_text, NIXL_TRANSFERS)
    return sum_samples(metrics_text, REQUEST_SUCCESS)
