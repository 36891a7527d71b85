"""The rules a LoRA adapter is held to before MiniStream serves it, in one place.

Two validators apply them: `ministream.lora_convert.check_training_adapter` to the training
framework's `adapter.pt` that `convert-lora` reads (raw target names, `lora_config.r` and
`.alpha`), and `ministream.adapter_fetch.check_fetched_adapter` to a converted adapter
directory the pod's `fetch-adapters` copies in (PEFT module names, `adapter_config.json`'s
`r` and `lora_alpha`), checked again there because the store may hold anything. Each rule
returns its problem as one sentence, or None; `field` names the setting as the checked file
spells it.

Importing this module imports no torch (the values rule imports it when it runs).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, TypeGuard

if TYPE_CHECKING:
    import torch

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# Trained LoRA factors are O(1) or smaller; an entry past this is a diverged or corrupt
# adapter, and in bfloat16/float16 serving it overflows or swamps the base weights. The same
# bound holds for the scale alpha / r that multiplies them.
MAX_ABS_VALUE = 1e3


def reported(*found: str | None) -> list[str]:
    """The problems the rules found (their Nones dropped)."""
    return [p for p in found if p]


def is_rank(r: object) -> TypeGuard[int]:
    """A rank is a positive integer."""
    return isinstance(r, int) and not isinstance(r, bool) and r > 0


def rank_problem(r: object, max_rank: int, *, field: str, maximum: str) -> str | None:
    """`r` is a rank within `max_rank` (`maximum` says which setting sets it)."""
    if not is_rank(r):
        return f"{field} must be a positive integer, got {r!r}"
    if r > max_rank:
        return (
            f"rank {r} is above the maximum rank {max_rank} ({maximum}; vLLM serves ranks up "
            "to its --max-lora-rank): retrain with a lower rank or raise the maximum"
        )
    return None


def is_alpha(alpha: object) -> TypeGuard[float]:
    """An alpha is a positive finite number."""
    return (
        isinstance(alpha, int | float)
        and not isinstance(alpha, bool)
        and math.isfinite(alpha)
        and alpha > 0
    )


def alpha_problem(alpha: object, *, field: str) -> str | None:
    if not is_alpha(alpha):
        return f"{field} must be a positive finite number, got {alpha!r}"
    return None


def scale_problem(alpha: float, r: int, *, field: str) -> str | None:
    """The scale alpha / r (of a valid alpha and rank) within MAX_ABS_VALUE."""
    if alpha / r > MAX_ABS_VALUE:
        return (
            f"scale {field} / r = {alpha / r:g} is absurdly large (> {MAX_ABS_VALUE:g}): "
            "a diverged or corrupt adapter"
        )
    return None


def values_problem(key: str, tensor: torch.Tensor) -> str | None:
    """The tensor's values are all finite and within MAX_ABS_VALUE."""
    import torch

    values = tensor.float()
    finite = torch.isfinite(values)
    if not finite.all():
        return f"{key}: {int((~finite).sum())} NaN/Inf value(s)"
    peak = float(values.abs().max()) if values.numel() else 0.0
    if peak > MAX_ABS_VALUE:
        return f"{key}: values up to {peak:.3g}, absurdly large (> {MAX_ABS_VALUE:g})"
    return None
