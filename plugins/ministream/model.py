"""MiniStream for vLLM: a Llama-shaped decoder built from vLLM's tensor-parallel layers.

The plugin's `register()` imports this module and registers the class itself (why not a lazy
`"module:Class"` string: `ministream/__init__.py`). Nothing here touches a device at import.

Tensor parallelism: q/k/v are one `QKVParallelLinear` (KV heads are replicated when the TP
size exceeds their count), gate/up one `MergedColumnParallelLinear`; o/down are
`RowParallelLinear`. Any TP size that divides `num_attention_heads` works, with either
`num_key_value_heads % tp == 0` or `tp % num_key_value_heads == 0`.
Pipeline parallelism follows vLLM's Llama: `make_layers` + `PPMissingLayer` + intermediate
tensors carrying `hidden_states` and `residual`.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice
from typing import ClassVar

import torch
from torch import nn
from vllm.compilation.decorators import support_torch_compile
from vllm.config import CacheConfig, VllmConfig
from vllm.distributed import (
    get_pp_group,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
)
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.quantization import QuantizationConfig
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from vllm.model_executor.model_loader.weight_utils import (
    default_weight_loader,
    maybe_remap_kv_scale_name,
)
from vllm.model_executor.models.interfaces import SupportsLoRA, SupportsPP, SupportsQuant
from vllm.model_executor.models.utils import (
    PPMissingLayer,
    is_pp_missing_parameter,
    make_empty_intermediate_tensors_factory,
    make_layers,
    maybe_prefix,
)
from vllm.sequence import IntermediateTensors

from ministream.compat import Attention, make_rope
from ministream.config import MiniStreamConfig
from ministream.errors import CheckpointError
from ministream.load_guard import check_before_load
from ministream.names import STACKED_PARAMS_MAPPING


class MiniStreamMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), gate and up fused into one column-parallel matmul."""

    def __init__(
        self, *, config: MiniStreamConfig, quant_config: QuantizationConfig | None, prefix: str = ""
    ) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            input_size=config.hidden_size,
            output_sizes=[config.intermediate_size] * 2,
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.gate_up_proj",
        )
        self.down_proj = RowParallelLinear(
            input_size=config.intermediate_size,
            output_size=config.hidden_size,
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.down_proj",
        )
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up, _ = self.gate_up_proj(x)
        out, _ = self.down_proj(self.act_fn(gate_up))
        return out


