"""The loading paths of docs/loading.md serve the same greedy tokens as the local TP=1 load.

One real vLLM server per path (CPU build, float32, eager), queried over the OpenAI API; the
local TP=1 load is the session's shared server (tests/conftest.py). The fourth path,
`runai_streamer` from S3, is served in test_s3_workload_identity.py with the chart's env and
loader flags and role credentials, against the same reference tokens. Sharded loads also
prove that each rank reads only its own shard:
- local `sharded_state`: /proc/<worker pid>/io read_bytes (shard files evicted from the page
  cache first) shows each worker fetched its own shard from storage, and, as root, fanotify
  names the process behind every open of a shard file (see tests/loading/helpers.py);
- `runai_streamer_sharded` from S3: the S3 server's request log. Every rank must read its own
  file completely, so if the bytes served for each object equal that object's size, no rank
  read any part of another rank's file.
"""

from __future__ import annotations

import contextlib
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from ministream.shardset import SHARDS_META_NAME
from ministream_reference.golden import reference_completions
from ministream_testkit.processes import evict_from_page_cache
from ministream_testkit.s3_server import S3Server
from tests.loading.helpers import (
    PROMPTS,
    OpenWatch,
    Served,
    assert_same_tokens,
    serve,
)

# Session fixtures (uploads, shard runs, the TP=1 baseline) count toward the first test's
# timeout; engine starts take minutes when other engines share the two cores.
pytestmark = [pytest.mark.engine, pytest.mark.network, pytest.mark.timeout(7200)]


def test_local_tp1_matches_the_reference_model(baseline: Served, model_dir: Path) -> None:
    expected = reference_completions(model_dir, PROMPTS, 16)
    assert_same_tokens(expected, baseline.completions)


@dataclass
class ShardedLoad:
    served: Served
    opened: list[tuple[int, str]] | None  # (pid, path) of each shard file open; None: no watch
    why_unwatched: str = ""


@pytest.fixture(scope="module")
def sharded_tp2_load(shards_tp2: Path, tmp_path_factory: pytest.TempPathFactory) -> ShardedLoad:
    """One TP=2 `sharded_state` load of the local shard set, shard files evicted from the page
    cache first; fanotify records who opens them meanwhile where it may (CAP_SYS_ADMIN)."""
    files = sorted(shards_tp2.glob("*.safetensors"))
    evict_from_page_cache(files)
    log = tmp_path_factory.mktemp("sharded-tp2") / "vllm.log"
    with contextlib.ExitStack() as stack:
        try:
            watch: OpenWatch | None = stack.enter_context(OpenWatch(files))
            why = ""
        except OSError as exc:
            watch, why = None, str(exc)
        served = serve(str(shards_tp2), log, tp=2, extra_args=["--load-format", "sharded_state"])
    return ShardedLoad(served, watch.opened if watch else None, why)


def _own_files(shards_tp2: Path) -> dict[int, dict[str, int]]:
    """rank -> {resolved path: size} of the files the shard set assigns to that rank."""
    own: dict[int, dict[str, int]] = {0: {}, 1: {}}
    for name, meta in json.loads((shards_tp2 / SHARDS_META_NAME).read_text())["files"].items():
        own[meta["rank"]][str((shards_tp2 / name).resolve())] = meta["size"]
    return own


def test_sharded_state_tp2_serves_the_same_and_each_rank_reads_its_shard(
    baseline: Served, shards_tp2: Path, sharded_tp2_load: ShardedLoad
) -> None:
    served = sharded_tp2_load.served
    assert_same_tokens(baseline.completions, served.completions)
    assert sorted(served.worker_pids) == [0, 1], served.worker_pids
    for rank, own in _own_files(shards_tp2).items():
        # Its own shard came from storage into this process (not from another's cache).
        assert served.read_bytes[rank] >= sum(own.values()), (rank, served.read_bytes)


@pytest.mark.root("fanotify (CAP_SYS_ADMIN) names the process behind each open")
def test_sharded_state_tp2_ranks_open_only_their_own_shard(
    shards_tp2: Path, sharded_tp2_load: ShardedLoad
) -> None:
    opened = sharded_tp2_load.opened
    if opened is None:
        pytest.skip(f"fanotify unavailable: {sharded_tp2_load.why_unwatched}")
    rank_of = {pid: rank for rank, pid in sharded_tp2_load.served.worker_pids.items()}
    assert {pid for pid, _ in opened} <= set(rank_of), opened  # only the workers
    for rank, own in _own_files(shards_tp2).items():
        assert {path for pid, path in opened if rank_of[pid] == rank} == set(own), (rank, opened)


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
