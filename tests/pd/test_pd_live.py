"""Prefill/decode disaggregation for real: two vLLM CPU replicas of the tiny model with the
chart's NixlConnector configuration (`--kv-transfer-config`, NIXL's and UCX's environment read
from `helm template` of ci/pd-values.yaml) behind the real vllm-router with the chart's P/D
command line, its pool selectors swapped for the two local URLs (no Kubernetes API server runs
here). Each request is prefilled on one replica, whose KV cache the other pulls over NIXL (UCX
over TCP on loopback) before it decodes.

Checked against the colocated server every engine test shares (`vllm_server`): greedy token
ids identical and logprobs within float32 noise, plain and streamed; every transfer counted by
vLLM's own NIXL metrics on the decode replica, none failed; the names the dashboards and the
KV-transfer alert query are exported. A module of its own: two engines and a router, started
once and shared by its tests in order.

UCX's transports come from the chart (disaggregation.nixl.ucxTransports, `tcp,self`). What
made early runs stall here was CPU starvation, not the transport: each replica now gets a core
of its own (docs/fleet.md, "Prefill/decode disaggregation").
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from ministream_observability import catalog
from ministream_testkit.pd import PD_VALUES, chart_pd_engine
from ministream_testkit.router import RouterProcess, chart_router_args
from ministream_testkit.vllm_server import TINY_ENGINE_ARGS, VLLMServer, metrics_text, sum_samples
from ministream_testkit.waiting import wait_until
from tests.support import tools

pytestmark = [pytest.mark.engine, pytest.mark.network]

# Fixed local ports (NIXL's side channel and UCX's data ports must differ between two replicas
# on one host; in a cluster each pod has its own IP and the chart's fixed ports).
SIDE_CHANNEL = {"prefill": 18500, "decode": 18501}
UCX_PORTS = {"prefill": (18520, 18559), "decode": (18560, 18599)}
# Long enough to fill whole KV blocks: NIXL moves full blocks only.
PROMPTS = (
    "The history of the printing press begins in the fifteenth century, when a goldsmith "
    "in Mainz combined a screw press, oil-based ink and movable metal type into one",
    "A tiny model served by two engines: one computes the prompt, the other pulls its cache "
    "over the network and writes the answer, token after token, until it is done with it",
)
MAX_TOKENS = 8
XFER_COUNT = catalog.NIXL_XFER_TIME.name + "_count"
# One core each: both replicas' OpenMP threads spinning on both cores of a 2-core runner, next
# to NIXL's progress threads, made a first forward pass take minutes here.
CORE = {"prefill": "0", "decode": "1"}
# Hang detector, not a performance bound: a tiny model answers in seconds on an idle runner,
# but the first pass of a fresh engine on a loaded one took over a minute.
DEADLINE = 300.0


@dataclass
class PDFleet:
    prefill: VLLMServer
    decode: VLLMServer
    router: RouterProcess
    model: str


@pytest.fixture(scope="module")
def fleet(
    vllm_server: VLLMServer, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PDFleet]:
    tools.python_module("nixl", "NIXL is not installed: run `make setup-test` (the `pd` extra)")
    workdir = tmp_path_factory.mktemp("pd-live")
    engine = chart_pd_engine()
    replicas = {
        pool: VLLMServer(
            str(tiny_model_dir),
            workdir / f"{pool}.log",
            served_name=vllm_server.served_name,
            args=[*TINY_ENGINE_ARGS, *engine.args],
            env={
                **engine.local_env(SIDE_CHANNEL[pool], UCX_PORTS[pool]),
                "VLLM_CPU_OMP_THREADS_BIND": CORE[pool],
            },
        )
        for pool in ("prefill", "decode")
    }
    router: RouterProcess | None = None
    try:
        for r in replicas.values():
            r.start()
        for r in replicas.values():
            r.wait_healthy()
        router = RouterProcess(
            [],
            workdir / "router.log",
            chart_args=chart_router_args(PD_VALUES),
            pd=(replicas["prefill"].url, replicas["decode"].url),
            # The chart's 5 s health-check timeout (three misses eject a worker) is for pods
            # with cores of their own; on the loaded 2-core runner a replica's /health took
            # longer and the router answered 503 "0 decode".
            extra={"health_check_timeout_secs": "60"},
        ).start()
        fleet = PDFleet(replicas["prefill"], replicas["decode"], router, vllm_server.served_name)
        # The first request through the pair makes NIXL's handshake (the decode replica
        # fetches the prefill replica's metadata over the side channel): done here, so that
        # the tests count only their own transfers.
        _complete(router.url, _body(fleet.model, PROMPTS[1]))
        yield fleet
    finally:
        if router:
            router.stop()
        for r in replicas.values():
            r.stop()


def _body(model: str, prompt: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "logprobs": 1,
        "return_token_ids": True,
        **extra,
    }


def _complete(url: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=DEADLINE)
    assert response.status_code == 200, response.text
    choice: dict[str, Any] = response.json()["choices"][0]
    return choice


def _stream(url: str, body: dict[str, Any]) -> tuple[str, list[int], list[float]]:
    """A streamed completion: its text, token ids and logprobs, joined over the chunks."""
    text, ids, logprobs = "", list[int](), list[float]()
    with httpx.stream(
        "POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=DEADLINE
    ) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[len("data: ") :]).get("choices", []):
                text += choice.get("text") or ""
                ids += choice.get("token_ids") or []
                logprobs += (choice.get("logprobs") or {}).get("token_logprobs") or []
    return text, ids, logprobs


def _counts(server: VLLMServer) -> dict[str, float]:
    """The replica's transfer, failure and finished-request counters, once it is idle (a
    request the router still has in flight would land in the next test's count)."""

    def idle() -> bool:
        page = metrics_text(server.url)
        return (
            sum_samples(page, catalog.RUNNING.name) + sum_samples(page, catalog.WAITING.name) == 0
        )

    wait_until(idle, DEADLINE, 0.5, what=f"no request running at {server.url}")
    page = metrics_text(server.url)
    return {
        name: sum_samples(page, name)
        for name in (XFER_COUNT, catalog.NIXL_FAILED.name, catalog.REQUEST_SUCCESS.name)
    }


