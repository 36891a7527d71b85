"""The one table that translates MiniStream's checkpoint names into Hugging Face/Llama names.

The converter, the reference model (when it runs a raw checkpoint) and the vLLM model's
`load_weights` all read from here, so a name or a fused-matrix layout is written once.

A raw tensor maps to one or more HF tensors; a fused raw matrix is split along its rows
(dim 0) in the order listed (docs/architecture.md §1.1): `Wqkv` = [Q; K; V], `w12` = [gate; up].
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ministream.train_config import TrainConfig

# Row-block sizes of fused matrices, by key.
_ROWS = {
    "q": lambda c: c.n_heads * c.head_dim,
    "kv": lambda c: c.n_kv_heads * c.head_dim,
    "ff": lambda c: c.d_ff,
}
# Column counts (dim 1) of 2-D tensors, by key; "vec" marks a 1-D tensor.
_COLS = {
    "d": lambda c: c.d_model,
    "attn": lambda c: c.n_heads * c.head_dim,
    "ff": lambda c: c.d_ff,
}


@dataclass(frozen=True)
class Rule:
    """One raw tensor and the HF tensors it becomes: `parts` = ((hf_name, rows_key), ...)."""

    raw: str
    parts: tuple[tuple[str, str], ...]
    cols: str  # key into _COLS, or "vec" for 1-D tensors
    per_layer: bool = True


_L = "model.layers.{i}"
RULES: tuple[Rule, ...] = (
    Rule("embedding.weight", (("model.embed_tokens.weight", "vocab"),), "d", per_layer=False),
    Rule(
        "blocks.{i}.attn.Wqkv.weight",
        (
            (f"{_L}.self_attn.q_proj.weight", "q"),
            (f"{_L}.self_attn.k_proj.weight", "kv"),
            (f"{_L}.self_attn.v_proj.weight", "kv"),
        ),
        "d",
    ),
    Rule("blocks.{i}.attn.out_proj.weight", ((f"{_L}.self_attn.o_proj.weight", "d"),), "attn"),
    Rule(
        "blocks.{i}.mlp.w12.weight",
        (
            (f"{_L}.mlp.gate_proj.weight", "ff"),
            (f"{_L}.mlp.up_proj.weight", "ff"),
        ),
        "d",
    ),
    Rule("blocks.{i}.mlp.w3.weight", ((f"{_L}.mlp.down_proj.weight", "d"),), "ff"),
    Rule("blocks.{i}.norm1.weight", ((f"{_L}.input_layernorm.weight", "d"),), "vec"),
    Rule("blocks.{i}.norm2.weight", ((f"{_L}.post_attention_layernorm.weight", "d"),), "vec"),
    Rule("norm_f.weight", (("model.norm.weight", "d"),), "vec", per_layer=False),
)
LM_HEAD_RULE = Rule("lm_head.weight", (("lm_head.weight", "vocab"),), "d", per_layer=False)

# vLLM fuses q/k/v and gate/up into one parameter each; `load_weights` routes the HF
# tensors into those with a shard id: (fused param, HF name fragment, shard id).
STACKED_PARAMS_MAPPING: tuple[tuple[str, str, str | int], ...] = (
    (".qkv_proj", ".q_proj", "q"),
    (".qkv_proj", ".k_proj", "k"),
    (".qkv_proj", ".v_proj", "v"),
    (".gate_up_proj", ".gate_proj", 0),
    (".gate_up_proj", ".up_proj", 1),
)


def _rows(key: str, cfg: TrainConfig) -> int:
    if key == "vocab":
        return cfg.vocab_size
    if key == "d":
        return cfg.d_model
    return _ROWS[key](cfg)


def _rules(cfg: TrainConfig) -> tuple[Rule, ...]:
    return RULES if cfg.tie_embeddings else (*RULES, LM_HEAD_RULE)


@dataclass(frozen=True)
class Slice:
    """HF tensor `hf` is rows [start, stop) of raw tensor `raw`, with `shape`."""

    raw: str
    hf: str
    start: int
    stop: int
    shape: tuple[int, ...]


def conversion_plan(cfg: TrainConfig) -> Iterator[tuple[str, tuple[int, ...], list[Slice]]]:
    """Yield (raw name, expected raw shape, HF slices) for every tensor of the model."""
    for rule in _rules(cfg):
        for layer in range(cfg.n_layers) if rule.per_layer else (None,):
            raw = rule.raw.format(i=layer)
            cols = () if rule.cols == "vec" else (_COLS[rule.cols](cfg),)
            slices, start = [], 0
            for hf_template, rows_key in rule.parts:
                rows = _rows(rows_key, cfg)
                slices.append(
                    Slice(raw, hf_template.format(i=layer), start, start + rows, (rows, *cols))
                )
                start += rows
            yield raw, (start, *cols), slices


def raw_shapes(cfg: TrainConfig) -> dict[str, tuple[int, ...]]:
    return {raw: shape for raw, shape, _ in conversion_plan(cfg)}


def hf_shapes(cfg: TrainConfig) -> dict[str, tuple[int, ...]]:
    return {s.hf: s.shape for _, _, slices in conversion_plan(cfg) for s in slices}


# LoRA adapters of the training framework adapt these raw matrices (docs/plugin.md, LoRA):
# `blocks.{i}.{target}.weight`. Their HF modules and row blocks are the conversion plan's.
LORA_TARGETS: tuple[str, ...] = ("attn.Wqkv", "attn.out_proj", "mlp.w12", "mlp.w3")
# The highest adapter rank `convert-lora` and `fetch-adapters` accept unless told otherwise.
DEFAULT_MAX_LORA_RANK = 64
# The values vLLM's --max-lora-rank takes (vllm/config/lora.py, MaxLoRARanks; a test holds
# the two equal): an adapter of rank r is served with the smallest of them >= r.
VLLM_MAX_LORA_RANKS: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def serving_max_lora_rank(rank: int) -> int:
    """The smallest --max-lora-rank vLLM accepts that serves an adapter of `rank`."""
    fits = [r for r in VLLM_MAX_LORA_RANKS if r >= rank]
    if not fits:
        largest = VLLM_MAX_LORA_RANKS[-1]
        raise ValueError(f"rank {rank} is above vLLM's largest --max-lora-rank, {largest}")
    return fits[0]


@dataclass(frozen=True)
class LoraTarget:
    """One adaptable raw matrix of one layer: its shape and the HF modules its rows become
    (`slices[k].hf` without `.weight` is the module a PEFT adapter names)."""

    raw: str
    shape: tuple[int, int]  # (out_features, in_features) of the raw fused matrix
    slices: tuple[Slice, ...]

    @property
    def modules(self) -> tuple[str, ...]:
        return tuple(s.hf.removesuffix(".weight") for s in self.slices)


def lora_targets(cfg: TrainConfig) -> dict[tuple[int, str], LoraTarget]:
    """(layer, target) → its LoraTarget, for every layer and every name in LORA_TARGETS."""
    plan = {raw: (shape, slices) for raw, shape, slices in conversion_plan(cfg)}
    out = {}
    for layer in range(cfg.n_layers):
        for target in LORA_TARGETS:
            raw = f"blocks.{layer}.{target}.weight"
            shape, slices = plan[raw]
            assert len(shape) == 2, raw
            out[(layer, target)] = LoraTarget(raw, (shape[0], shape[1]), tuple(slices))
    return out
