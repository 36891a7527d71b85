"""`ministream shard --model DIR|s3://… --tensor-parallel-size N [--pipeline-parallel-size M]
--output DIR|s3://…`.

Produces a shard set (format: `ministream.shardset`) for one fixed TP x PP layout:
1. check the source against its manifest (local: every sha256; S3: the manifest exists,
   every listed object is there at its size) and take its `model_hash`;
2. if the output already holds a valid shard set of this model for this layout, stop
   (idempotent: exit 0 in seconds);
3. run N x M rank processes (`ministream.shard_worker`), one gloo process group, each
   building its part of the model (its pipeline stage's layers, its tensor-parallel slice)
   through vLLM with the plugin and saving its own state dict, then reading it back through
   vLLM's `ShardedStateLoader` and comparing every tensor;
4. copy config, tokenizer and generation config beside the shards, write
   `ministream_shards.json` and the manifest, and publish: a local output is renamed into
   place in one step; an S3 output is uploaded with `ministream upload` (manifest last).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ministream.errors import CheckpointError, ShardError, StorageError, is_enospc
from ministream.manifest import MANIFEST_NAME, Manifest, converter_version, sha256_file, verify_dir
from ministream.output_dir import check_replaceable, make_world_readable, refusal, replace_dir
from ministream.s3 import is_s3
from ministream.shardset import SHARDS_META_NAME, Layout, ShardSetInfo
from ministream.versions import vllm_version

DEFAULT_MAX_PART_BYTES = 5 * 1024**3  # vLLM's save_sharded_state example default
# Source files that are not copied beside the shards: the weights, and files describing them.
_NOT_COPIED = (".safetensors", "model.safetensors.index.json", MANIFEST_NAME)


@dataclass(frozen=True)
class ShardResult:
    output: str
    info: ShardSetInfo
    reused: bool
    seconds: float


def _copied(name: str) -> bool:
    return not name.endswith(_NOT_COPIED) and name != SHARDS_META_NAME


# ---- source -----------------------------------------------------------------------------


def check_heads_divide(model: str, tensor_parallel_size: int) -> None:
    """Refuse, before any rank starts, a tensor-parallel size that does not divide the
    model's attention heads (vLLM would fail in every rank after loading started)."""
    if is_s3(model):
        from ministream.s3 import make_client, parse_url, read_text

        text = read_text(make_client(), parse_url(model), "config.json")
    else:
        path = Path(model) / "config.json"
        text = path.read_text() if path.is_file() else None
    if text is None:
        return  # the manifest check that follows names what is missing
    heads = int(json.loads(text).get("num_attention_heads") or 0)
    if heads and heads % tensor_parallel_size:
        fits = [n for n in range(1, heads + 1) if heads % n == 0]
        raise ShardError(
            f"--tensor-parallel-size {tensor_parallel_size} does not divide the model's {heads} "
            f"attention heads: each rank serves whole heads. Pick one of "
            f"{', '.join(map(str, fits))}."
        )


def _source_manifest(model: str) -> Manifest:
    if not is_s3(model):
        if ShardSetInfo.load(model) is not None:
            raise ShardError(f"{model} is already a shard set; shard the converted model")
        return verify_dir(model)
    from ministream.load_guard import check_model_files
    from ministream.s3 import make_client, parse_url, read_text

    url = parse_url(model)
    check_model_files(model, "runai_streamer")  # manifest present, objects complete, no strays
    text = read_text(make_client(), url, MANIFEST_NAME)
    assert text is not None  # check_model_files raised otherwise
    return Manifest.parse(text, url.child(MANIFEST_NAME))


def _copy_side_files(model: str, manifest: Manifest, dest: Path) -> None:
    names = [n for n in manifest.files if _copied(n)]
    if is_s3(model):
        from ministream.s3 import download, make_client, parse_url

        download(make_client(), parse_url(model), names, dest)
        return
    for name in names:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(model) / name, dest / name)


# ---- existing output --------------------------------------------------------------------


def _existing(output: str) -> ShardSetInfo | None:
    """The shard set at `output` if it exists and verifies; None if `output` is empty."""
    if is_s3(output):
        from ministream.s3 import list_objects, make_client, parse_url, read_text

        url = parse_url(output)
        client = make_client()
        if not list_objects(client, url):
            return None
        text = read_text(client, url, SHARDS_META_NAME)
        if text is None or read_text(client, url, MANIFEST_NAME) is None:
            _check_remote_replaceable(output)
            raise ShardError(
                f"{output} is not empty and holds no complete shard set; pass "
                "--force to replace it, or choose another --output"
            )
        info = ShardSetInfo.parse(text, url.child(SHARDS_META_NAME))
        try:
            _verify_remote_shard_set(output, info)
        except (StorageError, CheckpointError, ShardError) as exc:
            raise ShardError(
                f"{output} holds a damaged shard set ({exc}); pass --force to replace it"
            ) from None
        return info
    path = Path(output)
    if not path.exists() or (path.is_dir() and not any(path.iterdir())):
        return None
    local = ShardSetInfo.load(path) if path.is_dir() else None
    if local is None:
        try:
            check_replaceable(path, force=True)
        except FileExistsError as exc:
            raise ShardError(str(exc)) from None
        raise ShardError(
            f"{output} holds a MiniStream model or adapter, not a shard set; pass --force "
            "to replace it, or choose another --output"
        )
    try:
        verify_dir(path)
    except CheckpointError as exc:
        raise ShardError(
            f"{output} holds a damaged shard set ({exc}); pass --force to replace it"
        ) from None
    return local


