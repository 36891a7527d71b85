"""The rolling restart on the chart's rendered pods, run from the images by podman
(`ministream-loadtest rollout --runtime podman`), smallest size that still proves the claim:
one replica of the tiny model behind HAProxy, one surge replacement under 4 requests/s, the
rendered preStop drain run in the old pod's vLLM container before SIGTERM: no request fails.

Opt-in (MINISTREAM_IMAGE_ROLLOUT=1), and so skipped in CI with that reason: it takes minutes
on the 2-core CI machine on top of a cold image build and the other image tests, more than
the share of CI's budget that the image tests may spend (docs/images.md). `make bench-serve` runs
the full drain/control pair (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from imagekit import ROOT

from ministream_testkit.helm import helm_path
from ministream_testkit.vllm_server import TINY_ENGINE_ARGS
from tests.support.models import ModelFactory

pytestmark = [
    pytest.mark.images,
    pytest.mark.engine,
    pytest.mark.network,
    pytest.mark.root("podman with runc"),
    pytest.mark.timeout(3600),
    pytest.mark.skipif(
        os.environ.get("MINISTREAM_IMAGE_ROLLOUT") != "1",
        reason="~5 min, over the image tests' CI budget: set MINISTREAM_IMAGE_ROLLOUT=1 "
        "(make bench-serve runs the full pair)",
    ),
]


@pytest.fixture(scope="module")
def report(
    built_images: dict[str, Any], models: ModelFactory, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("rollout-podman")
    cmd = [
        sys.executable, "-m", "ministream_loadtest", "rollout", "--runtime", "podman",
        "--replicas", "1", "--rollout-mode", "surge", "--restarts", "1", "--rate", "4",
        "--model", str(models.converted("tiny", "float32")),
        "--served-model-name", "ministream-tiny", "--output", str(out / "rollout.json"),
        "--chart", str(ROOT / "charts" / "ministream"),
        "--helm", helm_path(),
        "--", *TINY_ENGINE_ARGS,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    result: dict[str, Any] = json.loads((out / "rollout.json").read_text())
    return result


def test_container_rollout_with_drain_drops_no_request(report: dict[str, Any]) -> None:
    assert report["runtime"]["runtime"] == "podman"
    assert report["sent"] > 0 and report["failed"] == 0, report["failures_by_cause"]
    assert report["load_covered_rollout"]
    [old] = [p for p in report["pods"] if p["name"] == "v1-0"]
    assert old["prestop"]["status"] == 200 and old["prestop"]["exit_code"] == 0
    assert old["vllm_exit_code"] == 0 and not old["sigkilled"]
    check = report["access_log_check"]
    assert check["matched"] == report["sent"] and check["status_disagreements"] == []


def test_it_ran_the_charts_images(report: dict[str, Any], built_images: dict[str, Any]) -> None:
    assert set(report["runtime"]["images"]) == {
        built_images["cpu"]["tag"],
        built_images["sidecar"]["tag"],
    }
