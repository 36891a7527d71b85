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

import itertools
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ministream.errors import ShardError
from ministream.member_names import outside_names

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
        bad = outside_names(info.files) if isinstance(info.files, dict) else ["files"]
        if bad:
            raise ShardError(
                f"{origin}: names paths outside the shard directory: {', '.join(bad)}; "
                "refusing to read them"
            )
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


MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit on the JSON header
_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "U16": 2, "I16": 2, "F16": 2,
    "BF16": 2, "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8,
}  # fmt: skip


def header_length(first8: bytes) -> int:
    return int.from_bytes(first8[:8], "little")


def checked_header_length(first8: bytes, origin: str, file_size: int | None = None) -> int:
    """The header length a file's first 8 bytes claim, refused before anything that long
    is read or allocated when it is above MAX_HEADER_BYTES or past the end of the file."""
    if len(first8) < 8:
        raise ShardError(f"{origin}: too short to be a safetensors file")
    length = header_length(first8)
    if length > MAX_HEADER_BYTES:
        raise ShardError(
            f"{origin}: safetensors header claims {length} bytes (limit {MAX_HEADER_BYTES}): "
            "corrupt or not a safetensors file"
        )
    if file_size is not None and 8 + length > file_size:
        raise ShardError(
            f"{origin}: safetensors header claims {length} bytes but the file has only "
            f"{file_size - 8} after the length: truncated"
        )
    return length


def parse_safetensors_header(
    prefix: bytes, origin: str, file_size: int | None = None
) -> dict[str, Any]:
    """The JSON header of a safetensors file from its first bytes (8-byte length + JSON),
    with every tensor's data_offsets checked: inside the file (when `file_size` is known),
    the size its dtype and shape imply, and no two tensors overlapping."""
    length = checked_header_length(prefix, origin, file_size)
    if len(prefix) < 8 + length:
        raise ShardError(f"{origin}: truncated or invalid safetensors header")
    try:
        header = json.loads(prefix[8 : 8 + length])
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ShardError(f"{origin}: safetensors header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ShardError(f"{origin}: safetensors header is not a JSON object")
    data_size = None if file_size is None else file_size - 8 - length
    _check_offsets(header, origin, data_size)
    return header


def _check_offsets(header: dict[str, Any], origin: str, data_size: int | None) -> None:
    spans: list[tuple[int, int, str]] = []
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = meta["data_offsets"]
            dtype, shape = meta["dtype"], meta["shape"]
            ok = all(isinstance(v, int) and v >= 0 for v in (begin, end, *shape))
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok or end < begin:
            raise ShardError(f"{origin}: tensor {name!r} has an invalid entry {meta!r}")
        numel = 1
        for dim in shape:
            numel *= dim
        width = _DTYPE_BYTES.get(dtype)
        if width is not None and end - begin != numel * width:
            raise ShardError(
                f"{origin}: tensor {name!r} ({dtype} {shape}) needs {numel * width} bytes, "
                f"its data_offsets span {end - begin}"
            )
        if data_size is not None and end > data_size:
            raise ShardError(
                f"{origin}: tensor {name!r} ends at byte {end} of a {data_size}-byte data "
                "section: truncated or corrupt"
            )
        spans.append((begin, end, name))
    spans.sort()
    for (_, end_a, a), (begin_b, _, b) in itertools.pairwise(spans):
        if begin_b < end_a:
            raise ShardError(f"{origin}: tensors {a!r} and {b!r} overlap (data_offsets)")


def read_local_header(path: Path) -> dict[str, Any]:
    """Read only the header of a local safetensors file (no tensor bytes); the claimed
    header length is checked against the file's size before it is read."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        first8 = f.read(8)
        length = checked_header_length(first8, str(path), size)
        return parse_safetensors_header(first8 + f.read(length), str(path), size)