def _check_remote_replaceable(output: str) -> None:
    """`--force` on S3 replaces a prefix only when it is empty or holds one of our sets
    (its manifest, or the shard metadata an interrupted upload leaves before the manifest)."""
    from ministream.s3 import list_objects, make_client, parse_url

    names = list_objects(make_client(), parse_url(output))
    if names and MANIFEST_NAME not in names and SHARDS_META_NAME not in names:
        tops = {n.split("/", 1)[0] + ("/" if "/" in n else "") for n in names}
        raise ShardError(refusal(output, tops))


def _check_force(output: str) -> None:
    """What `--force` may replace (output_dir.py), checked before any rank starts."""
    if is_s3(output):
        _check_remote_replaceable(output)
        return
    try:
        check_replaceable(Path(output), force=True)
    except FileExistsError as exc:
        raise ShardError(str(exc)) from None


def _verify_remote_shard_set(output: str, info: ShardSetInfo) -> None:
    """Every object the manifest lists, at its size and sha256 (metadata); no strays."""
    from ministream.s3 import SHA256_META, head, list_objects, make_client, parse_url, read_text

    url = parse_url(output)
    client = make_client()
    manifest_text = read_text(client, url, MANIFEST_NAME) or ""
    manifest = Manifest.parse(manifest_text, url.child(MANIFEST_NAME))
    remote = list_objects(client, url)
    for name, meta in manifest.files.items():
        obj = head(client, url, name) if name in remote else None
        if (
            obj is None
            or obj.get("ContentLength") != meta["size"]
            or obj.get("Metadata", {}).get(SHA256_META) != meta["sha256"]
        ):
            raise StorageError(f"{url.child(name)} is missing or differs from the manifest")
    stray = [n for n in remote if n.endswith(".safetensors") and n not in info.files]
    if stray:
        raise StorageError(f"stray weights files: {', '.join(sorted(stray))}")


# ---- ranks ------------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _last_error(log: Path) -> str:
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    errors = [ln for ln in lines if "Error" in ln.split(":")[0] or ln.startswith("ministream.")]
    return (errors or lines or ["(no output)"])[-1].strip()


def _run_ranks(spec: dict[str, Any], work: Path, progress: bool) -> list[dict[str, Any]]:
    from tqdm import tqdm

    layout = Layout(spec["tensor_parallel_size"], spec["pipeline_parallel_size"])
    world = layout.world
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "VLLM_NO_USAGE_STATS": "1"}
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    desc = f"shard ranks (tp={layout.tp}" + (f", pp={layout.pp})" if layout.pp > 1 else ")")
    bar = tqdm(total=world, desc=desc, unit="rank", disable=not progress)
    try:
        for rank in range(world):
            log = work / f"rank-{rank}.log"
            with open(log, "wb") as fh:
                procs.append(
                    (
                        subprocess.Popen(
                            [
                                sys.executable,
                                "-m",
                                "ministream.shard_worker",
                                str(spec_path),
                                str(rank),
                            ],
                            stdout=fh,
                            stderr=subprocess.STDOUT,
                            env=env,
                        ),
                        log,
                    )
                )
        pending = set(range(world))
        while pending:
            for rank in sorted(pending):
                proc, log = procs[rank]
                code = proc.poll()
                if code is None:
                    continue
                pending.discard(rank)
                if code != 0:
                    raise ShardError(
                        f"rank {rank} failed (exit {code}): {_last_error(log)} (full log: {log})"
                    )
                bar.update(1)
            time.sleep(0.2)
    finally:
        bar.close()
        for proc, _ in procs:  # one rank failed: the others would wait for it forever
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    out = Path(spec["output"])
    results = []
    for rank in range(world):
        done = out / f".rank-{rank}.done.json"
        results.append(json.loads(done.read_text()))
        done.unlink()
    return results


# ---- command ----------------------------------------------------------------------------


