"""`train_config.json`: the training framework's own description of a MiniStream model.

Read exactly as the framework writes it (docs/architecture.md §1.1) and validated; `to_hf()`
gives the Hugging Face config of the converted directory. No heavy imports: the CLI builds its
parser from this module.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ministream.errors import CheckpointError

if TYPE_CHECKING:
    from ministream.config import MiniStreamConfig


# Upper bounds of a config's sizes, checked before anything is allocated (a
# config.json with vocab_size 10^12 or 10^6 layers must be refused, not tried). Each is far
# above any released model (vocab 256k, 126 layers, d_model 16k, d_ff 53k, 1M context).
LIMITS: dict[str, int] = {
    "vocab_size": 1 << 22,
    "d_model": 1 << 16,
    "n_layers": 1 << 10,
    "n_heads": 1 << 10,
    "n_kv_heads": 1 << 10,
    "head_dim": 1 << 10,
    "d_ff": 1 << 20,
    "max_seq_len": 1 << 24,
}
MAX_PARAMETERS = 10**13  # 10 T: the shapes' product, beyond which no host could hold it

# The same bounds under the Hugging Face config.json names (MiniStreamConfig).
HF_NAMES = {
    "vocab_size": "vocab_size",
    "d_model": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "d_ff": "intermediate_size",
    "max_seq_len": "max_position_embeddings",
}


def size_problems(sizes: dict[str, Any], names: dict[str, str] | None = None) -> list[str]:
    """What is wrong with a config's sizes (keys: our names; `names` maps them to the
    names to report, e.g. HF_NAMES): not a positive integer, above LIMITS, or a parameter
    count above MAX_PARAMETERS."""
    shown = names or {k: k for k in LIMITS}
    problems = []
    for key, limit in LIMITS.items():
        value = sizes.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(f"{shown[key]} must be a positive integer, got {value!r}")
        elif value > limit:
            problems.append(f"{shown[key]}={value} is above the limit {limit}")
    if problems:
        return problems
    d, hd, ff = sizes["d_model"], sizes["head_dim"], sizes["d_ff"]
    attention = d * hd * (2 * sizes["n_heads"] + 2 * sizes["n_kv_heads"])
    params = 2 * sizes["vocab_size"] * d + sizes["n_layers"] * (attention + 3 * d * ff)
    if params > MAX_PARAMETERS:
        problems.append(
            f"the shapes imply {params:.3g} parameters, above the limit {MAX_PARAMETERS:.0e}"
        )
    return problems


@dataclass(frozen=True)
class TrainConfig:
    """`train_config.json` of the training framework (its own field names)."""

    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int
    max_seq_len: int
    norm_eps: float
    rope_theta: float
    tie_embeddings: bool
    bos_id: int
    eos_id: int
    rope_scaling: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        problems = size_problems({name: getattr(self, name) for name in LIMITS})
        if not problems and self.n_heads % self.n_kv_heads:
            problems.append(f"n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads})")
        if not self.norm_eps > 0:
            problems.append(f"norm_eps must be > 0, got {self.norm_eps!r}")
        if not self.rope_theta > 0:
            problems.append(f"rope_theta must be > 0, got {self.rope_theta!r}")
        for name in ("bos_id", "eos_id"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 0 <= value < int(self.vocab_size):
                problems.append(f"{name} must be a token id in [0, vocab_size), got {value!r}")
        if problems:
            raise CheckpointError("invalid train_config.json: " + "; ".join(problems))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        required = {f.name for f in fields(cls) if f.name != "rope_scaling"}
        missing = sorted(required - raw.keys())
        unknown = sorted(raw.keys() - known)
        if missing:
            raise CheckpointError(f"train_config.json is missing fields: {', '.join(missing)}")
        if unknown:
            raise CheckpointError(
                f"train_config.json has unknown fields: {', '.join(unknown)} "
                f"(expected only: {', '.join(sorted(known))})"
            )
        return cls(**raw)

    @classmethod
    def load(cls, path: str | Path) -> TrainConfig:
        try:
            raw = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise CheckpointError(f"train config not found: {path}") from None
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"train config {path} is not valid JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise CheckpointError(f"train config {path} must hold a JSON object")
        return cls.from_dict(raw)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if out["rope_scaling"] is None:
            del out["rope_scaling"]
        return out

    @classmethod
    def from_hf(cls, hf: Any) -> TrainConfig:
        """The inverse of `to_hf`: a converted directory's config.json read back as the
        training framework's shape (adapters for it are checked against that)."""
        return cls(
            d_model=hf.hidden_size,
            n_layers=hf.num_hidden_layers,
            n_heads=hf.num_attention_heads,
            n_kv_heads=hf.num_key_value_heads,
            head_dim=hf.head_dim,
            d_ff=hf.intermediate_size,
            vocab_size=hf.vocab_size,
            max_seq_len=hf.max_position_embeddings,
            norm_eps=hf.rms_norm_eps,
            rope_theta=hf.rope_theta,
            tie_embeddings=hf.tie_word_embeddings,
            bos_id=hf.bos_token_id,
            eos_id=hf.eos_token_id,
            rope_scaling=hf.rope_scaling,
        )

    def to_hf(self, torch_dtype: str = "bfloat16") -> MiniStreamConfig:
        from ministream.config import MiniStreamConfig

        return MiniStreamConfig(
            hidden_size=self.d_model,
            num_hidden_layers=self.n_layers,
            num_attention_heads=self.n_heads,
            num_key_value_heads=self.n_kv_heads,
            head_dim=self.head_dim,
            intermediate_size=self.d_ff,
            vocab_size=self.vocab_size,
            max_position_embeddings=self.max_seq_len,
            rms_norm_eps=self.norm_eps,
            rope_theta=self.rope_theta,
            rope_scaling=self.rope_scaling,
            tie_word_embeddings=self.tie_embeddings,
            bos_token_id=self.bos_id,
            eos_token_id=self.eos_id,
            torch_dtype=torch_dtype,
        )
