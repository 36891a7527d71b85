"""The shard-set format: vLLM's `sharded_state` files plus `ministream_shards.json`.

A shard set is a directory (or S3 prefix) holding, for tensor-parallel size N and
pipeline-parallel size M, each rank's state dict as it is right after `load_weights`, before
`process_weights_after_loading`, under vLLM 0.32's `ShardedStateLoader` default names:
`model-rank-{r}-part-{p}.safetensors` for r in 0..N-1 when M is 1 (`TP_ONLY_PATTERN`),
`model-pp-{s}-tp-{r}-part-{p}.safetensors` for s in 0..M-1 otherwise (`PP_AND_TP_PATTERN`);
then the source model's config and
tokenizer files, `ministream_shards.json` (what it was made for, below) and a
`ministream_manifest.json` over all of it (so `ministream verify` and `ministream upload`
work on shard sets like on converted models).

Every shard file's safetensors header also carries `ministream_model_hash`,
`ministream_tp_size`, `ministream_rank` and (sets made since pipeline parallelism)
`ministream_pp_size`, `ministream_pp_rank`, so a file copied in from another shard set is
caught from its header alone, before any tensor is read.

This module imports nothing heavy: the load guard reads it in every vLLM worker.
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ministream.errors import ShardError
from ministream.member_names import outside_names

SHARDS_META_NAME = "ministream_shards.json"
FORMAT_VERSION = 1
# vLLM 0.32 ShardedStateLoader's default names: TP_ONLY_PATTERN when the pipeline-parallel
# size is 1, PP_AND_TP_PATTERN otherwise (`_get_default_pattern`).
SHARD_PATTERN = "model-rank-{rank}-part-{part}.safetensors"
PP_SHARD_PATTERN = "model-pp-{pp_rank}-tp-{rank}-part-{part}.safetensors"
# Keys in each shard file's safetensors header metadata (rank_header writes them).
HEADER_MODEL_HASH = "ministream_model_hash"
HEADER_TP_SIZE = "ministream_tp_size"
HEADER_RANK = "ministream_rank"
HEADER_PP_SIZE = "ministream_pp_size"
HEADER_PP_RANK = "ministream_pp_rank"
# What a header without the pipeline keys means: sets made before pipeline parallelism.
HEADER_DEFAULTS = {HEADER_PP_SIZE: "1", HEADER_PP_RANK: "0"}
# Load formats that read a shard set (vLLM picks ShardedStateLoader for both).
SHARDED_FORMATS = ("sharded_state", "runai_streamer_sharded")


@dataclass(frozen=True)
class Layout:
    """The parallel layout a shard set is made for: one file set per (pp_rank, tp_rank)."""

    tp: int
    pp: int = 1

    def __str__(self) -> str:
        if self.pp == 1:
            return f"tensor-parallel size {self.tp}"
        return f"tensor-parallel size {self.tp} x pipeline-parallel size {self.pp}"

    @property
    def flags(self) -> str:
        """vLLM's (and `ministream shard`'s) flags for this layout."""
        pp = f" --pipeline-parallel-size {self.pp}" if self.pp > 1 else ""
        return f"--tensor-parallel-size {self.tp}{pp}"

    @property
    def world(self) -> int:
        return self.tp * self.pp

    def ranks(self, world_rank: int) -> tuple[int, int]:
        """(pp_rank, tp_rank) of a global rank: vLLM orders ranks pipeline-major."""
        return divmod(world_rank, self.tp)

    def file_name(self, rank: int, part: int, pp_rank: int = 0) -> str:
        pattern = SHARD_PATTERN if self.pp == 1 else PP_SHARD_PATTERN
        return pattern.format(rank=rank, pp_rank=pp_rank, part=part)


def rank_header(model_hash: str, layout: Layout, pp_rank: int, rank: int) -> dict[str, str]:
    """The metadata each file of rank (pp_rank, rank) carries in its safetensors header: what
    `ministream shard` writes and the load guard expects."""
    return {
        HEADER_MODEL_HASH: model_hash,
        HEADER_TP_SIZE: str(layout.tp),
        HEADER_RANK: str(rank),
        HEADER_PP_SIZE: str(layout.pp),
        HEADER_PP_RANK: str(pp_rank),
    }


def header_rank(metadata: dict[str, str]) -> dict[str, str | None]:
    """The rank_header keys of a file's header metadata (None: absent)."""
    return {
        key: metadata.get(key, HEADER_DEFAULTS.get(key))
        for key in (HEADER_MODEL_HASH, HEADER_TP_SIZE, HEADER_RANK, HEADER_PP_SIZE, HEADER_PP_RANK)
    }


