"""vLLM's online FP8 (`quantization="fp8"`) emulated in the reference model, on the CPU.

What it emulates (vLLM 0.25.1, `Fp8PerTensorOnlineLinearMethod`, the method the H200 ran):
every linear layer of the decoder blocks stores its weight as float8 e4m3 with **one scale per
stored tensor**: the plugin's fused `qkv_proj` and `gate_up_proj` are each one tensor, so q, k
and v share a scale, as do gate and up; activations are quantized per token, dynamically
(the per-token path that vLLM takes where CUTLASS FP8 is available, as on the H200); the
product is accumulated in float32. Embeddings, norms, attention and the LM head stay unquantized.

It answers one question about a GPU FP8 run: are its tokens what FP8 does to this model (the
emulation predicts them), or does the serving path add an error of its own? Everything but the
rounding runs in float32 here, so agreement is expected up to near-ties, not bit for bit.
"""

from __future__ import annotations

import torch
from torch import nn

from ministream_reference.model import ReferenceMiniStream

E4M3_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448
# Which linear layers share one stored (fused) tensor in the plugin, hence one weight scale.
FUSED = {
    "self_attn": (("q_proj", "k_proj", "v_proj"), ("o_proj",)),
    "mlp": (("gate_proj", "up_proj"), ("down_proj",)),
}


def quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """`x / scale` rounded to e4m3 (saturating at ±448) and scaled back, in float32."""
    q = (x / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.to(torch.float32) * scale


def tensor_scale(weights: list[torch.Tensor]) -> torch.Tensor:
    """One dynamic per-tensor scale over the fused tensor made of `weights`."""
    amax = max(float(w.abs().max()) for w in weights)
    return torch.tensor(max(amax, 1e-12) / E4M3_MAX)


class Fp8Linear(nn.Module):
    """A linear layer with an e4m3 weight (given scale) and per-token e4m3 activations."""

    def __init__(self, linear: nn.Linear, scale: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(
            quantize(linear.weight.detach().float(), scale), requires_grad=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        amax = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12)
        return quantize(x, amax / E4M3_MAX) @ self.weight.t()


def emulate_fp8(model: ReferenceMiniStream) -> ReferenceMiniStream:
    """Replace, in place, every decoder-block linear layer of `model` by its FP8 emulation."""
    for block in model.model.layers:
        for part, groups in FUSED.items():
            module = getattr(block, part)
            for group in groups:
                linears = [getattr(module, name) for name in group]
                scale = tensor_scale([lin.weight.detach().float() for lin in linears])
                for name, lin in zip(group, linears, strict=True):
                    setattr(module, name, Fp8Linear(lin, scale))
    return model
