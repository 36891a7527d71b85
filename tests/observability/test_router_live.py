"""vLLM's router, the real binary with the chart's own arguments, in front of two real vLLM
replicas (the tiny model with the chart's vLLM arguments, static `--worker-urls` instead of
Kubernetes discovery): requests reach both replicas, a replica drained under load as a
cluster drains it (the router's removal, then the chart's preStop hook against a real sidecar
with the chart's settings, then SIGTERM) costs no request, and a real Prometheus scrapes the
router's metrics. A replica killed outright is not tested:
the router's retries (router.retries.maxRetries) may all land on the dead replica before its
health checks or breaker eject it, so whether a request is lost depends on timing. A module
of its own: two engines, one router, one Prometheus, shared by its tests in order."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from promkit import PrometheusServer, ScrapeTarget

from ministream_loadtest.chart_pod import ChartPod, chart_pod, drain_answer, run_prestop
from ministream_observability import catalog
from ministream_sidecar.client import ENV_PREFIX
from ministream_testkit.router import ROUTER_VALUES, RouterProcess, chart_router_args
from ministream_testkit.sidecar_process import SidecarProcess, start_sidecar
from ministream_testkit.vllm_server import TINY_ENGINE_ARGS, VLLMServer, metrics_text, sum_samples
from ministream_testkit.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.network]


@dataclass
class Fleet:
    replicas: list[VLLMServer]
    router: RouterProcess
    prom: PrometheusServer
    workdir: Path
    pod: ChartPod  # what the chart renders for a serving pod behind the router
    sidecar: SidecarProcess  # the first replica's, with the chart's settings


@pytest.fixture(scope="module")
def fleet(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    workdir = tmp_path_factory.mktemp("router-live")
    pod = chart_pod(values_files=[ROUTER_VALUES])
    # The chart's vLLM arguments first (--shutdown-timeout, --enable-server-load-tracking,
    # ...), the tiny model's after them: for a flag given twice, vLLM takes the last.
    args = (*pod.vllm_args, *TINY_ENGINE_ARGS)
    replicas = [
        VLLMServer(str(tiny_model_dir), workdir / f"replica-{i}.log", args=args) for i in range(2)
    ]
    router: RouterProcess | None = None
    prom: PrometheusServer | None = None
    sidecar: SidecarProcess | None = None
    try:
        for r in replicas:
            r.start()
        for r in replicas:
            r.wait_healthy()
        # Warmup off: the routing test counts each replica's finished requests exactly.
        settings = {**pod.sidecar_settings, f"{ENV_PREFIX}WARMUP_ON_START": "false"}
        sidecar = start_sidecar(
            replicas[0].url, replicas[0].served_name, workdir / "sidecar-0.log", settings
        )
        # Round robin: the routing test can count each replica's share exactly.
        router = RouterProcess(
            [r.url for r in replicas],
            workdir / "router.log",
            policy="round_robin",
            chart_args=chart_router_args(),
            # The chart checks every 10 s; shortened so the test sees a replica come back soon.
            extra={"health_check_interval_secs": "1"},
        ).start()
        prom = PrometheusServer(
            workdir / "prometheus",
            [ScrapeTarget("router", f"127.0.0.1:{router.metrics_port}", {"pod": "ms-router-0"})],
        ).start()
        yield Fleet(replicas, router, prom, workdir, pod, sidecar)
    finally:
        if prom:
            prom.stop()
        if router:
            router.stop()
        if sidecar:
            sidecar.stop()
        for r in replicas:
            r.stop()


def _load(url: str, n: int, rate: float) -> list[int | str]:
    """`n` completions through `url` at `rate` per second, all at once in flight; statuses."""

    async def one(client: httpx.AsyncClient, i: int) -> int | str:
        await asyncio.sleep(i / rate)
        body = {
            "model": "ministream",
            "prompt": f"request {i}",
            "max_tokens": 16,
            "ignore_eos": True,
        }
        try:
            return (await client.post(f"{url}/v1/completions", json=body)).status_code
        except httpx.HTTPError as exc:
            return type(exc).__name__

    async def run() -> list[int | str]:
        async with httpx.AsyncClient(timeout=120) as client:
            return list(await asyncio.gather(*(one(client, i) for i in range(n))))

    return asyncio.run(run())


def _prestop(fleet: Fleet) -> dict[str, Any]:
    """The chart's rendered preStop command, as the kubelet runs it in the pod: the sidecar's
    drain. Its answer: the sidecar's /drain body."""
    done = run_prestop(
        fleet.pod.prestop_command,
        int(fleet.sidecar.url.rsplit(":", 1)[1]),
        timeout=fleet.pod.termination_grace_period_seconds,
    )
    assert done.returncode == 0, done.stderr
    body: dict[str, Any] = drain_answer(done)["body"]
    return body


