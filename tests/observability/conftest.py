"""The live stack of the observability tests: the session's real vLLM server (tests/conftest.py),
the real sidecar as a subprocess (`ministream-sidecar`), and a real Prometheus scraping both
every 2 s with our alert rules loaded. Started once; `live` also drives warmup, load and
two drains through it, so every panel has something to show.

The scrape config attaches `namespace` and `pod` labels to both targets, as a ServiceMonitor or
PodMonitor does in a cluster (there is no Kubernetes here); everything else is real.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from promkit import NAMESPACE, POD, ROOT, LiveStack, PrometheusServer, ScrapeTarget

from ministream_observability.generate import RULES_FILE
from ministream_testkit.load import BusyEngine, client, completion
from ministream_testkit.sidecar_process import SidecarProcess, start_sidecar
from ministream_testkit.vllm_server import (
    engine_core,
    idle_server_load,
    metrics_text,
    request_counts,
    server_load,
    sum_samples,
)
from ministream_testkit.waiting import wait_until


@pytest.fixture(scope="session")
def sidecar_process(
    vllm_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SidecarProcess]:
    """`ministream-sidecar` (the console script users run) next to the session's vLLM.

    Warmup on start is off: the test posts /warmup after Prometheus has scraped the sidecar
    once, so the warmup counters are seen at 0 before they move (as in a cluster, where the
    sidecar is scraped long before vLLM has loaded its weights)."""
    sidecar = start_sidecar(
        vllm_server.url,
        vllm_server.served_name,
        tmp_path_factory.mktemp("sidecar") / "sidecar.log",
        {"MINISTREAM_SIDECAR_STARTUP_LOG": str(vllm_server.startup_log)},
    )
    try:
        yield sidecar
    finally:
        sidecar.stop()


@pytest.fixture(scope="session")
def prometheus(
    vllm_server: Any, sidecar_process: SidecarProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrometheusServer]:
    labels = {"namespace": NAMESPACE, "pod": POD}
    server = PrometheusServer(
        workdir=tmp_path_factory.mktemp("prometheus"),
        targets=[
            ScrapeTarget("vllm", f"127.0.0.1:{vllm_server.port}", {**labels, "container": "vllm"}),
            ScrapeTarget(
                "sidecar",
                sidecar_process.url.removeprefix("http://"),
                {**labels, "container": "sidecar"},
            ),
        ],
        rule_files=[ROOT / RULES_FILE],
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _load(vllm: Any, per_thread: int, concurrency: int) -> int:
    """`per_thread` completions from each of `concurrency` threads; a 200-token shared prefix
    (more than one 128-token CPU KV block) gives the prefix cache something to hit. A count,
    not a duration: the panels are read over a 5-minute window, they need requests, not time
    (a fixed 35 s of load was half of this fixture's minute)."""
    prefix = [(7 * i) % 97 + 1 for i in range(200)]
    sent = [0] * concurrency

    def worker(n: int) -> None:
        with client(vllm.url) as http:
            while sent[n] < per_thread:
                suffix = [(n * 13 + sent[n] * 5 + i) % 97 + 1 for i in range(8)]
                completion(http, vllm.served_name, prefix + suffix, 16 + 8 * (sent[n] % 3))
                sent[n] += 1

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(sent)


def _wait_in_flight(url: str, idle: int, timeout: float = 60) -> None:
    """Until vLLM's HTTP server holds a request (GET /load, which the drain counts too) above
    what it read when idle (`idle`: vLLM's counter can sit below 0 for good, see
    `idle_server_load`). Not the engine gauges: under load on two cores they read 0 running
    for a minute in CI."""
    wait_until(
        lambda: server_load(url) > idle, timeout, 0.05, what=f"GET /load above its idle {idle}"
    )


def _stopped_while_busy(vllm: Any, idle: int) -> Any:
    """The engine core, stopped (SIGSTOP) while the load keeps sending: no request can finish
    until it is resumed, so GET /load stays above its idle reading (checked after the stop)."""
    core = engine_core(vllm)
    _wait_in_flight(vllm.url, idle)
    core.suspend()
    try:
        _wait_in_flight(vllm.url, idle)
    except BaseException:
        core.resume()
        raise
    return core


def _counter(url: str, name: str) -> float:
    """A counter in vLLM's /metrics, summed over its label sets."""
    return sum_samples(metrics_text(url), name)


def _wait_idle_and_scraped(vllm: Any, prometheus: PrometheusServer) -> None:
    """Until vLLM reports nothing running or waiting, and Prometheus has stored a scrape
    taken after its last finished request (the panels are read at the end of the run)."""
    wait_until(lambda: request_counts(vllm.url).idle, 60, 0.1, what="vLLM idle")
    done = _counter(vllm.url, "vllm:request_success_total")
    prometheus.wait_for(
        f"sum(vllm:request_success_total) >= {done}", 30, f"{done:g} finished requests scraped"
    )


@pytest.fixture(scope="session")
def live(
    vllm_server: Any, sidecar_process: SidecarProcess, prometheus: PrometheusServer
) -> LiveStack:
    """Warmup, load at two concurrencies, an idle drain and a timed-out drain, all scraped."""
    started = time.time()
    for job in ("vllm", "sidecar"):
        prometheus.wait_for(f'up{{job="{job}"}} == 1', 60, f"first scrape of {job}")
    prometheus.wait_for(
        'ministream_warmup_runs_total{outcome="success"} == 0',
        30,
        "warmup counter at 0 before warmup",
    )
    r = sidecar_process.post("/warmup")
    assert r.status_code == 200, r.text
    prometheus.wait_for("ministream_ready == 1", 30, "readiness scraped")
    assert _load(vllm_server, 6, 1) == 6
    assert _load(vllm_server, 4, 4) == 16
    _wait_idle_and_scraped(vllm_server, prometheus)
    # An idle drain (vLLM has nothing in flight), then one that times out under long requests.
    r = sidecar_process.post("/drain")
    assert r.status_code == 200 and r.json()["outcome"] == "idle", r.text
    # Plain (not streamed) long completions, and the engine core stopped (SIGSTOP) while vLLM's
    # HTTP server holds them: every poll of the drain sees a request in flight (GET /load) and
    # it times out by construction. (Under load alone, two of the drain's polls could both read
    # 0 on two cores: CI runs ended "idle".)
    idle = idle_server_load(vllm_server.url)
    with BusyEngine(vllm_server, threads=4, stream=False):
        core = _stopped_while_busy(vllm_server, idle)
        try:
            r = sidecar_process.post("/drain", params={"timeout_seconds": 0.5})
        finally:
            core.resume()
    assert r.status_code == 200 and r.json()["outcome"] == "timeout", r.text
    prometheus.wait_for('ministream_drains_total{outcome="timeout"} == 1', 30, "timeout drain")
    _wait_idle_and_scraped(vllm_server, prometheus)
    prometheus.wait_evaluated(after=time.time())  # the alert rules have seen all of it
    return LiveStack(prometheus, started, time.time())
