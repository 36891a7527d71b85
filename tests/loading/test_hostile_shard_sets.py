"""A truncated shard set on S3, against the real moto S3 server: refused by the load
guard with what is missing or short, before vLLM reads a weight. No engine needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ministream.errors import ShardError
from ministream.load_guard import check_shard_set
from ministream.shardset import SHARDS_META_NAME, Layout, shard_file_name
from ministream_testkit.s3_server import S3Server
from tests.loading.conftest import BUCKET
from tests.loading.test_load_guard import make_shard_set

pytestmark = pytest.mark.network


def _upload(s3: S3Server, root: Path, prefix: str, body: dict[str, bytes] | None = None) -> str:
    client = s3.client()
    for f in sorted(root.iterdir()):
        data = (body or {}).get(f.name, f.read_bytes())
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/{f.name}", Body=data)
    return f"s3://{BUCKET}/{prefix}"


def test_rank_file_cut_short_on_s3(s3: S3Server, aws: dict[str, str], tmp_path: Path) -> None:
    shards = make_shard_set(tmp_path / "set")
    name = shard_file_name(1, 0)
    full = (shards / name).read_bytes()
    url = _upload(s3, shards, "hostile/cut", {name: full[: len(full) // 2]})
    with pytest.raises(ShardError, match=rf"wrong size: {name}.*Re-create it"):
        check_shard_set(url, shards, Layout(2), (0, 1), "float32")


def test_rank_file_missing_on_s3(s3: S3Server, aws: dict[str, str], tmp_path: Path) -> None:
    shards = make_shard_set(tmp_path / "set")
    name = shard_file_name(1, 0)
    (shards / name).unlink()
    url = _upload(s3, shards, "hostile/missing")
    (shards / name).write_bytes(b"")  # (local copy irrelevant: S3 is what is checked)
    with pytest.raises(ShardError, match=rf"missing {name}"):
        check_shard_set(url, shards, Layout(2), (0, 0), "float32")


def test_truncated_object_whose_listing_agrees_is_caught_by_its_offsets(
    s3: S3Server, aws: dict[str, str], tmp_path: Path
) -> None:
    """The description was rewritten to match the cut object (sizes agree): the header's
    data_offsets run past the object's end, and the guard says so."""
    shards = make_shard_set(tmp_path / "set")
    name = shard_file_name(0, 0)
    cut = (shards / name).read_bytes()[:-8]
    meta = json.loads((shards / SHARDS_META_NAME).read_text())
    meta["files"][name]["size"] = len(cut)
    (shards / SHARDS_META_NAME).write_text(json.dumps(meta))
    url = _upload(s3, shards, "hostile/agreeing", {name: cut})
    with pytest.raises(ShardError, match="truncated or corrupt"):
        check_shard_set(url, shards, Layout(2), (0, 0), "float32")


def test_header_claiming_a_huge_length_on_s3(
    s3: S3Server, aws: dict[str, str], tmp_path: Path
) -> None:
    """No range request for 2**62 bytes is even made: the claimed length is refused first."""
    shards = make_shard_set(tmp_path / "set")
    name = shard_file_name(0, 0)
    data = bytearray((shards / name).read_bytes())
    data[:8] = (2**62).to_bytes(8, "little")
    url = _upload(s3, shards, "hostile/huge", {name: bytes(data)})
    with pytest.raises(ShardError, match="header claims"):
        check_shard_set(url, shards, Layout(2), (0, 0), "float32")