def _served(replica: VLLMServer) -> float:
    """Requests the replica finished (vLLM's own counter, every finish reason)."""
    return sum_samples(metrics_text(replica.url), "vllm:request_success_total")


def test_requests_reach_both_replicas(fleet: Fleet) -> None:
    before = [_served(r) for r in fleet.replicas]
    assert _load(fleet.router.url, 12, rate=20) == [200] * 12
    shares = [_served(r) - b for r, b in zip(fleet.replicas, before, strict=True)]
    assert shares == [6, 6], shares


def test_a_replica_drained_under_load_costs_no_request(fleet: Fleet) -> None:
    """A pod's deletion as the router sees it: discovery removes the pod (the router's own
    remove_worker, what it runs on the pod's deletionTimestamp), the chart's preStop hook
    drains the pod's sidecar (idle on vLLM's gauges and its GET /load, no sooner than the
    chart's drainMinSeconds), then SIGTERM."""
    leaving = fleet.replicas[0]
    assert leaving.process is not None
    drained: dict[str, Any] = {}

    async def drain_after(delay: float) -> None:
        await asyncio.sleep(delay)
        async with httpx.AsyncClient(timeout=30) as client:
            removed = await client.post(
                f"{fleet.router.url}/remove_worker", params={"url": leaving.url}
            )
        assert removed.status_code < 300, removed.text
        drained.update(await asyncio.get_running_loop().run_in_executor(None, _prestop, fleet))
        os.kill(leaving.process.pid, signal.SIGTERM)

    statuses = _with_action(fleet.router.url, drain_after)
    leaving.wait_exit(120)
    assert statuses == [200] * len(statuses), (statuses, drained)
    assert drained["outcome"] == "idle", drained
    assert leaving.url not in fleet.router.routed_workers()


def _with_action(url: str, action: Callable[[float], Awaitable[None]]) -> list[int | str]:
    """30 requests at 10/s through the router, `action(1.0)` running beside them."""

    async def run() -> list[int | str]:
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(action(1.0))
        statuses = await loop.run_in_executor(None, _load, url, 30, 10.0)
        await task
        return statuses

    return asyncio.run(run())


def test_prometheus_scrapes_the_routers_metrics(fleet: Fleet) -> None:
    """What the router exports, Prometheus stores (some of the catalog's router series appear
    only after an event this module does not cause, e.g. retries exhausted: the real router's
    exposition is checked for every one of them in tests/charts/test_router_discovery.py), and
    the per-replica request counter carries both replicas."""
    router_names = {
        n for m in catalog.ALL if m.source is catalog.Source.ROUTER for n in m.series_names
    }
    exported = {
        line.split("{")[0].split(" ")[0]
        for line in httpx.get(fleet.router.metrics_url, timeout=10).text.splitlines()
        if line and not line.startswith("#")
    } & router_names
    assert {str(catalog.ROUTER_REQUESTS), str(catalog.ROUTER_ACTIVE_WORKERS)} <= exported

    wait_until(
        lambda: exported <= fleet.prom.names(),
        60,
        1.0,
        what=f"Prometheus to store the router's series {sorted(exported)}",
    )
    per_worker = fleet.prom.query(f"sum by (worker) ({catalog.ROUTER_REQUESTS})")
    workers = {s["metric"]["worker"] for s in per_worker}
    assert workers >= {r.url for r in fleet.replicas}, workers
