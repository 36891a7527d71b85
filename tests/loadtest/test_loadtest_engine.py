"""`ministream-loadtest run` against the real vLLM CPU engine (the session's `vllm_server`).

The SLO report must carry the engine's own figures: each is checked here by hand against
the engine's raw per-request records (`--save-detailed`), not against our own code.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import yaml

pytestmark = [pytest.mark.engine, pytest.mark.network]

SCENARIO: dict[str, Any] = {
    "name": "tiny-chat",
    "description": "chat turns sized for the tiny model (max_model_len 512)",
    "api": "chat",
    "input_tokens": 32,
    "output_tokens": 16,
    "range_ratio": 0.25,
    "requests": 8,
    "sweep": {"mode": "concurrency", "values": [1, 2]},
    # TTFT tight enough that some requests may miss it: goodput is then checked, not assumed.
    "slo": {"ttft_ms": 80, "e2el_ms": 5000, "attainment": 0.5},
}


@pytest.fixture(scope="module")
def slo_run(vllm_server: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("slo")
    scenario = out / "tiny-chat.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ministream_loadtest",
            "run",
            "--scenario",
            str(scenario),
            "--base-url",
            vllm_server.url,
            "--output-dir",
            str(out / "report"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "report" / "report.json").read_text())
    return {"dir": out / "report", "report": report}


def test_report_has_every_slo_figure_per_sweep_point(slo_run: dict[str, Any]) -> None:
    report = slo_run["report"]
    assert report["engine"]["name"] == "vllm bench serve"
    assert report["engine"]["version"].endswith("0.32.0")
    (scenario,) = report["scenarios"]
    assert [p["load"] for p in scenario["points"]] == [{"concurrency": 1.0}, {"concurrency": 2.0}]
    for point in scenario["points"]:
        assert point["requests"] == {"sent": 8, "completed": 8, "failed": 0}
        assert point["errors"] == {}
        for metric in ("ttft_ms", "itl_ms", "tpot_ms", "e2el_ms"):
            assert set(point[metric]) == {"mean", "p50", "p95", "p99"}
            assert 0 < point[metric]["p50"] <= point[metric]["p95"] <= point[metric]["p99"]
        assert point["throughput"]["requests_per_s"] > 0
        assert point["throughput"]["output_tokens_per_s"] > 0
        assert 0 <= point["goodput"]["attainment"] <= 1
    png = slo_run["dir"] / report["plots"][0]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_figures_match_the_engines_raw_records_by_hand(slo_run: dict[str, Any]) -> None:
    point = slo_run["report"]["scenarios"][0]["points"][1]
    raw = json.loads((slo_run["dir"] / point["raw"]).read_text())
    ok = [i for i, e in enumerate(raw["errors"]) if not e]
    ttft_ms = [raw["ttfts"][i] * 1000 for i in ok]
    e2el_ms = [raw["latencies"][i] * 1000 for i in ok]
    itl_ms = [gap * 1000 for i in ok for gap in raw["itls"][i]]

    assert point["requests"]["sent"] == len(raw["start_times"]) == 8
    assert point["requests"]["completed"] == len(ok)
    assert point["ttft_ms"]["p99"] == pytest.approx(np.percentile(ttft_ms, 99))
    assert point["ttft_ms"]["p50"] == pytest.approx(np.median(ttft_ms))
    assert point["e2el_ms"]["p95"] == pytest.approx(np.percentile(e2el_ms, 95))
    assert point["itl_ms"]["p99"] == pytest.approx(np.percentile(itl_ms, 99))
    assert point["throughput"]["requests_per_s"] == pytest.approx(len(ok) / raw["duration"])
    assert point["throughput"]["output_tokens_per_s"] == pytest.approx(
        sum(raw["output_lens"]) / raw["duration"]
    )
    # Goodput by hand: a request is good when it meets every SLO of the scenario.
    good = sum(
        1
        for i in ok
        if raw["ttfts"][i] * 1000 <= SCENARIO["slo"]["ttft_ms"]
        and raw["latencies"][i] * 1000 <= SCENARIO["slo"]["e2el_ms"]
    )
    assert point["goodput"]["good_requests"] == good
    assert point["goodput"]["attainment"] == pytest.approx(good / 8)