class MiniStreamAttention(nn.Module):
    """Causal GQA self-attention with NeoX RoPE, scaled by 1/sqrt(head_dim)."""

    def __init__(
        self,
        *,
        config: MiniStreamConfig,
        cache_config: CacheConfig | None,
        quant_config: QuantizationConfig | None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        tp_size = get_tensor_model_parallel_world_size()
        self.total_num_heads = config.num_attention_heads
        self.total_num_kv_heads = config.num_key_value_heads
        if self.total_num_heads % tp_size:
            raise ValueError(
                f"tensor-parallel size {tp_size} must divide num_attention_heads "
                f"({self.total_num_heads})"
            )
        if self.total_num_kv_heads % tp_size and tp_size % self.total_num_kv_heads:
            raise ValueError(
                f"num_key_value_heads ({self.total_num_kv_heads}) and tensor-parallel size "
                f"{tp_size}: one must divide the other"
            )
        self.num_heads = self.total_num_heads // tp_size
        # tp > n_kv_heads: each rank holds one replicated KV head.
        self.num_kv_heads = max(1, self.total_num_kv_heads // tp_size)
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim

        self.qkv_proj = QKVParallelLinear(
            hidden_size=config.hidden_size,
            head_size=self.head_dim,
            total_num_heads=self.total_num_heads,
            total_num_kv_heads=self.total_num_kv_heads,
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.qkv_proj",
        )
        self.o_proj = RowParallelLinear(
            input_size=self.total_num_heads * self.head_dim,
            output_size=config.hidden_size,
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.o_proj",
        )
        self.rotary_emb = make_rope(config, self.head_dim)
        self.attn = Attention(
            self.num_heads,
            self.head_dim,
            self.head_dim**-0.5,
            num_kv_heads=self.num_kv_heads,
            cache_config=cache_config,
            quant_config=quant_config,
            prefix=f"{prefix}.attn",
        )

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        out, _ = self.o_proj(self.attn(q, k, v))
        return out


class MiniStreamDecoderLayer(nn.Module):
    """Pre-norm residual block; vLLM's fused add-RMSNorm carries the residual."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        quant_config = vllm_config.quant_config
        self.self_attn = MiniStreamAttention(
            config=config,
            cache_config=vllm_config.cache_config,
            quant_config=quant_config,
            prefix=f"{prefix}.self_attn",
        )
        self.mlp = MiniStreamMLP(config=config, quant_config=quant_config, prefix=f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


@support_torch_compile(
    dynamic_arg_dims={"input_ids": 0, "positions": 0, "intermediate_tensors": 0, "inputs_embeds": 0}
)
class MiniStreamModel(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        pp = get_pp_group()
        if pp.is_first_rank or (config.tie_word_embeddings and pp.is_last_rank):
            self.embed_tokens = VocabParallelEmbedding(
                config.vocab_size,
                config.hidden_size,
                quant_config=vllm_config.quant_config,
                prefix=f"{prefix}.embed_tokens",
            )
        else:
            self.embed_tokens = PPMissingLayer()
        self.start_layer, self.end_layer, self.layers = make_layers(
            config.num_hidden_layers,
            lambda prefix: MiniStreamDecoderLayer(vllm_config=vllm_config, prefix=prefix),
            prefix=f"{prefix}.layers",
        )
        self.norm = (
            RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            if pp.is_last_rank
            else PPMissingLayer()
        )
        self.make_empty_intermediate_tensors = make_empty_intermediate_tensors_factory(
            ["hidden_states", "residual"], config.hidden_size
        )

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        if get_pp_group().is_first_rank:
            hidden_states = (
                inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
            )
            residual = None
        else:
            assert intermediate_tensors is not None
            hidden_states = intermediate_tensors["hidden_states"]
            residual = intermediate_tensors["residual"]
        for layer in islice(self.layers, self.start_layer, self.end_layer):
            hidden_states, residual = layer(positions, hidden_states, residual)
        if not get_pp_group().is_last_rank:
            return IntermediateTensors({"hidden_states": hidden_states, "residual": residual})
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class MiniStreamForCausalLM(nn.Module, SupportsLoRA, SupportsPP, SupportsQuant):
    # LoRA (and quantization) find the fused layers' parts by these names: an adapter's
    # q_proj/k_proj/v_proj LoRAs are packed into qkv_proj, gate_proj/up_proj into
    # gate_up_proj (`ministream convert-lora` writes them so; docs/plugin.md).
    packed_modules_mapping: ClassVar[dict[str, list[str]]] = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }
    embedding_modules: ClassVar[dict[str, str]] = {
        "embed_tokens": "input_embeddings",
        "lm_head": "output_embeddings",
    }

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        # Shard set vs TP size/model, incomplete uploads, stray weights: fail before any
        # weight is read (vLLM 0.32 checks none of these; see load_guard).
        check_before_load(
            vllm_config, get_tensor_model_parallel_rank(), get_pp_group().rank_in_group
        )
        config = vllm_config.model_config.hf_config
        self.config = config
        self.quant_config = vllm_config.quant_config
        self.model = MiniStreamModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        if get_pp_group().is_last_rank:
            self.lm_head = ParallelLMHead(
                config.vocab_size,
                config.hidden_size,
                quant_config=self.quant_config,
                prefix=maybe_prefix(prefix, "lm_head"),
            )
            if config.tie_word_embeddings:
                self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
            self.logits_processor = LogitsProcessor(config.vocab_size)
        else:
            self.lm_head = PPMissingLayer()
        self.make_empty_intermediate_tensors = self.model.make_empty_intermediate_tensors

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load HF-named tensors; fail on any unexpected or missing tensor.

        vLLM 0.32's default loader does not notice an absent linear-layer weight of an
        unquantized model (it serves uninitialised memory), so coverage is proven here:
        every parameter this rank owns must have been written by a checkpoint tensor.
        """
        params = dict(self.named_parameters())
        if self.quant_config is not None:
            weights = self._map_cache_scales(weights)
        loaded: set[str] = set()
        shards: dict[str, set[str | int]] = {}
        unexpected: list[str] = []
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if self.config.tie_word_embeddings and name == "lm_head.weight":
                # Some exporters write the tied head anyway; the embedding is the source.
                continue
            for param_name, hf_name, shard_id in STACKED_PARAMS_MAPPING:
                if hf_name not in name:
                    continue
                target = name.replace(hf_name, param_name)
                if is_pp_missing_parameter(target, self):
                    break
                if target not in params:
                    unexpected.append(name)
                    break
                param = params[target]
                param.weight_loader(param, tensor, shard_id)
                shards.setdefault(target, set()).add(shard_id)
                break
            else:
                remapped = maybe_remap_kv_scale_name(name, params)
                if remapped is None or is_pp_missing_parameter(remapped, self):
                    continue
                if remapped not in params:
                    unexpected.append(name)
                    continue
                param = params[remapped]
                getattr(param, "weight_loader", default_weight_loader)(param, tensor)
                loaded.add(remapped)
        # A fused parameter is loaded only when every one of its shards arrived.
        for target, got in shards.items():
            wanted = {sid for fused, _, sid in STACKED_PARAMS_MAPPING if fused in target}
            if got == wanted:
                loaded.add(target)
        problems = [*self._unexpected_problem(unexpected), *self._coverage_problem(params, loaded)]
        if problems:  # both kinds at once: a wrong checkpoint usually has both
            raise CheckpointError(" ".join(problems))
        return loaded

    @staticmethod
    def _unexpected_problem(unexpected: list[str]) -> list[str]:
        if not unexpected:
            return []
        return [
            f"checkpoint has {len(unexpected)} tensor(s) that MiniStream does not have: "
            f"{', '.join(sorted(unexpected)[:10])}. Re-convert it with `ministream convert`."
        ]

    def _map_cache_scales(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterable[tuple[str, torch.Tensor]]:
        """Checkpoint KV-cache scale names -> vLLM's, as the quant config defines them.

        vLLM 0.25 and 0.32 give a whole-stream `get_cache_scale_mapper()` (their Llama
        applies it through AutoWeightsLoader); older releases had a per-name
        `get_cache_scale()`. Calling the old one on 0.25.1 failed every quantized load
        (`--quantization fp8`, H200).
        """
        quant_config = self.quant_config
        mapper = getattr(quant_config, "get_cache_scale_mapper", None)
        if mapper is not None:
            return mapper().apply(weights)
        per_name = quant_config.get_cache_scale
        return ((per_name(name) or name, tensor) for name, tensor in weights)

    def _coverage_problem(self, params: dict[str, nn.Parameter], loaded: set[str]) -> list[str]:
        # KV-cache scales of the attention layers have defaults; every other parameter
        # must come from the checkpoint.
        missing = sorted(
            name
            for name in params
            if name not in loaded
            and not is_pp_missing_parameter(name, self)
            and ".attn." not in name
        )
        if not missing:
            return []
        return [
            f"checkpoint is missing {len(missing)} weight(s): "
            f"{', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}. "
            "The model directory is incomplete; re-run `ministream convert` "
            "(or re-upload it) and check its manifest with `ministream verify`."
        ]
