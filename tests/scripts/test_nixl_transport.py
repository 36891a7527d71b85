"""scripts/nixl_transport.py on this machine's real NIXL (the `pd` extra), at a tiny size: two
fresh processes per pair, host memory; the measurement itself is `make bench-nixl` and, on the
H200, `scripts/gpu/h200.sh nixl`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.support import tools
from tests.support.scripts import SCRIPTS, ScriptImporter

NIXL_HINT = "NIXL is not installed: run `make setup-test` (the `pd` extra)"


@pytest.fixture
def transport(import_script: ScriptImporter) -> ModuleType:
    return import_script("nixl_transport")


def test_every_block_arrives_intact_over_tcp_and_a_bad_setting_is_a_failed_pair(
    tmp_path: Path,
) -> None:
    """The chart's CPU transport moves every byte (the reader checks the pattern); a UCX_TLS
    naming no transport that can reach the other process fails its pair, reported as such,
    with the script's exit status 1, not a hang. An idle agent configured as vLLM's spends
    CPU with NIXL's progress thread on, none to speak of with it off."""
    tools.python_module("nixl", NIXL_HINT)
    out = tmp_path / "nixl.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPTS / "nixl_transport.py"),
            *("--mem", "DRAM", "--tls", "tcp,self", "--tls", "self"),
            *("--total-mib", "4", "--block-kib", "64", "--rounds", "2", "--instances", "1"),
            *("--timeout", "60", "--idle-seconds", "2", "--out", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    tcp = result["settings"]["tcp,self"]
    assert tcp["summary"]["failed"] == 0 and tcp["summary"]["intact"] is True
    assert len(tcp["pairs"][0]["seconds"]) == 2 and tcp["summary"]["gbps_median"] > 0
    alone = result["settings"]["self"]["summary"]
    assert alone["failed"] == 1 and alone["gbps_median"] is None
    assert result["provenance"]["command"]
    assert "| `tcp,self` | 1 | 0 | True |" in proc.stdout
    [on], [off] = result["idle"]["cores"]["on"], result["idle"]["cores"]["off"]
    assert result["idle"]["ucx_tls"] == "tcp,self" and on > off >= 0, result["idle"]
    assert "- progress thread on: " in proc.stdout


def test_the_summary_is_over_pairs(transport: ModuleType) -> None:
    """Each pair's median rate, their median and range; a failed pair counts as failed."""
    mib = 1 << 20
    pairs = [
        {"seconds": [0.001, 0.002, 0.001], "intact": True},  # median 1 MiB/ms
        {"seconds": [0.004, 0.004], "intact": True},
        {"error": "source exit 1"},
    ]
    s = transport.summarize(pairs, mib)
    assert s["pairs"] == 3 and s["failed"] == 1 and s["intact"] is True
    assert s["gbps_pair_medians"] == pytest.approx([mib / 0.001 / 1e9, mib / 0.004 / 1e9])
    assert s["gbps_range"] == pytest.approx([mib / 0.004 / 1e9, mib / 0.001 / 1e9])
