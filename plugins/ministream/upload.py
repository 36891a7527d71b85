"""`ministream upload DIR s3://bucket/prefix`: a converted model (or shard set) to S3.

Order of operations, so that a prefix never looks complete while it is not:
1. verify the local directory against its manifest (never upload a corrupt model);
2. list the prefix: refuse stray `*.safetensors` the manifest does not list (the Run:ai
   streamer would load them; `--delete-stray` removes them), delete a remote manifest that
   differs from ours (the old model is no longer complete once we start replacing files),
   abort our stale multipart uploads;
3. upload every file whose object is absent or differs (size, or the sha256 kept in the
   object's `x-amz-meta-sha256`): files in parallel, big files as parallel multipart parts,
   one progress bar; `config.json` (an adapter's `adapter_config.json`) after all others.
   Unchanged files are skipped, so re-running after an interruption resumes where it stopped;
4. verify every object (size + sha256 metadata) against the manifest;
5. write `ministream_manifest.json` last. The load guard refuses an S3 model without it.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ministream.adapter_rules import ADAPTER_CONFIG
from ministream.errors import StorageError
from ministream.manifest import MANIFEST_NAME, Manifest, verify_dir
from ministream.s3 import (
    SHA256_META,
    S3Url,
    delete,
    head,
    list_objects,
    make_client,
    parse_url,
    put_bytes,
    read_text,
    storage_errors,
)

MiB = 1024 * 1024
DEFAULT_JOBS = 8
DEFAULT_PART_SIZE = 64 * MiB


@dataclass
class UploadResult:
    url: str
    manifest: Manifest
    uploaded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    bytes_uploaded: int = 0


def _is_current(
    client: Any, url: S3Url, name: str, meta: dict[str, Any], listed_size: int | None
) -> bool:
    if listed_size != meta["size"]:
        return False
    obj = head(client, url, name)
    return obj is not None and obj.get("Metadata", {}).get(SHA256_META) == meta["sha256"]


def _plan(
    client: Any, url: S3Url, manifest: Manifest, manifest_text: str, delete_stray: bool
) -> tuple[list[str], list[str], list[str]]:
    """(names to upload, names to skip, names to delete before uploading)."""
    remote = list_objects(client, url)
    stray = sorted(n for n in remote if n.endswith(".safetensors") and n not in manifest.files)
    if stray and not delete_stray:
        raise StorageError(
            f"{url} holds weights files that {MANIFEST_NAME} does not list: {', '.join(stray)}. "
            "vLLM's runai_streamer would load them with this model. Upload to an empty "
            "prefix, or pass --delete-stray to remove them."
        )
    to_delete = list(stray)
    if MANIFEST_NAME in remote and read_text(client, url, MANIFEST_NAME) != manifest_text:
        to_delete.insert(0, MANIFEST_NAME)  # first: the prefix stops looking complete
    upload, skip = [], []
    for name, meta in sorted(manifest.files.items()):
        listed = remote.get(name)
        if _is_current(client, url, name, meta, listed.size if listed else None):
            skip.append(name)
        else:
            upload.append(name)
    return upload, skip, to_delete


def _abort_stale_multipart(client: Any, url: S3Url, names: list[str]) -> None:
    """Parts of a killed upload linger (and are billed) until aborted."""
    keys = {url.key(n) for n in names}
    with storage_errors(url, "listing multipart uploads under"):
        pages = client.get_paginator("list_multipart_uploads").paginate(
            Bucket=url.bucket, Prefix=f"{url.prefix}/" if url.prefix else ""
        )
        for page in pages:
            for upload in page.get("Uploads", []):
                if upload["Key"] in keys:
                    client.abort_multipart_upload(
                        Bucket=url.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                    )


def _transfer(
    client: Any,
    url: S3Url,
    model_dir: Path,
    manifest: Manifest,
    names: list[str],
    jobs: int,
    part_size: int,
    progress: bool,
) -> int:
    from boto3.s3.transfer import TransferConfig
    from s3transfer.manager import TransferManager
    from s3transfer.subscribers import BaseSubscriber
    from tqdm import tqdm

    total = sum(manifest.files[n]["size"] for n in names)
    bar = tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=f"upload to {url}",
        disable=not progress,
    )
    lock = threading.Lock()

    class Progress(BaseSubscriber):
        def on_progress(self, future: Any, bytes_transferred: int, **kwargs: Any) -> None:
            with lock:
                bar.update(bytes_transferred)

    config = TransferConfig(
        multipart_threshold=part_size,
        multipart_chunksize=part_size,
        max_concurrency=jobs,
        use_threads=True,
    )
    manager = TransferManager(client, config)
    # config.json goes after everything else (then the manifest): a prefix cut short is not
    # even loadable as a model, and the window in which all files but the manifest exist
    # (refused by the load guard) is as short as possible.
    # An adapter directory's adapter_config.json likewise (vLLM reads it first).
    last = ("config.json", ADAPTER_CONFIG)
    phases = [[n for n in names if n not in last], [n for n in names if n in last]]
    try:
        with storage_errors(url, "uploading to"):
            for phase in phases:
                futures = [
                    manager.upload(
                        str(model_dir / name),
                        url.bucket,
                        url.key(name),
                        extra_args={"Metadata": {SHA256_META: manifest.files[name]["sha256"]}},
                        subscribers=[Progress()],
                    )
                    for name in phase
                ]
                for future in futures:
                    future.result()
    except BaseException:
        manager.shutdown(cancel=True)  # aborts in-flight multipart uploads
        raise
    finally:
        bar.close()
    manager.shutdown()
    return total


def _verify_remote(client: Any, url: S3Url, manifest: Manifest) -> None:
    remote = list_objects(client, url)
    bad = [
        name
        for name, meta in sorted(manifest.files.items())
        if not _is_current(client, url, name, meta, remote[name].size if name in remote else None)
    ]
    if bad:
        raise StorageError(
            f"after upload, {url} does not match the manifest for: "
            f"{', '.join(bad)} (another writer on the same prefix?)"
        )


def upload(
    model_dir: str | Path,
    url: str,
    *,
    jobs: int = DEFAULT_JOBS,
    part_size: int = DEFAULT_PART_SIZE,
    delete_stray: bool = False,
    progress: bool = True,
    client: Any = None,
) -> UploadResult:
    model_dir = Path(model_dir)
    s3url = parse_url(url)
    if not s3url.prefix:
        raise StorageError(f"{url}: give a prefix (s3://BUCKET/PREFIX), one model per prefix")
    manifest = verify_dir(model_dir)
    manifest_text = (model_dir / MANIFEST_NAME).read_text()
    client = client or make_client(max_connections=2 * jobs + 4)
    names, skipped, to_delete = _plan(client, s3url, manifest, manifest_text, delete_stray)
    result = UploadResult(str(s3url), manifest, uploaded=names, skipped=skipped, deleted=to_delete)
    delete(client, s3url, to_delete)
    _abort_stale_multipart(client, s3url, names)
    result.bytes_uploaded = _transfer(
        client, s3url, model_dir, manifest, names, jobs, part_size, progress
    )
    _verify_remote(client, s3url, manifest)
    if read_text(client, s3url, MANIFEST_NAME) == manifest_text:
        return result  # nothing changed: the model was complete already
    put_bytes(
        client,
        s3url,
        MANIFEST_NAME,
        manifest_text.encode(),
        hashlib.sha256(manifest_text.encode()).hexdigest(),
    )
    if read_text(client, s3url, MANIFEST_NAME) != manifest_text:
        raise StorageError(f"{s3url.child(MANIFEST_NAME)} did not read back as written")
    return result
