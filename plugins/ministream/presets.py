"""Model shapes for demo checkpoints: the seed's shape and tiny test shapes."""

from __future__ import annotations

import math
from dataclasses import replace

from ministream.train_config import TrainConfig

_SEED_SHAPE = TrainConfig(
    d_model=768,
    n_layers=8,
    n_heads=12,
    n_kv_heads=12,
    head_dim=64,
    d_ff=2048,
    vocab_size=32000,
    max_seq_len=2048,
    norm_eps=1e-5,
    rope_theta=10000.0,
    tie_embeddings=True,
    bos_id=1,
    eos_id=2,
)
_TINY = replace(
    _SEED_SHAPE,
    d_model=128,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=32,
    d_ff=256,
    vocab_size=512,
    max_seq_len=512,
)

# Presets: the seed's shape, and tiny shapes covering each feature the plugin must get
# right. CPU attention supports head_dim in {32, 64, 80, ...} only (docs/architecture.md §3).
PRESETS: dict[str, TrainConfig] = {
    "seed": _SEED_SHAPE,
    # GQA (2 KV heads for 4 query heads), tied head.
    "tiny": _TINY,
    # MHA, separate lm_head.
    "tiny-mha-untied": replace(_TINY, n_kv_heads=4, tie_embeddings=False),
    # head_dim (64) != d_model / n_heads (32), GQA, untied.
    "tiny-headdim": replace(_TINY, head_dim=64, tie_embeddings=False),
    # A single KV head: TP=2 replicates it.
    "tiny-kv1": replace(_TINY, n_kv_heads=1),
    # ~1.1 GB in bfloat16 (the load benchmark's size); d_model 2048, 12 layers.
    "bench-1b": replace(
        _SEED_SHAPE,
        d_model=2048,
        n_layers=12,
        n_heads=16,
        n_kv_heads=8,
        head_dim=128,
        d_ff=5632,
        vocab_size=32000,
    ),
    # ~1.2 B parameters (2.4 GB in bfloat16): fills a GPU better than the seed's shape.
    "gpu-1b": replace(
        _SEED_SHAPE,
        d_model=2048,
        n_layers=24,
        n_heads=16,
        n_kv_heads=8,
        head_dim=128,
        d_ff=5632,
        vocab_size=32000,
        max_seq_len=4096,
    ),
}

PRESET_NAMES = tuple(PRESETS)


def checkpoint_bytes(name: str) -> int:
    """Bytes of the tensors of `ministream demo --preset NAME`'s model.pt (float32, as written;
    the file adds a few kB of pickle around them)."""
    from ministream.names import raw_shapes

    return 4 * sum(math.prod(shape) for shape in raw_shapes(PRESETS[name]).values())
