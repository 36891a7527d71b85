"""Deterministic demo checkpoints in MiniStream's raw training format.

`write_demo_checkpoint(preset, out_dir)` writes `model.pt` (a training-style dict with the
state dict under "model"), `train_config.json` and a `tokenizer/` directory holding a
byte-level BPE tokenizer trained here with the `tokenizers` library on a synthetic corpus.
Same preset and seed, same bytes (for one torch version).

`write_demo_adapter(base_dir, out, rank=..., targets=...)` writes a random LoRA adapter
(`adapter.pt`, the training framework's format) for a converted model: tests, the load test
and demos make adapters of any rank and targets with it (`ministream demo-lora`).

Weights are random but scaled so that logits are well separated (greedy decoding is then a
stable test signal in bfloat16 too): linear layers ~ N(0, 1/fan_in), embeddings with RMS
3/sqrt(d_model), norm weights around 1.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from ministream.names import raw_shapes
from ministream.output_dir import make_world_readable
from ministream.presets import PRESETS
from ministream.train_config import TrainConfig

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def random_state_dict(cfg: TrainConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name, shape in raw_shapes(cfg).items():
        if len(shape) == 1:  # RMSNorm weights
            tensor = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif name in ("embedding.weight", "lm_head.weight"):
            tensor = torch.randn(shape, generator=gen) * (3.0 / cfg.d_model**0.5)
        else:
            tensor = torch.randn(shape, generator=gen) / shape[1] ** 0.5
        state[name] = tensor
    return state


# Common English words, and a few of the serving domain's, in a fixed order: the corpus draws
# from them by index, so reordering them changes the demo tokenizer.
# fmt: off
_COMMON_WORDS = (
    "the", "of", "and", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on", "are",
    "as", "with", "his", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by",
    "word", "but", "not", "what", "all", "were", "we", "when", "your", "can", "said", "there",
    "use", "an", "each", "which", "she", "do", "how", "their", "if", "will", "up", "other",
    "about", "out", "many", "then", "them", "these", "so", "some", "her", "would", "make",
    "like", "him", "into", "time", "has", "look", "two", "more", "write", "go", "see", "number",
    "no", "way", "could", "people", "my", "than", "first", "water", "been", "call", "who",
    "oil", "its", "now", "find", "long", "down", "day", "did", "get", "come", "made", "may",
    "part", "model", "stream", "token", "serve", "request", "latency", "cluster", "tensor",
    "parallel", "weight", "shard", "warmup", "ready", "drain",
)
# fmt: on


def _corpus(seed: int, n_words: int) -> Iterator[str]:
    """Synthetic text: common English words and pronounceable pseudo-words."""
    rng = random.Random(seed)
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"] + ["th", "ch", "sh", "ing"]
    for _ in range(n_words // 12):
        words = []
        for _ in range(12):
            if rng.random() < 0.6:
                words.append(rng.choice(_COMMON_WORDS))
            else:
                words.append("".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))))
        yield " ".join(words).capitalize() + rng.choice([".", ".", "?", "!", ","])


def train_tokenizer(vocab_size: int, out_dir: Path, seed: int = 0) -> None:
    """Train a byte-level BPE of exactly `vocab_size` tokens and save HF tokenizer files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(seed, n_words=min(60 * vocab_size, 400_000)), trainer)
    # A small corpus may learn fewer merges than the model's vocabulary; fill the rest with
    # reserved tokens so that every id the model can emit decodes.
    missing = vocab_size - tok.get_vocab_size()
    if missing > 0:
        tok.add_special_tokens([f"<|reserved_{i}|>" for i in range(missing)])
    assert tok.get_vocab_size() == vocab_size, (tok.get_vocab_size(), vocab_size)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "add_bos_token": False,
                "model_max_length": 1_000_000,
                "clean_up_tokenization_spaces": False,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
        + "\n"
    )
    (out_dir / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, indent=2) + "\n"
    )