def shard(
    model: str,
    tensor_parallel_size: int,
    output: str,
    *,
    pipeline_parallel_size: int = 1,
    dtype: str | None = None,
    max_part_bytes: int = DEFAULT_MAX_PART_BYTES,
    force: bool = False,
    progress: bool = True,
) -> ShardResult:
    started = time.monotonic()
    model, output = str(model).rstrip("/"), str(output).rstrip("/")
    if tensor_parallel_size < 1 or pipeline_parallel_size < 1:
        raise ShardError("--tensor-parallel-size and --pipeline-parallel-size must be at least 1")
    layout = Layout(tensor_parallel_size, pipeline_parallel_size)
    check_heads_divide(model, tensor_parallel_size)
    manifest = _source_manifest(model)
    # The model's own dtype by default: vLLM's "auto" would turn float32 into bfloat16.
    dtype = dtype or manifest.dtype
    if force:
        _check_force(output)
    existing = None if force else _existing(output)
    if existing is not None:
        _check_same_shard_set(existing, output, (layout, manifest.model_hash, dtype))
        return ShardResult(output, existing, True, time.monotonic() - started)

    staging = _staging_dir(output)
    # Rank logs: removed on success, kept (and named in the error) when a rank fails.
    work = Path(tempfile.mkdtemp(prefix="ministream-shard-work-"))
    succeeded = False
    try:
        spec = _rank_spec(model, layout, dtype, manifest.model_hash, max_part_bytes, staging)
        results = _run_ranks(spec, work, progress)
        info = _write_shard_set(staging, model, manifest, layout, results)
        _publish(staging, output, force=force, progress=progress)
        succeeded = True
    except BaseException as exc:
        if is_enospc(exc):
            raise _no_space(output, exc) from exc
        raise
    finally:
        if succeeded:
            shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(staging, ignore_errors=True)
    return ShardResult(output, info, False, time.monotonic() - started)


def _check_same_shard_set(
    existing: ShardSetInfo, output: str, wanted: tuple[Layout, str, str]
) -> None:
    """An existing shard set is reused only for the same layout, model and dtype."""
    have = (existing.layout, existing.source_model_hash, existing.dtype)
    if have != wanted:
        raise ShardError(
            f"{output} already holds a shard set for {have[0]} of model "
            f"{have[1][:16]} in {have[2]}; this run is for {wanted[0]} of model "
            f"{wanted[1][:16]} in {wanted[2]}. Pass --force to replace it, or choose another "
            "--output."
        )


def _staging_dir(output: str) -> Path:
    """Where the ranks write: beside a local output (renamed into place in one step), or in
    $TMPDIR for an S3 output (uploaded from there)."""
    if is_s3(output):
        return Path(tempfile.mkdtemp(prefix="ministream-shard-"))
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{Path(output).name}.partial-", dir=Path(output).parent))


def _rank_spec(
    model: str,
    layout: Layout,
    dtype: str,
    model_hash: str,
    max_part_bytes: int,
    staging: Path,
) -> dict[str, Any]:
    """What every rank process reads (`ministream.shard_worker`)."""
    return {
        "model": model,
        "tensor_parallel_size": layout.tp,
        "pipeline_parallel_size": layout.pp,
        "dtype": dtype,
        "load_format": "runai_streamer" if is_s3(model) else "safetensors",
        "port": _free_port(),
        "output": str(staging),
        "model_hash": model_hash,
        "max_part_bytes": max_part_bytes,
        "verify": True,
    }


def _rank_files(results: list[dict[str, Any]], staging: Path) -> dict[str, dict[str, Any]]:
    """Each file the ranks wrote, with the rank that wrote it, its size and sha256."""
    files = {}
    for result in results:
        for name in result["files"]:
            path = staging / name
            files[name] = {
                "rank": result["rank"],
                "pp_rank": result["pp_rank"],
                "size": path.stat().st_size,
                "sha256": sha256_file(path),
            }
    return files


def _write_shard_set(
    staging: Path,
    model: str,
    manifest: Manifest,
    layout: Layout,
    results: list[dict[str, Any]],
) -> ShardSetInfo:
    """Complete the ranks' files in `staging` into a shard set: the source's side files,
    `ministream_shards.json` and the manifest."""
    files = _rank_files(results, staging)
    _copy_side_files(model, manifest, staging)
    info = ShardSetInfo(
        tensor_parallel_size=layout.tp,
        pipeline_parallel_size=layout.pp,
        source_model_hash=manifest.model_hash,
        source=model,
        config_sha256=sha256_file(staging / "config.json"),
        dtype=results[0]["dtype"],
        vllm_version=vllm_version(),
        ministream_version=converter_version(),
        files=files,
    )
    (staging / SHARDS_META_NAME).write_text(info.to_json())
    shard_manifest = Manifest.build(
        staging,
        source={
            "shard_set_of": manifest.model_hash,
            "tensor_parallel_size": layout.tp,
            "pipeline_parallel_size": layout.pp,
            "source": model,
        },
        dtype=info.dtype,
    )
    (staging / MANIFEST_NAME).write_text(shard_manifest.to_json())
    return info


def _publish(staging: Path, output: str, *, force: bool, progress: bool) -> None:
    """Put the finished shard set at `output`: renamed into place, or uploaded (manifest last)."""
    make_world_readable(staging)
    if is_s3(output):
        from ministream.upload import upload

        upload(staging, output, delete_stray=force, progress=progress)
    else:
        replace_dir(staging, Path(output), force=force)


def _no_space(output: str, exc: BaseException) -> ShardError:
    where = "the staging directory" if is_s3(output) else str(Path(output).parent)
    return ShardError(
        f"no space left on the device of {where} while sharding ({exc}); the partial "
        f"shard set was removed and {output} was left as it was. Free space, or pick "
        "another --output (an S3 output stages in $TMPDIR)."
    )
