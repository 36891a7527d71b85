"""Reference MiniStream in plain PyTorch: the numerics every other path is checked against.

Written straight from the semantics in docs/architecture.md §1.1, sharing no code with the
vLLM model: pre-norm residual blocks, float32 RMSNorm, NeoX RoPE over the whole head_dim, causal GQA
attention scaled by 1/sqrt(head_dim), SiLU-gated MLP, tied or separate head.

It runs a converted directory (`from_pretrained`) or a raw training checkpoint
(`from_raw`, split in memory through the shared name table), and can record every layer's
hidden state to find where two implementations diverge (`ministream reference --dump`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from ministream.checkpoint import load_raw_state_dict
from ministream.config import MiniStreamConfig
from ministream.errors import CheckpointError
from ministream.names import conversion_plan
from ministream.train_config import TrainConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def _rope_cos_sin(
    cfg: MiniStreamConfig, positions: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    hd = cfg.head_dim
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    pos = positions.double()
    if kind == "linear":
        pos = pos / float(scaling["factor"])
    elif kind != "default":
        raise NotImplementedError(f"reference model: rope_scaling type {kind!r}")
    inv_freq = 1.0 / (
        cfg.rope_theta
        ** (torch.arange(0, hd, 2, dtype=torch.float64, device=positions.device) / hd)
    )
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: MiniStreamConfig) -> None:
        super().__init__()
        self.cfg = cfg
        nh, nkv, hd, d = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            cfg.hidden_size,
        )
        self.q_proj = nn.Linear(d, nh * hd, bias=False)
        self.k_proj = nn.Linear(d, nkv * hd, bias=False)
        self.v_proj = nn.Linear(d, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        t = x.shape[0]
        nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        q = self.q_proj(x).view(t, nh, hd).transpose(0, 1)
        k = self.k_proj(x).view(t, nkv, hd).transpose(0, 1)
        v = self.v_proj(x).view(t, nkv, hd).transpose(0, 1)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        group = nh // nkv
        k = k.repeat_interleave(group, dim=0)
        v = v.repeat_interleave(group, dim=0)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.float().masked_fill(mask, float("-inf"))
        out = torch.softmax(scores, dim=-1).to(v.dtype) @ v
        return self.o_proj(out.transpose(0, 1).reshape(t, nh * hd))


class MLP(nn.Module):
    def __init__(self, cfg: MiniStreamConfig) -> None:
        super().__init__()
        d, ff = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(d, ff, bias=False)
        self.up_proj = nn.Linear(d, ff, bias=False)
        self.down_proj = nn.Linear(ff, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: MiniStreamConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    def __init__(self, cfg: MiniStreamConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class ReferenceMiniStream(nn.Module):
    """Parameter names are the converted (HF/Llama) names, so `load_state_dict` is strict."""

    def __init__(self, cfg: MiniStreamConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Body(cfg)
        self.lm_head = (
            None
            if cfg.tie_word_embeddings
            else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        )

    @torch.no_grad()
    def forward(
        self, input_ids: torch.Tensor, hidden_states: list[torch.Tensor] | None = None
    ) -> torch.Tensor:
        """Logits [T, V] (float32) for one sequence; appends per-layer states if asked."""
        positions = torch.arange(input_ids.shape[0], device=input_ids.device)
        x = self.model.embed_tokens(input_ids)
        cos, sin = _rope_cos_sin(self.cfg, positions, x.dtype)
        if hidden_states is not None:
            hidden_states.append(x.float())
        for layer in self.model.layers:
            x = layer(x, cos, sin)
            if hidden_states is not None:
                hidden_states.append(x.float())
        x = self.model.norm(x)
        if hidden_states is not None:
            hidden_states.append(x.float())
        head = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return (x @ head.t()).float()

    @torch.no_grad()
    def generate_greedy(
        self, prompt_ids: list[int], max_new_tokens: int, top_k: int = 5
    ) -> tuple[list[int], list[dict[int, float]]]:
        """Greedy continuation and each step's top-k logprobs (full re-forward; small models)."""
        ids = list(prompt_ids)
        out: list[int] = []
        logprobs: list[dict[int, float]] = []
        device = self.model.embed_tokens.weight.device
        for _ in range(max_new_tokens):
            logits = self.forward(torch.tensor(ids, device=device))[-1]
            lp = torch.log_softmax(logits, dim=-1)
            top = torch.topk(lp, top_k)
            pairs = zip(top.values, top.indices, strict=True)
            logprobs.append({int(i): float(v) for v, i in pairs})
            nxt = int(torch.argmax(logits))
            out.append(nxt)
            ids.append(nxt)
            if nxt == self.cfg.eos_token_id:
                break
        return out, logprobs

    @classmethod
    def from_state_dict(
        cls,
        cfg: MiniStreamConfig,
        state: dict[str, torch.Tensor],
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
    ) -> ReferenceMiniStream:
        model = cls(cfg)
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise CheckpointError(
                f"reference model: missing {sorted(missing)}, unexpected {sorted(unexpected)}"
            )
        return model.to(device=device, dtype=dtype).eval()

    @classmethod
    def from_pretrained(
        cls, model_dir: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu"
    ) -> ReferenceMiniStream:
        """Load a converted directory (config.json + safetensors shards)."""
        model_dir = Path(model_dir)
        cfg = MiniStreamConfig.from_json_file(str(model_dir / "config.json"))
        index = model_dir / "model.safetensors.index.json"
        files = (
            sorted(set(json.loads(index.read_text())["weight_map"].values()))
            if index.exists()
            else ["model.safetensors"]
        )
        state: dict[str, torch.Tensor] = {}
        for name in files:
            state.update(load_file(str(model_dir / name)))
        return cls.from_state_dict(cfg, state, dtype, device)

    @classmethod
    def from_raw(
        cls, checkpoint: str | Path, train_config: str | Path, dtype: torch.dtype = torch.float32
    ) -> ReferenceMiniStream:
        """Run a raw training checkpoint directly (fused matrices split in memory)."""
        tcfg = TrainConfig.load(train_config)
        raw = load_raw_state_dict(checkpoint)
        state = {
            s.hf: raw[name][s.start : s.stop]
            for name, _, slices in conversion_plan(tcfg)
            for s in slices
        }
        return cls.from_state_dict(tcfg.to_hf(), state, dtype)


def dump_hidden_states(model: ReferenceMiniStream, input_ids: list[int], path: str | Path) -> None:
    """Save `{"embeddings", "layer_0" ..., "final_norm", "logits"}` for a divergence hunt."""
    states: list[torch.Tensor] = []
    device = model.model.embed_tokens.weight.device
    logits = model.forward(torch.tensor(input_ids, device=device), hidden_states=states)
    names = ["embeddings", *(f"layer_{i}" for i in range(len(states) - 2)), "final_norm"]
    out = dict(zip(names, states, strict=True))
    out["logits"] = logits
    out["input_ids"] = torch.tensor(input_ids)
    out = {k: v.cpu() for k, v in out.items()}
    torch.save(out, path)
