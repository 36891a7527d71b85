"""`MiniStreamConfig`: the Hugging Face config class of a converted MiniStream directory.

`config.json` (docs/architecture.md §1.2) deserialises into it; `register_auto_config()` makes
`AutoConfig` (and so vLLM) resolve `model_type: "ministream"`.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

from ministream.train_config import HF_NAMES, size_problems

MODEL_TYPE = "ministream"
ARCHITECTURE = "MiniStreamForCausalLM"


class MiniStreamConfig(PretrainedConfig):
    """HF config of a converted MiniStream model (`model_type: "ministream"`)."""

    model_type = MODEL_TYPE

    def __init__(
        self,
        vocab_size: int = 32000,
        hidden_size: int = 768,
        intermediate_size: int = 2048,
        num_hidden_layers: int = 8,
        num_attention_heads: int = 12,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        max_position_embeddings: int = 2048,
        rms_norm_eps: float = 1e-5,
        rope_theta: float = 10000.0,
        rope_scaling: dict[str, Any] | None = None,
        tie_word_embeddings: bool = True,
        bos_token_id: int = 1,
        eos_token_id: int = 2,
        hidden_act: str = "silu",
        attention_bias: bool = False,
        mlp_bias: bool = False,
        **kwargs: Any,
    ) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = (
            num_attention_heads if num_key_value_heads is None else num_key_value_heads
        )
        self.head_dim = hidden_size // num_attention_heads if head_dim is None else head_dim
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.rope_scaling = rope_scaling
        # MiniStream is Llama-shaped: SiLU-gated MLP, no biases. Recorded so that the
        # config also reads as a Llama config (the built-in-Llama oracle relies on it).
        self.hidden_act = hidden_act
        self.attention_bias = attention_bias
        self.mlp_bias = mlp_bias
        # Refused here, when config.json is read, before vLLM allocates a single layer.
        problems = size_problems(
            {key: getattr(self, hf) for key, hf in HF_NAMES.items()}, names=HF_NAMES
        )
        if problems:
            raise ValueError("invalid MiniStream config.json: " + "; ".join(problems))
        kwargs.setdefault("architectures", [ARCHITECTURE])
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )


def register_auto_config() -> None:
    """Make `AutoConfig` resolve `model_type: "ministream"` (idempotent)."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if MODEL_TYPE not in CONFIG_MAPPING:
        AutoConfig.register(MODEL_TYPE, MiniStreamConfig)
