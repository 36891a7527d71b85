"""The CPU emulation of vLLM's online FP8 (ministream_reference.fp8_emulation).

The CPU build of vLLM has no FP8 kernel, so the GPU run itself cannot happen here; these tests
check that the emulation rounds as e4m3 does and shares scales as the plugin's fused tensors do
(the script that holds a GPU FP8 run against it: tests/scripts/test_fp8_emulation_check.py).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ministream_reference.fp8_emulation import E4M3_MAX, FUSED, Fp8Linear, emulate_fp8, quantize
from ministream_reference.golden import DEFAULT_PROMPTS, reference_completions
from ministream_reference.model import ReferenceMiniStream

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
