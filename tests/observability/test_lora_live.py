"""A pod serving LoRA adapters, live: `ministream fetch-adapters` admits two adapters of the
tiny model and refuses a third (NaN), vLLM starts through `serve_vllm` with all three in
`--lora-modules` (as the chart renders them) and serves the base and the two, the sidecar
warms each before turning ready and reports the missing one, and a real Prometheus scraping
both sees the LoRA series and puts MiniStreamLoraAdapterNotLoaded on the refused adapter.
The API key guards the dynamic-loading endpoints. One engine start for all of it."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from promkit import NAMESPACE, POD, ROOT, PrometheusServer, ScrapeTarget

from ministream import adapter_guard
from ministream.manifest import Manifest
from ministream_observability import catalog
from ministream_observability.alerts import AlertParams
from ministream_observability.generate import RULES_FILE, queries
from ministream_observability.promql import concrete, metric_names
from ministream_testkit.sidecar_process import SidecarProcess, start_sidecar
from ministream_testkit.vllm_server import TINY_ENGINE_ARGS, VLLMServer
from ministream_testkit.waiting import wait_until
from tests.support.hostile_adapters import resealed, with_nan
from tests.support.models import ModelFactory

pytestmark = [pytest.mark.engine, pytest.mark.network]

BASE = "ministream-tiny-lora"
GOOD = ("support", "legal")
BAD = "poisoned"
API_KEY = "lora-test-key"


@dataclasses.dataclass
class ServeVLLM(VLLMServer):
    """Started as the chart starts it: `python -m ministream_sidecar.serve_vllm ARGS`."""

    def command(self) -> list[str]:
        cmd = super().command()
        return [sys.executable, "-m", "ministream_sidecar.serve_vllm", *cmd[3:]]


@dataclasses.dataclass
class LoraStack:
    vllm: ServeVLLM
    sidecar: SidecarProcess
    prom: PrometheusServer
    fetch_stderr: str


@pytest.fixture(scope="module")
def stack(
    models: ModelFactory, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LoraStack]:
    tmp = tmp_path_factory.mktemp("lora")
    support = models.adapter(tiny_model_dir, rank=8, targets=("attn.Wqkv", "mlp.w12"))[1]
    legal = models.adapter(tiny_model_dir, rank=4, targets=("attn.out_proj", "mlp.w3"), seed=1)[1]
    poisoned = resealed(support, tmp / "poisoned-src", with_nan)
    out = tmp / "adapters"
    fetch = subprocess.run(
        [sys.executable, "-m", "ministream.cli", "fetch-adapters", "--output-dir", str(out)]
        + ["--max-rank", "8"]
        + [f"--adapter={n}={p}" for n, p in (("support", support), ("legal", legal))]
        + [f"--adapter={BAD}={poisoned}"],
        capture_output=True,
        text=True,
        env={**os.environ, "MINISTREAM_MODEL_HASH": Manifest.load(tiny_model_dir).model_hash},
        timeout=600,
        check=True,
    )
    names = (*GOOD, BAD)
    vllm = ServeVLLM(
        model=str(tiny_model_dir),
        served_name=BASE,
        log_path=tmp / "vllm.log",
        args=[
            *TINY_ENGINE_ARGS,
            "--enable-lora",
            "--max-loras",
            str(len(names) + 1),
            "--max-lora-rank",
            "8",
            "--lora-modules",
            *(f"{n}={out}/{n}" for n in names),
            "--middleware",
            adapter_guard.MIDDLEWARE,
        ],
        # The key as the chart passes it: vLLM and the adapter-route guard both read it.
        env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", adapter_guard.API_KEY_ENV: API_KEY},
    )
    vllm.start()
    sidecar = None
    prom = None
    try:
        vllm.wait_healthy()
        sidecar = start_sidecar(
            vllm.url,
            BASE,
            tmp / "sidecar.log",
            {
                "MINISTREAM_SIDECAR_LORA_ADAPTERS": ",".join(names),
                "MINISTREAM_SIDECAR_API_KEY": API_KEY,
            },
        )
        labels = {"namespace": NAMESPACE, "pod": POD}
        prom = PrometheusServer(
            workdir=tmp / "prometheus",
            targets=[
                ScrapeTarget("vllm", f"127.0.0.1:{vllm.port}", {**labels, "container": "vllm"}),
                ScrapeTarget(
                    "sidecar", sidecar.url.removeprefix("http://"), {**labels, "container": "s"}
                ),
            ],
            rule_files=[ROOT / RULES_FILE],
        )
        # vLLM guards /metrics? No: only /v1 etc. (its AuthenticationMiddleware).
        prom.start()
        yield LoraStack(vllm, sidecar, prom, fetch.stderr)
    finally:
        if prom is not None:
            prom.stop()
        if sidecar is not None:
            sidecar.stop()
        vllm.stop()


def _complete(url: str, model: str, key: str | None = API_KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": model, "prompt": [1, 2, 3, 4], "max_tokens": 4, "temperature": 0}
    return httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=120)


def test_refused_adapter_is_left_out_and_the_rest_are_served(stack: LoraStack) -> None:
    assert f"adapter '{BAD}'" in stack.fetch_stderr and "NaN/Inf value(s)" in stack.fetch_stderr
    assert f"LoRA adapter {BAD}=" in stack.vllm.log_tail(400)  # serve_vllm's note
    listed = httpx.get(
        f"{stack.vllm.url}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}
    ).json()
    assert {m["id"] for m in listed["data"]} == {BASE, *GOOD}
    assert _complete(stack.vllm.url, BAD).status_code == 404


def test_readiness_waits_for_every_adapter_and_names_the_missing_one(stack: LoraStack) -> None:
    before = stack.sidecar.get("/readyz")
    assert before.status_code == 503 and "warmup_pending" in before.json()["reasons"]
    warm = stack.sidecar.post("/warmup")
    assert warm.status_code == 200, warm.text
    assert warm.json()["adapters_warmed"] == list(GOOD)
    assert warm.json()["adapters_missing"] == [BAD]
    after = stack.sidecar.get("/readyz")
    assert after.status_code == 200, after.text
    assert after.json()["adapters_missing"] == [BAD]
    # Each adapter was sent a warmup request: vLLM's own info gauge saw them running.
    for name in (BASE, *GOOD):
        assert _complete(stack.vllm.url, name).status_code == 200


def test_prometheus_sees_the_adapters_and_alerts_on_the_missing_one(stack: LoraStack) -> None:
    stack.sidecar.post("/warmup")  # idempotent: the run above, or this one
    present: set[str] = set()

    def scraped() -> bool:
        present.clear()
        present.update(stack.prom.names())
        return present >= catalog.LORA_ONLY

    wait_until(scraped, 60, 1, what="the LoRA series scraped", detail=lambda: f"{present}")
    loaded = stack.prom.query("ministream_lora_adapter_loaded")
    assert {r["metric"]["adapter"]: float(r["value"][1]) for r in loaded} == {
        "support": 1.0,
        "legal": 1.0,
        BAD: 0.0,
    }
    running = stack.prom.query('vllm:lora_requests_info{running_lora_adapters!=""}')
    assert running, "no scrape saw an adapter in the running batch"
    for q in queries(AlertParams()):
        if metric_names(q.promql) & catalog.LORA_ONLY and q.kind != "alert":
            assert stack.prom.query(concrete(q.expr, rate_interval="5m")), q.origin

    def alert_on_bad() -> list[dict[str, Any]]:
        return [
            a
            for a in stack.prom.api("alerts")["alerts"]
            if a["labels"]["alertname"] == "MiniStreamLoraAdapterNotLoaded"
        ]

    # Pending is enough: the expression matched live data; `for` is promtool-tested.
    wait_until(lambda: bool(alert_on_bad()), 60, 1, what="the adapter alert", detail=alert_on_bad)
    assert {a["labels"]["adapter"] for a in alert_on_bad()} == {BAD}


def test_dynamic_loading_endpoints_need_the_api_key(stack: LoraStack) -> None:
    url = stack.vllm.url
    body = {"lora_name": "x", "lora_path": "/nonexistent"}
    assert httpx.post(f"{url}/v1/load_lora_adapter", json=body, timeout=30).status_code == 401
    assert httpx.post(f"{url}/v1/unload_lora_adapter", json=body, timeout=30).status_code == 401
    # SageMaker-style routes vLLM registers with runtime updating on, outside /v1 (vLLM's key
    # middleware guards /v1, /v2, /inference and /cohere only): the plugin's guard answers them.
    body2 = {"name": "x", "src": "/nonexistent"}
    assert httpx.post(f"{url}/adapters", json=body2, timeout=30).status_code == 401
    assert httpx.delete(f"{url}/adapters/x", timeout=30).status_code == 401
    with_key = httpx.post(
        f"{url}/adapters", json=body2, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30
    )
    assert with_key.status_code != 401, with_key.text  # reaches vLLM, which refuses the path