def describe_rank_header(header: dict[str, str | None]) -> str:
    """`model 0123…, tensor-parallel size 2, rank 1[, pipeline-parallel size 2, stage 0]`."""
    pp, pp_rank = header[HEADER_PP_SIZE], header[HEADER_PP_RANK]
    stages = (
        f", pipeline-parallel size {pp}, stage {pp_rank}" if (pp, pp_rank) != ("1", "0") else ""
    )
    return (
        f"model {str(header[HEADER_MODEL_HASH])[:16]}, tensor-parallel size "
        f"{header[HEADER_TP_SIZE]}, rank {header[HEADER_RANK]}{stages}"
    )


def shard_file_name(rank: int, part: int) -> str:
    """A tensor-parallel-only set's file name (pipeline-parallel size 1)."""
    return Layout(rank + 1).file_name(rank, part)


def reshard_command(source: str, layout: Layout, output: str = "NEW_SHARDS") -> str:
    return f"ministream shard --model {source} {layout.flags} --output {output}"


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
    # shard file -> {"rank" (the TP rank), "pp_rank" (absent before pipeline parallelism:
    # 0), "size", "sha256"}
    files: dict[str, dict[str, Any]]
    format_version: int = FORMAT_VERSION

    @property
    def layout(self) -> Layout:
        return Layout(self.tensor_parallel_size, self.pipeline_parallel_size)

    def files_for_rank(self, rank: int, pp_rank: int = 0) -> list[str]:
        return sorted(name for name, meta in self.files.items() if _ranks(meta) == (pp_rank, rank))

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
        layout = info.layout
        try:
            ranks = {_ranks(meta) for meta in info.files.values()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ShardError(
                f"{origin}: a file's rank is missing or not a number ({exc!r})"
            ) from None
        expected = {layout.ranks(r) for r in range(layout.world)}
        if ranks != expected:
            cover = sorted(ranks) if layout.pp > 1 else sorted(r for _, r in ranks)
            raise ShardError(
                f"{origin}: files cover ranks {cover}, expected "
                + (f"0..{layout.tp - 1}" if layout.pp == 1 else f"every (pp, tp) in {layout}")
            )
        named = {n for n, meta in info.files.items() if _is_named_for(layout, n, meta)}
        if named != set(info.files):
            raise ShardError(
                f"{origin}: {', '.join(sorted(set(info.files) - named))} not named as vLLM's "
                f"sharded_state loader looks for a {layout} rank's files"
            )
        return info

    @classmethod
    def load(cls, shard_dir: str | Path) -> ShardSetInfo | None:
        path = Path(shard_dir) / SHARDS_META_NAME
        return cls.parse(path.read_text(), str(path)) if path.is_file() else None


def _ranks(meta: dict[str, Any]) -> tuple[int, int]:
    return int(meta.get("pp_rank", 0)), int(meta["rank"])


def _is_named_for(layout: Layout, name: str, meta: dict[str, Any]) -> bool:
    pp_rank, rank = _ranks(meta)
    head = layout.file_name(rank, 0, pp_rank).removesuffix("0.safetensors")
    part = name.removeprefix(head).removesuffix(".safetensors")
    return name.startswith(head) and part.isdigit()


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