def _assert_same_numerics(
    got: tuple[str, list[int], list[float]], want: tuple[str, list[int], list[float]]
) -> None:
    assert got[1] == want[1] and len(got[1]) == MAX_TOKENS, (got[1], want[1])
    assert got[0] == want[0]
    assert got[2] == pytest.approx(want[2], abs=1e-4), (got[2], want[2])


def _numerics(choice: dict[str, Any]) -> tuple[str, list[int], list[float]]:
    return choice["text"], choice["token_ids"], choice["logprobs"]["token_logprobs"]


def test_greedy_answers_match_the_colocated_server_and_each_is_one_transfer(
    fleet: PDFleet, vllm_server: VLLMServer
) -> None:
    fleet.router.wait_workers_healthy(DEADLINE)
    before = {"prefill": _counts(fleet.prefill), "decode": _counts(fleet.decode)}
    for prompt in PROMPTS:
        body = _body(fleet.model, prompt)
        _assert_same_numerics(
            _numerics(_complete(fleet.router.url, body)),
            _numerics(_complete(vllm_server.url, body)),
        )
    after = {"prefill": _counts(fleet.prefill), "decode": _counts(fleet.decode)}
    n = len(PROMPTS)
    # Each request was prefilled on one replica and decoded on the other, whose KV came over
    # NIXL: one transfer per request, observed by the replica that pulled it.
    for pool in ("prefill", "decode"):
        served = (
            after[pool][catalog.REQUEST_SUCCESS.name] - before[pool][catalog.REQUEST_SUCCESS.name]
        )
        assert served == n, (pool, served)
    assert after["decode"][XFER_COUNT] - before["decode"][XFER_COUNT] == n
    assert after["prefill"][XFER_COUNT] == before["prefill"][XFER_COUNT]
    assert after["decode"][catalog.NIXL_FAILED.name] == 0


def test_streamed_answer_matches_the_colocated_server(
    fleet: PDFleet, vllm_server: VLLMServer
) -> None:
    fleet.router.wait_workers_healthy(DEADLINE)
    before = _counts(fleet.decode)[XFER_COUNT]
    body = _body(fleet.model, PROMPTS[0])
    _assert_same_numerics(
        _stream(fleet.router.url, body), _numerics(_complete(vllm_server.url, body))
    )
    assert _counts(fleet.decode)[XFER_COUNT] - before == 1


def test_the_dashboards_nixl_series_are_exported(fleet: PDFleet) -> None:
    """The names the dashboards' P/D row and MiniStreamKVTransfersFailing query, in the two
    replicas' scrapes (the decode replica observes transfers, the prefill one expiries)."""
    names = set()
    for server in (fleet.prefill, fleet.decode):
        for line in metrics_text(server.url).splitlines():
            if line and not line.startswith("#"):
                names.add(line.split("{", 1)[0].split(" ", 1)[0])
    assert names >= catalog.PD_ONLY, sorted(catalog.PD_ONLY - names)
