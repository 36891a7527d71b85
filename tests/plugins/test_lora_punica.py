"""The full-slots guard at the level of vLLM's CPU punica wrapper (no engine).

Two adapter slots, both in use; tokens of a base request (LoRA id 0, slot -1) sit between
tokens of the two adapters, in prefill and in decode. The LoRA delta a base token receives
must be zero. vLLM 0.32's own CPU wrapper gives it the last slot's delta (vllm#48421), which
this test shows too, so it fails if vLLM's handling changes under the guard's feet.
The engine-level proof is `test_lora_numerics.py`.
"""

from __future__ import annotations

import pytest
import torch
from vllm.lora.layers.utils import LoRAMapping
from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

from ministream.lora_punica import WRAPPER, NoAdapterSafePunicaWrapperCPU, install

IN, RANK, OUT = 8, 2, (6, 4)  # a packed layer of two slices (as gate/up)
LORA_IDS = [7, 9]  # the two slots, both in use


def _delta(cls: type[PunicaWrapperCPU], prefill: bool) -> tuple[torch.Tensor, list[int]]:
    torch.manual_seed(0)
    # Token rows: adapter 7, base, adapter 9, base (prefill: each request two tokens).
    ids = [7, 0, 9, 0]
    index_mapping = [i for i in ids for _ in range(2)] if prefill else ids
    wrapper = cls(max_num_batched_tokens=16, max_batches=4, device="cpu")
    wrapper.update_metadata(
        LoRAMapping(tuple(index_mapping), tuple(ids), is_prefill=prefill),
        LORA_IDS,
        max_loras=len(LORA_IDS),
        vocab_size=32,
    )
    x = torch.randn(len(index_mapping), IN)
    a = tuple(torch.randn(len(LORA_IDS), 1, RANK, IN) for _ in OUT)
    b = tuple(torch.randn(len(LORA_IDS), 1, n, RANK) for n in OUT)
    y = torch.zeros(len(index_mapping), sum(OUT))
    wrapper.add_lora_linear(y, x, a, b, 1.0, OUT)
    return y, index_mapping


@pytest.mark.parametrize("prefill", [True, False], ids=["prefill", "decode"])
def test_base_tokens_get_no_delta_with_every_slot_in_use(prefill: bool) -> None:
    delta, mapping = _delta(NoAdapterSafePunicaWrapperCPU, prefill)
    base = torch.tensor([m == 0 for m in mapping])
    assert torch.count_nonzero(delta[base]) == 0
    assert torch.all(delta[~base].abs().sum(-1) > 0)  # adapter tokens still get theirs

    upstream, _ = _delta(PunicaWrapperCPU, prefill)
    torch.testing.assert_close(delta[~base], upstream[~base])  # same for adapter tokens
    assert torch.count_nonzero(upstream[base]) > 0, (
        "vLLM's CPU wrapper no longer reads slot -1 as the last slot (vllm#48421 fixed?): "
        "the guard in ministream.lora_punica may go; see docs/plugin.md"
    )


def test_register_points_the_cpu_platform_at_the_guard() -> None:
    from vllm.platforms import current_platform

    import ministream

    ministream.register()
    assert install()  # idempotent: still ours
    assert current_platform.get_punica_wrapper() == WRAPPER
