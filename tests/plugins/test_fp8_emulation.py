"""The CPU emulation of vLLM's online FP8 (ministream_reference.fp8_emulation) and the script
that holds a GPU FP8 run against it (scripts/gpu/fp8_emulation_check.py).

The CPU build of vLLM has no FP8 kernel, so the GPU run itself cannot happen here; these tests
check that the emulation rounds as e4m3 does, shares scales as the plugin's fused tensors do,
and that the check script reads fp8_compare.py's report as written.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ministream_reference.fp8_emulation import E4M3_MAX, FUSED, Fp8Linear, emulate_fp8, quantize
from ministream_reference.golden import DEFAULT_PROMPTS, reference_completions
from ministream_reference.model import ReferenceMiniStream

ROOT = Path(__file__).resolve().parents[2]
MAX_TOKENS = 8


def test_quantize_keeps_e4m3_values_and_saturates() -> None:
    grid = torch.tensor([0.0, 1.0, -1.5, 0.001953125, 448.0, -448.0])  # representable
    assert torch.equal(quantize(grid, torch.tensor(1.0)), grid)
    assert torch.equal(
        quantize(torch.tensor([1e6, -1e6]), torch.tensor(1.0)), torch.tensor([448.0, -448.0])
    )
    x = torch.linspace(0.02, 400, 5000)
    # Three mantissa bits: a normal value moves by at most half a step, 2**-4 of itself.
    assert ((quantize(x, torch.tensor(1.0)) - x).abs() <= x * 2**-4 + 1e-9).all()


def test_fused_layers_share_one_scale(tiny_model_dir: Path) -> None:
    model = ReferenceMiniStream.from_pretrained(tiny_model_dir, dtype=torch.float32)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    emulate_fp8(model)
    block = model.model.layers[0]
    for part, groups in FUSED.items():
        module = getattr(block, part)
        for group in groups:
            originals = [before[f"model.layers.0.{part}.{name}.weight"] for name in group]
            scale = max(float(w.abs().max()) for w in originals) / E4M3_MAX
            for name, w in zip(group, originals, strict=True):
                layer = getattr(module, name)
                assert isinstance(layer, Fp8Linear)
                # Rounded on the grid of the one scale the fused tensor has.
                assert torch.equal(layer.weight, quantize(w, torch.tensor(scale)))
    assert torch.equal(model.model.embed_tokens.weight, before["model.embed_tokens.weight"])


def test_emulation_moves_logprobs_by_rounding_not_more(tiny_model_dir: Path) -> None:
    prompts = [list(p) for p in DEFAULT_PROMPTS]
    exact = reference_completions(tiny_model_dir, prompts, MAX_TOKENS)
    fp8 = reference_completions(tiny_model_dir, prompts, MAX_TOKENS, emulate="fp8")
    deltas = [
        abs(e.logprobs[0][t] - f.logprobs[0][t])
        for e, f in zip(exact, fp8, strict=True)
        for t in e.logprobs[0].keys() & f.logprobs[0].keys()
    ]
    # At the first position (same prefix on both sides). e4m3 keeps 3 mantissa bits: on the
    # random-weight tiny model the top-5 logprobs move by up to 0.58 nats (seen); a wrong
    # scale saturates or flushes the weights and moves them by whole nats.
    assert deltas and 0 < max(deltas) < 1.0, deltas


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
            str(ROOT / "scripts" / "gpu" / "fp8_emulation_check.py"),
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
def test_check_script_refuses_mismatched_inputs(tmp_path: Path, broken: str) -> None:
    sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
    try:
        from fp8_emulation_check import check
    finally:
        sys.path.pop(0)
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
