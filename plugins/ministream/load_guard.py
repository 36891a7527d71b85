"""Checks of the model's location that run before vLLM reads any weight.

vLLM 0.32 itself does not notice that a `sharded_state` set was made for another
tensor-parallel size (TP=2 shards at TP=1 only warn, then serve garbage), that the files
come from another model, that an object vanished from the middle of an uploaded model, or
that stray `*.safetensors` sit under a prefix (the Run:ai streamer loads every one of
them). `check_before_load` looks only at file listings, small JSON files and safetensors
headers, so a bad location fails within seconds, with a message that says what to run, and
serves nothing. It runs first in the API server, when vLLM builds its config and before it
starts the engine core (`EngineStartCheck`, registered by the plugin): a failing start ends
after the imports, not after the engine core's and workers' starts. It runs again in each
worker from `MiniStreamForCausalLM.__init__` (offline `vllm.LLM` included), which also reads
the headers of that rank's own shard files.

- sharded formats (`sharded_state`, `runai_streamer_sharded`): `ministream_shards.json`
  must exist and match the engine's TP/PP sizes; the shard files must be exactly the listed
  ones; this rank's file headers must carry the same model hash; `config.json` must be the
  one the shards were made from.
- whole-model formats (`auto`, `safetensors`, `runai_streamer`): when the location has a
  `ministream_manifest.json` (always on S3: `ministream upload` writes it last, so its
  absence means an unfinished upload), the `*.safetensors` present must be exactly those
  it lists, at the listed sizes.
- `MINISTREAM_MODEL_HASH` (optional; the Helm chart sets it from `model.hash`): the model hash (or a
  prefix of at least 12 hex digits) the deployment expects; a model or shard set made from
  any other model is refused.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from ministream.errors import CheckpointError, ShardError, StorageError
from ministream.manifest import MANIFEST_NAME, Manifest
from ministream.shardset import (
    SHARDED_FORMATS,
    SHARDS_META_NAME,
    Layout,
    ShardSetInfo,
    checked_header_length,
    describe_rank_header,
    header_rank,
    parse_safetensors_header,
    rank_header,
    read_local_header,
    reshard_command,
)

WHOLE_MODEL_FORMATS = ("auto", "safetensors", "runai_streamer")
PIN_ENV = "MINISTREAM_MODEL_HASH"


def pinned_hash() -> str | None:
    pinned = os.environ.get(PIN_ENV, "").strip().lower()
    if pinned and len(pinned) < 12:
        raise CheckpointError(
            f"{PIN_ENV}={pinned!r} is too short: give at least 12 hex digits "
            "of the model hash (`ministream verify DIR` prints it)"
        )
    return pinned or None


def _check_pin(model_hash: str, what: str) -> None:
    pinned = pinned_hash()
    if pinned is not None and not model_hash.startswith(pinned):
        raise ShardError(
            f"{what} was made from model {model_hash[:16]}, but this deployment expects model "
            f"{pinned[:16]} ({PIN_ENV}). Point it at that model's files, or update {PIN_ENV}."
        )


class Location:
    """A local directory or an S3 prefix, seen through the few reads the guard needs."""

    def __init__(self, where: str) -> None:
        from ministream.s3 import is_s3

        self.where = where.rstrip("/")
        self.is_s3 = is_s3(where)
        self._client: Any = None
        if self.is_s3:
            from ministream.s3 import make_client, parse_url

            self.url = parse_url(where)
            self._client = make_client(4)
        elif not Path(where).is_dir():
            raise CheckpointError(f"{where} is not a directory")

    def sizes(self) -> dict[str, int]:
        """Top-level files and their sizes (vLLM's loaders do not recurse either)."""
        if self.is_s3:
            from ministream.s3 import list_objects

            return {
                name: obj.size
                for name, obj in list_objects(self._client, self.url).items()
                if "/" not in name
            }
        return {p.name: p.stat().st_size for p in Path(self.where).iterdir() if p.is_file()}

    def read_text(self, name: str) -> str | None:
        if self.is_s3:
            from ministream.s3 import read_text

            return read_text(self._client, self.url, name)
        path = Path(self.where) / name
        return path.read_text() if path.is_file() else None

    def header(self, name: str, size: int | None = None) -> dict[str, Any]:
        """The safetensors header of `name`; with `size` (an S3 listing's), its offsets are
        checked against the object's length too (a truncated object is refused)."""
        if not self.is_s3:
            return read_local_header(Path(self.where) / name)
        from ministream.s3 import read_bytes

        origin = f"{self.where}/{name}"
        first8 = read_bytes(self._client, self.url, name, "bytes=0-7") or b""
        # The claimed length is bounded before it becomes a range request.
        length = checked_header_length(first8, origin, size)
        rest = read_bytes(self._client, self.url, name, f"bytes=8-{7 + length}") or b""
        return parse_safetensors_header(first8 + rest, origin, size)


def check_before_load(vllm_config: Any, rank: int | None = None, pp_rank: int = 0) -> None:
    """Entry point. Called twice: once in the API server when vLLM builds its config, before
    any engine process starts (`EngineStartCheck`, `rank=None`), so that a bad location fails
    in the time of the imports instead of after the engine core and its workers started;
    then from `MiniStreamForCausalLM.__init__` in each worker, with its TP and PP ranks,
    which also checks the headers of that rank's shard files."""
    load_format = str(
        getattr(vllm_config.load_config.load_format, "value", vllm_config.load_config.load_format)
    )
    model_config = vllm_config.model_config
    weights = model_config.model_weights or model_config.model
    parallel = vllm_config.parallel_config
    if load_format in SHARDED_FORMATS:
        check_shard_set(
            weights,
            Path(model_config.model),
            Layout(parallel.tensor_parallel_size, parallel.pipeline_parallel_size),
            None if rank is None else (pp_rank, rank),
            str(model_config.dtype).removeprefix("torch."),
        )
    elif load_format in WHOLE_MODEL_FORMATS:
        check_model_files(weights, load_format)


def check_shard_set(
    weights: str,
    config_dir: Path,
    layout: Layout,
    ranks: tuple[int, int] | None,
    dtype: str | None = None,
) -> None:
    """`ranks` is a worker's (pp_rank, tp_rank); None (the engine-start check): everything
    but the shard files' own headers, which each worker checks for its ranks."""
    loc = Location(weights)
    text = loc.read_text(SHARDS_META_NAME)
    if text is None:
        raise ShardError(
            f"{weights} has no {SHARDS_META_NAME}, so it is not a shard set made by "
            "`ministream shard` (or its upload did not finish) and its tensor-parallel size "
            f"cannot be checked. Make one: `{reshard_command('MODEL', layout, weights)}`"
        )
    info = ShardSetInfo.parse(text, f"{weights}/{SHARDS_META_NAME}")
    made = info.layout
    if made != layout:
        # A set without pipeline stages, served with them: say to drop the flag too.
        serve = made.flags + (" --pipeline-parallel-size 1" if layout.pp > made.pp == 1 else "")
        raise ShardError(
            f"shard set {weights} was made for {made}, but vLLM is starting with {layout}. "
            f"Serve it with {serve}, or re-shard for {layout}: "
            f"`{reshard_command(info.source, layout)}`"
        )
    if dtype is not None and dtype != info.dtype:
        # ShardedStateLoader would cast with a warning: numerics nobody tested.
        raise ShardError(
            f"shard set {weights} holds {info.dtype} tensors, but vLLM is starting with "
            f"--dtype {dtype}. Serve it with --dtype {info.dtype}, or re-shard: "
            f"`{reshard_command(info.source, layout)} --dtype {dtype}`"
        )
    sizes = loc.sizes()
    missing = sorted(set(info.files) - set(sizes))
    stray = sorted(n for n in sizes if n.endswith(".safetensors") and n not in info.files)
    wrong = sorted(n for n, meta in info.files.items() if n in sizes and sizes[n] != meta["size"])
    if missing or stray or wrong:
        raise ShardError(
            f"shard set {weights} does not match its {SHARDS_META_NAME}: "
            + "; ".join(
                [f"missing {', '.join(missing)}"] * bool(missing)
                + [f"not part of it: {', '.join(stray)}"] * bool(stray)
                + [f"wrong size: {', '.join(wrong)}"] * bool(wrong)
            )
            + f". Re-create it: `{reshard_command(info.source, layout, weights)}`"
        )
    _check_same_model(info, weights, config_dir)
    _check_pin(info.source_model_hash, f"shard set {weights}")
    if ranks is None:
        return  # the shard files' headers are each rank's to read, in its worker
    # Own files only: a process never opens a rank's shard but that rank's worker (the tests
    # watch for it).
    pp_rank, rank = ranks
    expected = rank_header(info.source_model_hash, layout, pp_rank, rank)
    for name in info.files_for_rank(rank, pp_rank):
        found = header_rank(loc.header(name, sizes.get(name)).get("__metadata__") or {})
        if found != expected:
            raise ShardError(
                f"{weights}/{name} was made from another model or shard set "
                f"({describe_rank_header(found)}) than this shard set "
                f"({describe_rank_header(dict(expected))}). "
                f"Re-create it: `{reshard_command(info.source, layout, weights)}`"
            )


def _check_same_model(info: ShardSetInfo, weights: str, config_dir: Path) -> None:
    """The config vLLM builds the model from must be the one the shards were made from."""
    manifest_path = config_dir / MANIFEST_NAME
    if manifest_path.is_file() and not (config_dir / SHARDS_META_NAME).is_file():
        # --model is a converted directory, --model-weights the shard set.
        served = Manifest.load(config_dir).model_hash
        if served != info.source_model_hash:
            raise ShardError(
                f"shard set {weights} was made from model {info.source_model_hash[:16]}, "
                f"but vLLM is serving the config of model {served[:16]} ({config_dir}). "
                "Re-shard that model: "
                f"`{reshard_command(str(config_dir), info.layout)}`"
            )
    config = config_dir / "config.json"
    if config.is_file():
        digest = hashlib.sha256(config.read_bytes()).hexdigest()
        if digest != info.config_sha256:
            raise ShardError(
                f"{config} is not the config.json shard set {weights} was made from "
                f"(model {info.source_model_hash[:16]}): the shards belong to another model. "
                f"Re-shard: `{reshard_command(info.source, info.layout)}`"
            )


def check_model_files(weights: str, load_format: str) -> None:
    loc = Location(weights)
    text = loc.read_text(MANIFEST_NAME)
    if text is None:
        if loc.is_s3:
            raise StorageError(
                f"{weights} has no {MANIFEST_NAME}: the upload did not finish (`ministream "
                f"upload` writes it last) or this is not a MiniStream model. Re-run "
                f"`ministream upload MODEL_DIR {weights}`."
            )
        if pinned_hash() is not None:
            raise CheckpointError(
                f"{weights} has no {MANIFEST_NAME}, so its model hash cannot "
                f"be checked against {PIN_ENV}"
            )
        return  # a hand-made directory: vLLM's loader and load_weights' coverage check apply
    sizes = loc.sizes()
    if SHARDS_META_NAME in sizes:
        info = ShardSetInfo.parse(loc.read_text(SHARDS_META_NAME) or "", weights)
        sharded = "runai_streamer_sharded" if load_format == "runai_streamer" else "sharded_state"
        raise ShardError(
            f"{weights} is a shard set ({info.layout}); "
            f"serve it with --load-format {sharded} {info.layout.flags}"
        )
    manifest = Manifest.parse(text, f"{weights}/{MANIFEST_NAME}")
    _check_pin(manifest.model_hash, f"model {weights}")
    listed = {
        n: m["size"]
        for n, m in manifest.files.items()
        if n.endswith(".safetensors") and "/" not in n
    }
    missing = sorted(set(listed) - set(sizes))
    stray = sorted(n for n in sizes if n.endswith(".safetensors") and n not in listed)
    wrong = sorted(n for n in listed if n in sizes and sizes[n] != listed[n])
    if missing or wrong:
        error = StorageError if loc.is_s3 else CheckpointError
        raise error(
            f"{weights} is incomplete: "
            + "; ".join(
                [f"missing {', '.join(missing)}"] * bool(missing)
                + [f"size differs from the manifest: {', '.join(wrong)}"] * bool(wrong)
            )
            + f" (listed in its {MANIFEST_NAME}). Re-upload or re-convert it"
            + (f": `ministream upload MODEL_DIR {weights}`" if loc.is_s3 else ".")
        )
    if stray:
        raise CheckpointError(
            f"{weights} has weights files its {MANIFEST_NAME} does not list: "
            f"{', '.join(stray)}. vLLM would load them too (runai_streamer reads every "
            "*.safetensors under a prefix); remove them"
            + (" or re-upload with `ministream upload --delete-stray`." if loc.is_s3 else ".")
        )


class EngineStartCheck:
    """`check_before_load` at config time, in the API server.

    vLLM 0.32 calls `verify_and_update_config(vllm_config)` of the class registered for the
    served architecture in `vllm.model_executor.models.config.MODELS_CONFIG_MAP` when it
    builds its `VllmConfig` (`VllmConfig.try_verify_and_update_config`), which `vllm serve`
    does before it starts the engine core. `register()` adds this class there."""

    @staticmethod
    def verify_and_update_config(vllm_config: Any) -> None:
        check_before_load(vllm_config)

    @staticmethod
    def verify_and_update_model_config(model_config: Any) -> None:
        return None
