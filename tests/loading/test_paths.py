"""The four loading paths of DESIGN §6 serve the same greedy tokens as the local TP=1 load.

One real vLLM server per path (CPU build, float32, eager), queried over the OpenAI API.
Sharded loads also prove that each rank reads only its own shard:
- local `sharded_state`: fanotify names the process behind every open of a shard file, and
  /proc/<worker pid>/io read_bytes (shard files evicted from the page cache first) shows each
  worker fetched its own shard from storage (see tests/loading/helpers.py);
- `runai_streamer_sharded` from S3: the S3 server's request log. Every rank must read its own
  file completely, so if the bytes served for each object equal that object's size, no rank
  read any part of another rank's file.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections import defaultdict
from pathlib import Path

import pytest

from ministream.golden import reference_completions
from ministream.shardset import SHARDS_META_NAME
from tests.loading.helpers import (
    PROMPTS,
    OpenWatch,
    Served,
    assert_same_tokens,
    serve,
)
from tests.support.processes import evict_from_page_cache
from tests.support.s3_server import S3Server

# Session fixtures (uploads, shard runs, the TP=1 baseline) count toward the first test's
# timeout; engine starts take minutes when other engines share the two cores.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(7200)]


def test_local_tp1_matches_the_reference_model(baseline: Served, model_dir: Path) -> None:
    expected = reference_completions(model_dir, PROMPTS, 16)
    assert_same_tokens(expected, baseline.completions)


def test_runai_streamer_from_s3(
    baseline: Served, model_url: str, s3_env: dict[str, str], tmp_path: Path
) -> None:
    served = serve(
        model_url,
        tmp_path / "vllm.log",
        env=s3_env,
        extra_args=[
            "--load-format",
            "runai_streamer",
            "--model-loader-extra-config",
            json.dumps({"concurrency": 4, "memory_limit": 256 * 2**20}),
        ],
    )
    assert "runai" in served.log.lower()
    assert_same_tokens(baseline.completions, served.completions)


def test_sharded_state_tp2_reads_only_own_shard(
    baseline: Served, shards_tp2: Path, tmp_path: Path
) -> None:
    info = json.loads((shards_tp2 / SHARDS_META_NAME).read_text())
    files = sorted(shards_tp2.glob("*.safetensors"))
    own = {
        r: {str((shards_tp2 / n).resolve()) for n, m in info["files"].items() if m["rank"] == r}
        for r in (0, 1)
    }
    own_bytes = {
        r: sum(m["size"] for m in info["files"].values() if m["rank"] == r) for r in (0, 1)
    }
    evict_from_page_cache(files)
    with contextlib.ExitStack() as stack:
        try:
            watch: OpenWatch | None = stack.enter_context(OpenWatch(files))
        except OSError as exc:  # fanotify needs CAP_SYS_ADMIN (root here and in CI)
            watch = None
            warnings.warn(f"open attribution skipped: {exc}", stacklevel=1)
        served = serve(
            str(shards_tp2),
            tmp_path / "vllm.log",
            tp=2,
            extra_args=["--load-format", "sharded_state"],
        )
    assert_same_tokens(baseline.completions, served.completions)
    assert sorted(served.worker_pids) == [0, 1], served.worker_pids
    for rank in (0, 1):
        # Its own shard came from storage into this process (not from another's cache).
        assert served.read_bytes[rank] >= own_bytes[rank], (rank, served.read_bytes)
    if watch is not None:
        rank_of = {pid: rank for rank, pid in served.worker_pids.items()}
        assert {pid for pid, _ in watch.opened} <= set(rank_of), watch.opened  # only workers
        for rank in (0, 1):
            opened = {path for pid, path in watch.opened if rank_of[pid] == rank}
            assert opened == own[rank], (rank, opened)


def test_runai_streamer_sharded_tp2_from_s3(
    baseline: Served, shards_tp2_url: str, s3: S3Server, s3_env: dict[str, str], tmp_path: Path
) -> None:
    before = len(s3.requests())
    served = serve(
        shards_tp2_url,
        tmp_path / "vllm.log",
        tp=2,
        env=s3_env,
        extra_args=["--load-format", "runai_streamer_sharded"],
    )
    assert_same_tokens(baseline.completions, served.completions)

    prefix = "/" + shards_tp2_url.removeprefix("s3://") + "/"
    sizes = {
        o["Key"].rsplit("/", 1)[1]: o["Size"]
        for o in s3.client().list_objects_v2(Bucket="models", Prefix=prefix[len("/models/") :])[
            "Contents"
        ]
    }
    served_bytes: dict[str, int] = defaultdict(int)
    for req in s3.requests()[before:]:
        name = req["path"].removeprefix(prefix)
        if (
            req["method"] == "GET"
            and req["path"].startswith(prefix)
            and name.endswith(".safetensors")
        ):
            served_bytes[name] += req["bytes"]
    shard_files = sorted(n for n in sizes if n.endswith(".safetensors"))
    assert shard_files == ["model-rank-0-part-0.safetensors", "model-rank-1-part-0.safetensors"]
    for name in shard_files:
        key = f"{prefix[len('/models/') :]}{name}"
        first8 = s3.client().get_object(Bucket="models", Key=key, Range="bytes=0-7")["Body"]
        header = 8 + int.from_bytes(first8.read(), "little")
        # Measured: the streamer reads the object once (and 8 header bytes again); the owning
        # rank's load guard reads the header (2400 B) once more. Another rank streaming this
        # file would add its whole data section (~720 KB), far more than this allowance.
        assert sizes[name] <= served_bytes[name] <= sizes[name] + 2 * header, (
            name,
            served_bytes[name],
            sizes[name],
            header,
        )
