"""The shard-set format: vLLM's `sharded_state` files plus `ministream_shards.json`.

A shard set is a directory (or S3 prefix) holding, for tensor-parallel size N,
`model-rank-{r}-part-{p}.safetensors` for r in 0..N-1 (vLLM 0.32
`ShardedStateLoader.TP_ONLY_PATTERN`: each rank's state dict as it is right after
`load_weights`, before `process_weights_after_loading`), the source model's config and
tokenizer files, `ministream_shards.json` (what it was made for, below) and a
`ministream_manifest.json` over all of it (so `ministream verify` and `ministream upload`
work on shard sets like on converted models).

Every shard file's safetensors header also carries `ministream_model_hash`,
`ministream_tp_size` and `ministream_rank`, so a file copied in from another shard set is
caught from its header alone, before any tensor is read.

This module imports nothing heavy: the load guard reads it in every vLLM worker.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ministream.errors import ShardError

SHARDS_META_NAME = "ministream_shards.json"
FORMAT_VERSION = 1
# vLLM 0.32 ShardedStateLoader.TP_ONLY_PATTERN (pipeline parallel size 1).
SHARD_PATTERN = "model-rank-{rank}-part-{part}.safetensors"
SHARD_FILE_RE = re.compile(r"^model-rank-(\d+)-part-(\d+)\.safetensors$")
# Keys in each shard file's safetensors header metadata.
HEADER_MODEL_HASH = "ministream_model_hash"
HEADER_TP_SIZE = "ministream_tp_size"
HEADER_RANK = "ministream_rank"
# Load formats that read a shard set (vLLM picks ShardedStateLoader for both).
SHARDED_FORMATS = ("sharded_state", "runai_streamer_sharded")


def shard_file_name(rank: int, part: int) -> str:
    return SHARD_PATTERN.format(rank=rank, part=part)


def reshard_command(source: str, tp: int, output: str = "NEW_SHARDS") -> str:
    return f"ministream shard --model {source} --tensor-parallel-size {tp} --output {output}"


@dataclass(frozen=True)
class ShardSetInfo:
    """Contents of `ministream_shards.json`."""

    tensor_parallel_size: int
    pipeline_parallel_size: int
    source_model_hash: str  # model_hash of the converted model the shards were made from
    source: str  # where it was read from (a path or s3:// URL), for re-shard hints
    config_sha256: str  # sha256 of the config.json copied beside the shards
    dtype: str
    vllm_version: str
    ministream_version: str
    files: dict[str, dict[str, Any]]  # shard file -> {"rank", "size", "sha256"}
    format_version: int = FORMAT_VERSION

    def files_for_rank(self, rank: int) -> list[str]:
        return sorted(name for name, meta in self.files.items() if meta["rank"] == rank)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def parse(cls, text: str, origin: str) -> ShardSetInfo:
        try:
            raw = json.loads(text)
            info = cls(**raw)
        except (json.JSONDecodeError, TypeError) as exc:
            raise ShardError(f"{origin}: not a valid {SHARDS_META_NAME} ({exc})") from None
        if info.format_version != FORMAT_VERSION:
            raise ShardError(
                f"{origin}: shard-set format {info.format_version} is not "
                f"supported (this plugin reads format {FORMAT_VERSION})"
            )
        ranks = {meta["rank"] for meta in info.files.values()}
        if ranks != set(range(info.tensor_parallel_size)):
            raise ShardError(
                f"{origin}: files cover ranks {sorted(ranks)}, expected "
                f"0..{info.tensor_parallel_size - 1}"
            )
        return info

    @classmethod
    def load(cls, shard_dir: str | Path) -> ShardSetInfo | None:
        path = Path(shard_dir) / SHARDS_META_NAME
        return cls.parse(path.read_text(), str(path)) if path.is_file() else None


def parse_safetensors_header(prefix: bytes, origin: str) -> dict[str, Any]:
    """The JSON header of a safetensors file from its first bytes (8-byte length + JSON)."""
    if len(prefix) < 8:
        raise ShardError(f"{origin}: too short to be a safetensors file")
    length = int.from_bytes(prefix[:8], "little")
    if length > 100_000_000 or len(prefix) < 8 + length:
        raise ShardError(f"{origin}: truncated or invalid safetensors header")
    header: dict[str, Any] = json.loads(prefix[8 : 8 + length])
    return header


def header_length(first8: bytes) -> int:
    return int.from_bytes(first8[:8], "little")


def read_local_header(path: Path) -> dict[str, Any]:
    """Read only the header of a local safetensors file (no tensor bytes)."""
    with open(path, "rb") as f:
        first8 = f.read(8)
        return parse_safetensors_header(first8 + f.read(header_length(first8)), str(path))