# The files `write_demo_checkpoint` writes, as `ministream convert` takes them.
CHECKPOINT, TRAIN_CONFIG, TOKENIZER = "model.pt", "train_config.json", "tokenizer"


def convert_argv(raw: Path, output: Path) -> list[str]:
    """`ministream convert`'s arguments for the demo checkpoint in `raw`, into `output`."""
    return [
        "convert",
        *("--checkpoint", str(raw / CHECKPOINT), "--train-config", str(raw / TRAIN_CONFIG)),
        *("--tokenizer", str(raw / TOKENIZER), "--output", str(output)),
    ]


def write_demo_checkpoint(
    preset: str, out_dir: str | Path, seed: int = 0, config: TrainConfig | None = None
) -> Path:
    """Write `model.pt`, `train_config.json`, `tokenizer/` under `out_dir` (atomically)."""
    if config is None:
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
        config = PRESETS[preset]
    out = Path(out_dir)
    if out.exists():
        raise FileExistsError(f"{out} already exists; remove it or choose another --output")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        torch.save(
            {"model": random_state_dict(config, seed), "step": 0, "optimizer": {"lr": 0.0}},
            tmp / CHECKPOINT,
        )
        (tmp / TRAIN_CONFIG).write_text(json.dumps(config.to_dict(), indent=2) + "\n")
        train_tokenizer(config.vocab_size, tmp / TOKENIZER, seed)
        make_world_readable(tmp)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def random_adapter(
    cfg: TrainConfig,
    *,
    rank: int,
    targets: Sequence[str],
    alpha: float | None = None,
    seed: int = 0,
    layers: Sequence[int] | None = None,
    strength: float = 0.5,
    base_model_hash: str | None = None,
) -> dict[str, Any]:
    """A random LoRA adapter in the training framework's format (docs/plugin.md, LoRA).

    Scaled so that `(alpha / rank) · B @ A` has entries about `strength` times those of the
    base matrices (~1/sqrt(in_features), `random_state_dict`): the adapter visibly changes
    greedy outputs, which is what a test of "this request got that adapter" needs."""
    from ministream.names import LORA_TARGETS, lora_targets

    unknown = sorted(set(targets) - set(LORA_TARGETS))
    if unknown or not targets:
        raise ValueError(
            f"targets must be a non-empty subset of {', '.join(LORA_TARGETS)}; got {list(targets)}"
        )
    alpha = float(rank if alpha is None else alpha)
    gen = torch.Generator().manual_seed(seed)
    lora: dict[str, torch.Tensor] = {}
    for (layer, target), info in lora_targets(cfg).items():
        if target not in targets or (layers is not None and layer not in layers):
            continue
        out_features, in_features = info.shape
        prefix = f"blocks.{layer}.{target}"
        lora[f"{prefix}.lora_A"] = torch.randn(rank, in_features, generator=gen) / in_features**0.5
        lora[f"{prefix}.lora_B"] = (
            torch.randn(out_features, rank, generator=gen) * strength * (rank / alpha) / rank**0.5
        )
    adapter: dict[str, Any] = {
        "lora_config": {"r": rank, "alpha": alpha, "targets": list(targets)},
        "lora": lora,
    }
    if base_model_hash is not None:
        adapter["base_model_hash"] = base_model_hash
    return adapter


def write_demo_adapter(
    base: str | Path,
    out: str | Path,
    *,
    rank: int,
    targets: Sequence[str],
    alpha: float | None = None,
    seed: int = 0,
) -> Path:
    """Write a random `adapter.pt` for the converted model directory `base` (its shape from
    config.json, `base_model_hash` from its manifest), atomically."""
    from ministream.lora_convert import read_base

    cfg, model_hash = read_base(base)
    adapter = random_adapter(
        cfg, rank=rank, targets=targets, alpha=alpha, seed=seed, base_model_hash=model_hash
    )
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out} already exists; remove it or choose another --output")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.tmp-", dir=out.parent)
    os.close(fd)
    try:
        torch.save(adapter, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out
