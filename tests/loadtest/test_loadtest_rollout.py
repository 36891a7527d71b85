"""The rolling-restart experiment, CI-sized: 2 replicas of the tiny model (real vLLM CPU + the
real sidecar each) behind real HAProxy, constant streaming load, pods replaced as the chart's
rollout does it, with the chart's timing values. One run replaces both pods, a paired control:

- the first replacement with the preStop drain: zero failed requests;
- the second without it (`--control-restarts 1`): failures, traced to the terminating pod.
Counts are checked against the engine's raw per-request records and HAProxy's access log.

CI sizes (the full experiment, in the chart's default `surge` mode, is `make bench-serve`,
docs/benchmarks.md): `inPlace` mode, where each new pod starts alone on the core its
predecessor freed (about 1 min). A surge pod starts beside two serving engines on two cores,
which took 4-6 min of every CI run; the drain's guarantee does not depend on the mode (the
terminating pod is drained the same way). Drained and control replacements share one fleet
and one load (two separate runs started the fleet twice), and differ in the drain and the
control's longer endpoint lag only.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ministream_loadtest.haproxy import find_haproxy
from ministream_loadtest.records import CONNECTION_CAUSES
from ministream_testkit.helm import helm_path

pytestmark = [pytest.mark.engine, pytest.mark.network, pytest.mark.timeout(3600)]

# Poisson arrivals per second through HAProxy. Any request in flight keeps a CPU engine busy,
# so a higher rate does not starve a starting pod more; it only lengthens the run.
RATE = "4"
# The control run's endpoint lag (the default is 2 s): a request reaches a pod that already got
# SIGTERM only within it. At 2 s, runs lost 3-6 requests over two restarts, so P(none) was a
# few percent; at 6 s about 3x as many are expected, and P(none) stays far below 1e-4.
CONTROL_ENDPOINT_LAG = "6"
VLLM_ARGS = ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager"]
ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "ministream"  # the experiment replays this chart's rendered pod


def run_experiment(
    command: str, model: Path, output: Path, args: Sequence[str], timeout: float
) -> tuple[dict[str, Any], str]:
    """`ministream-loadtest COMMAND ARGS` on the tiny model with this checkout's chart: its
    JSON report and its standard output."""
    find_haproxy()  # a missing HAProxy fails here, naming scripts/install_haproxy.sh
    cmd = [sys.executable, "-m", "ministream_loadtest", command, *args, "--output", str(output)]
    cmd += ["--model", str(model), "--served-model-name", "ministream-tiny"]
    cmd += ["--chart", str(CHART), "--helm", helm_path(), "--", *VLLM_ARGS]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except BaseException:  # timeout or Ctrl-C: SIGTERM lets the command stop its pods
        proc.terminate()
        proc.communicate(timeout=120)
        raise
    assert proc.returncode == 0, stdout[-3000:] + stderr[-6000:]
    report: dict[str, Any] = json.loads(output.read_text())
    return report, stdout


def run_rollout(model: Path, out: Path, *extra: str) -> dict[str, Any]:
    args = ["--replicas", "2", "--rate", RATE, *extra]
    report, _ = run_experiment("rollout", model, out / "rollout.json", args, timeout=3300)
    report["_raw"] = json.loads(Path(report["load"]["raw_result"]).read_text())
    return report


# Load before the restart and after the replacement is in service: 20 requests each at RATE,
# enough for the report's before/after windows (the defaults, 10 and 15 s, are for readable
# benchmark plots).
LOAD_AROUND = ("--lead-in", "5", "--tail", "5")


@pytest.fixture(scope="module")
def paired(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_rollout(
        tiny_model_dir,
        tmp_path_factory.mktemp("rollout"),
        "--rollout-mode",
        "inPlace",
        "--restarts",
        "2",
        "--control-restarts",
        "1",
        "--control-endpoint-lag",
        CONTROL_ENDPOINT_LAG,
        *LOAD_AROUND,
    )


def check_counts_against_raw(report: dict[str, Any]) -> None:
    raw = report["_raw"]
    for key in ("sent", "succeeded", "failed"):
        assert type(report[key]) is int, key
    assert report["sent"] == len(raw["start_times"]) <= report["load"]["max_requests"]
    assert report["sent"] == report["succeeded"] + report["failed"]
    assert report["succeeded"] <= raw["completed"]  # the engine's own count
    assert report["failed"] >= raw["failed"]
    assert sum(report["failures_by_cause"].values()) == report["failed"]
    # HAProxy logged the request and agrees on its outcome; or it never parsed the request,
    # which then failed at the connection with no response (seen once in a control run,
    # during a pod's shutdown: `server_disconnected`, docs/loadtest.md).
    check = report["access_log_check"]
    assert check["status_disagreements"] == []
    assert check["matched"] + len(check["unlogged"]) == report["sent"]
    assert all(u["cause"] in CONNECTION_CAUSES for u in check["unlogged"]), check["unlogged"]
    # The window's percentiles by hand from the raw records.
    t0, window = report["t0_perf_counter"], report["restart_window"]
    inside = [
        i
        for i, s in enumerate(raw["start_times"])
        if window["start_s"] <= s - t0 <= window["end_s"]
    ]
    assert window["sent"] == len(inside) > 0
    # The replacements' windows split the restart window, in order, without a gap.
    parts = [r["window"] for r in report["replacements"]]
    assert sum(w["sent"] for w in parts) == window["sent"]
    assert sum(w["failed"] for w in parts) == window["failed"]
    assert parts[0]["start_s"] == window["start_s"] and parts[-1]["end_s"] == window["end_s"]
    assert all(a["end_s"] == b["start_s"] for a, b in itertools.pairwise(parts))
    good = [raw["latencies"][i] * 1000 for i in inside if not raw["errors"][i]]
    if good and window["failed"] == 0:
        assert window["e2el_ms"]["p99"] == pytest.approx(np.percentile(good, 99), abs=1e-3)
        assert window["e2el_ms"]["p50"] == pytest.approx(np.median(good), abs=1e-3)


def test_rolling_restart_with_drain_drops_no_request(paired: dict[str, Any]) -> None:
    report = paired
    assert report["rollout_mode"] == "inPlace" and report["restarts"] == 2
    assert report["control_restarts"] == 1 and report["drain"] is False
    assert report["load_covered_rollout"]
    check_counts_against_raw(report)
    drained, control = report["replacements"]
    assert (drained["old"], drained["new"], drained["drain"]) == ("v1-0", "v2-0", True)
    assert drained["endpoint_lag_s"] == report["endpoint_lag_s"] == 2  # the default
    window = drained["window"]
    assert window["sent"] > 0
    for metric in ("ttft_ms", "itl_ms", "e2el_ms"):
        assert window[metric]["p50"] <= window[metric]["p95"] <= window[metric]["p99"]
    assert report["before_window"]["failed"] == 0
    # Every failure of the run is the control's: none names the drained pod or its successor.
    # A request sent in the drained replacement's window fails only if it was still in
    # flight on the control pod when that pod got SIGTERM: sent at most the run's slowest
    # request before the control began (the control test bounds each failure by that pod).
    assert not {"v1-0", "v2-0"} & set(report["failures_by_pod"])
    raw = report["_raw"]
    slowest = max(t for t, error in zip(raw["latencies"], raw["errors"], strict=True) if not error)
    late = [f for f in report["failures"] if f["sent_s"] < control["window"]["start_s"]]
    assert all(f["sent_s"] >= control["window"]["start_s"] - slowest for f in late), late
    assert window["failed"] == len(late)
    pods = {p["name"]: p for p in report["pods"]}
    assert set(pods) == {"v1-0", "v1-1", "v2-0", "v2-1"}
    old, new, kept = pods["v1-0"], pods["v2-0"], pods["v1-1"]
    # inPlace: the old pod drained and exited before its replacement was created, and the
    # replacement became ready while the other pod served alone.
    assert old["exited_s"] is not None and old["exited_s"] <= new["created_s"]
    assert new["ready_s"] is not None and new["ready_s"] > new["created_s"]
    assert kept["terminating_s"] is not None and kept["terminating_s"] >= new["ready_s"]
    assert new["terminating_s"] is None
    assert old["prestop"]["status"] == 200
    assert old["prestop"]["body"]["outcome"] == "idle"
    assert old["prestop"]["seconds"] >= report["chart_pod"]["drain_min_seconds"] - 0.5
    assert not old["sigkilled"]
    assert old["sigterm_s"] - old["terminating_s"] == pytest.approx(
        old["prestop"]["seconds"], abs=1.0
    )


def test_control_replacement_without_drain_fails_requests(paired: dict[str, Any]) -> None:
    report = paired
    control = report["replacements"][1]
    assert (control["old"], control["new"], control["drain"]) == ("v1-1", "v2-1", False)
    assert control["endpoint_lag_s"] == 6
    assert control["window"]["failed"] > 0
    # Every failure falls in the restart window: the control's own, or one sent in the
    # drained replacement's tail that was still in flight on the control pod at its SIGTERM
    # (the drained test bounds those; the loop below bounds each by the control pod).
    assert report["restart_window"]["failed"] == report["failed"]
    # vLLM answers 500 to new requests once it has SIGTERM, while its /health (and so the
    # pod's readiness) stays OK: only the endpoint removal stops them.
    assert "http_500" in report["failures_by_cause"]
    unlogged = report["access_log_check"]["unlogged"]
    assert set(report["failures_by_pod"]) <= {"v1-1", "none"}
    assert report["failures_by_pod"].get("none", 0) == len(unlogged)
    pods = {p["name"]: p for p in report["pods"]}
    old = pods["v1-1"]
    assert old["prestop"] is None and old["terminating_s"] is not None
    raw = report["_raw"]
    # A request sent before SIGTERM fails only if it was still in flight then: waiting for its
    # first token (a 500) or streaming (a broken stream). The run's slowest successful request
    # bounds how long that can be. Those figures come from the same client clock as `sent_s`,
    # so they carry its event-loop lag too (a fixed 0.5 s lead left too thin a margin).
    ok = [i for i, error in enumerate(raw["errors"]) if not error]
    slowest_ttft = max(raw["ttfts"][i] for i in ok)
    slowest_e2e = max(raw["latencies"][i] for i in ok)
    # And none was sent after the endpoint removal (a late client clock only makes `sent_s`
    # earlier than the real send). A failure HAProxy has no line for names no pod: it must
    # fit the control pod's shutdown too.
    for failure in report["failures"]:
        lead = slowest_ttft if failure["cause"] == "http_500" else slowest_e2e
        assert old["sigterm_s"] - lead <= failure["sent_s"] <= old["endpoint_removed_s"] + 0.5, (
            failure
        )
        assert raw["errors"][int(failure["request_id"].rsplit("-", 1)[1])]
