"""scripts/gpu/fp8_emulation_check.py: holds a GPU FP8 run (fp8_compare.py's report) against the
CPU emulation of vLLM's online FP8 (ministream_reference.fp8_emulation).

The CPU build of vLLM has no FP8 kernel, so the GPU run itself cannot happen here; these tests
check that the script reads fp8_compare.py's report as written and refuses inputs that do not
pair up.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ministream_reference.golden import DEFAULT_PROMPTS
from tests.support.scripts import GPU_SCRIPTS, ScriptImporter

MAX_TOKENS = 8


def test_check_script_reads_the_fp8_report(tiny_model_dir: Path, tmp_path: Path) -> None:
    golden = [sys.executable, "-m", "ministream_reference.golden", "--engine", "reference"]
    for name, extra in (("reference", []), ("emulated", ["--emulate", "fp8"])):
        args = ["--model", str(tiny_model_dir), "--out", str(tmp_path / f"{name}.json")]
        subprocess.run([*golden, *args, "--max-tokens", str(MAX_TOKENS), *extra], check=True)
    reference = json.loads((tmp_path / "reference.json").read_text())
    emulated = json.loads((tmp_path / "emulated.json").read_text())
    # fp8_compare.py's report, as a GPU run writes it: here the "GPU" FP8 tokens are the
    # emulation's and the bf16 tokens the reference's, so both pairs must agree throughout.
    report = {
        "variants": {
            "fp8": {"golden_tokens": [c["tokens"] for c in emulated]},
            "bf16": {"golden_tokens": [c["tokens"] for c in reference]},
        }
    }
    (tmp_path / "fp8-compare.json").write_text(json.dumps(report))
    out = tmp_path / "check.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(GPU_SCRIPTS / "fp8_emulation_check.py"),
            "--fp8-report",
            str(tmp_path / "fp8-compare.json"),
            "--reference",
            str(tmp_path / "reference.json"),
            "--emulated",
            str(tmp_path / "emulated.json"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    pairs = json.loads(out.read_text())["pairs"]
    total = f"{MAX_TOKENS * len(DEFAULT_PROMPTS)}/{MAX_TOKENS * len(DEFAULT_PROMPTS)}"
    assert pairs["gpu_fp8~emulated"]["total"] == total
    assert pairs["gpu_bf16~reference"]["total"] == total
    assert "gpu_fp8~reference" in proc.stdout


@pytest.mark.parametrize("broken", ["prompts", "count"])
def test_check_script_refuses_mismatched_inputs(import_script: ScriptImporter, broken: str) -> None:
    check = import_script("fp8_emulation_check").check
    ref = [{"prompt": [1, 2], "tokens": [3, 4]}, {"prompt": [1], "tokens": [5, 6]}]
    emu = [dict(c) for c in ref]
    report = {"variants": {v: {"golden_tokens": [[3, 4], [5, 6]]} for v in ("fp8", "bf16")}}
    if broken == "prompts":
        emu[1]["prompt"] = [9]
        message = "different prompts"
    else:
        report["variants"]["fp8"]["golden_tokens"].pop()
        message = "different numbers of prompts"
    with pytest.raises(SystemExit, match=message):
        check(report, ref, emu)
