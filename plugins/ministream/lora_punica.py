"""vLLM's CPU LoRA kernels with "no adapter" meaning no adapter, also when every slot is full.

vLLM marks a token of a request without an adapter with slot index -1. Its PyTorch LoRA ops
(the CPU build's, `vllm/lora/ops/torch_ops`) gather `weights[indices]`, and -1 gathers the
*last* slot. While a slot is free that slot is all zeros and nothing shows; with every slot
in use (`--max-loras` adapters active in one batch) base requests batched beside them are
served with the last slot's adapter (seen with MiniStream and vLLM's own Llama on vLLM 0.32
CPU; upstream vllm#48421, open). The wrapper below gives the ops inputs whose rows for such
tokens are zero, so they add exactly what an empty slot adds: nothing.

The plugin's `register()` points the CPU platform at this class (`install`); vLLM's files
are not changed. Once vLLM treats -1 itself the zeroing changes no result.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

VLLM_CPU_WRAPPER = "vllm.lora.punica_wrapper.punica_cpu.PunicaWrapperCPU"
WRAPPER = "ministream.lora_punica.NoAdapterSafePunicaWrapperCPU"


def zero_rows_without_adapter(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """`x` with the rows whose slot index is -1 set to zero (a new tensor; `x` is a layer's
    input and must not change). Unchanged when every row has an adapter."""
    no_adapter = indices < 0
    if not bool(no_adapter.any()):
        return x
    assert x.shape[0] == indices.shape[0], (x.shape, indices.shape)
    return x.masked_fill(no_adapter.unsqueeze(-1), 0)


class NoAdapterSafePunicaWrapperCPU(PunicaWrapperCPU):
    """PunicaWrapperCPU whose every gather-by-slot sees zero inputs for slot -1."""

    def _shrink_prefill(self, y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, scale: float):
        x = zero_rows_without_adapter(x, self.token_lora_indices)
        super()._shrink_prefill(y, x, w, scale)

    def _shrink_decode(self, y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, scale: float):
        x = zero_rows_without_adapter(x, self.token_lora_indices)
        super()._shrink_decode(y, x, w, scale)

    def _expand_prefill(self, y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, add: bool):
        x = zero_rows_without_adapter(x, self.token_lora_indices)
        super()._expand_prefill(y, x, w, add)

    def _expand_decode(self, y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, add: bool):
        x = zero_rows_without_adapter(x, self.token_lora_indices)
        super()._expand_decode(y, x, w, add)

    def _expand_slice_prefill(
        self, y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, off: int, size: int, add: bool
    ):
        x = zero_rows_without_adapter(x, self.token_lora_indices)
        super()._expand_slice_prefill(y, x, w, off, size, add)

    def _expand_slice_decode(
        self, y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, off: int, size: int, add: bool
    ):
        x = zero_rows_without_adapter(x, self.token_lora_indices)
        super()._expand_slice_decode(y, x, w, off, size, add)

    def add_lora_logits(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: torch.Tensor,
        lora_b_stacked: torch.Tensor,
        scale: Any,
        **kwargs: Any,
    ) -> None:
        # The logits path gathers by the sampler's (per-sequence) indices.
        x = zero_rows_without_adapter(x.view(-1, x.shape[-1]), self.sampler_indices)
        super().add_lora_logits(y, x, lora_a_stacked, lora_b_stacked, scale, **kwargs)


def install() -> bool:
    """Point vLLM's CPU platform at the wrapper above; True if it now serves LoRA with it.

    Only the platform whose wrapper is vLLM's CPU one is changed (GPU builds' kernels skip
    index -1 themselves). Idempotent."""
    from vllm.platforms import current_platform

    platform = type(current_platform)
    current = platform.get_punica_wrapper()
    if current == VLLM_CPU_WRAPPER:
        platform.get_punica_wrapper = classmethod(lambda cls: WRAPPER)
        return True
    return current == WRAPPER
