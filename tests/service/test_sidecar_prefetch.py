"""The page-cache prefetch (ministream_sidecar/prefetch.py): reads every file once, within the
memory cgroup's headroom, never fails on a bad path, and reports through the sidecar's
metrics. Real files in a temp tree; the cgroup files are stand-ins (a test cannot set the
limit of its own cgroup)."""

from __future__ import annotations

import logging
import random
import threading
from pathlib import Path

import pytest
from sidecarkit import FakeVLLM, SidecarFactory, sample

from ministream_sidecar import prefetch
from ministream_sidecar.prefetch import PrefetchResult, memory_budget, start_prefetch
from ministream_testkit.waiting import wait_until


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, int, int]:
    """A model-like tree (nested directories, empty and multi-chunk files); its total size
    and file count. Small chunks so that each file takes several reads."""
    monkeypatch.setattr(prefetch, "CHUNK_BYTES", 1000)
    rng = random.Random(7)
    root = tmp_path / "model"
    total = files = 0
    for i, size in enumerate([0, 1, 999, 1000, 1001, 4567, rng.randrange(10_000, 20_000)]):
        file = root / f"d{i % 3}" / ("sub" if i % 2 else "") / f"f{i}.bin"
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_bytes(rng.randbytes(size))
        total += size
        files += 1
    return root, total, files


def test_reads_every_file_under_the_tree(tree: tuple[Path, int, int]) -> None:
    root, total, files = tree
    single = next(root.rglob("f6.bin"))
    result = prefetch.prefetch((str(root), str(single)))
    assert result.bytes_read == total + single.stat().st_size
    assert result.files == files + 1
    assert not result.truncated


def test_a_bad_path_warns_and_the_rest_is_read(
    tree: tuple[Path, int, int], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root, total, files = tree
    missing = tmp_path / "no-such-cache"
    with caplog.at_level(logging.WARNING, logger=prefetch.__name__):
        result = prefetch.prefetch((str(missing), str(root)))
    assert (result.bytes_read, result.files) == (total, files)
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert f"{missing} does not exist" in caplog.records[0].getMessage()


def test_a_file_that_fails_to_read_warns_and_is_skipped(
    tree: tuple[Path, int, int], caplog: pytest.LogCaptureFixture
) -> None:
    root, total, files = tree
    # A regular file whose first read fails (EIO: address 0 is not mapped), for any user;
    # a file of mode 000 would not fail for root.
    failing = "/proc/self/mem"
    with caplog.at_level(logging.WARNING, logger=prefetch.__name__):
        result = prefetch.prefetch((failing, str(root)))
    assert (result.bytes_read, result.files) == (total, files)
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert failing in caplog.text


def test_an_object_store_uri_is_skipped(tree: tuple[Path, int, int]) -> None:
    root, total, files = tree
    result = prefetch.prefetch(("s3://models/ministream/v2", str(root)))
    assert (result.bytes_read, result.files) == (total, files)


@pytest.mark.parametrize("share", [0.0, 0.37, 0.9])
def test_stops_at_the_budget(tree: tuple[Path, int, int], share: float) -> None:
    root, total, _ = tree
    budget = int(total * share)
    result = prefetch.prefetch((str(root),), budget=budget)
    assert result.bytes_read == budget
    assert result.truncated
    assert not prefetch.prefetch((str(root),), budget=total).truncated


def _cgroup(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text + "\n")
    return tmp_path


def test_memory_budget_is_the_cgroup_headroom(tmp_path: Path) -> None:
    gib, margin = 1 << 30, prefetch.HEADROOM_MARGIN_BYTES
    v2 = _cgroup(tmp_path / "v2", {"memory.max": str(gib), "memory.current": str(gib // 4)})
    assert memory_budget(v2) == gib - gib // 4 - margin
    v1 = _cgroup(
        tmp_path / "v1",
        {"memory/memory.limit_in_bytes": str(gib), "memory/memory.usage_in_bytes": "0"},
    )
    assert memory_budget(v1) == gib - margin
    full = _cgroup(tmp_path / "full", {"memory.max": str(gib), "memory.current": str(gib)})
    assert memory_budget(full) == 0
    # No limit (v2's "max", v1's page-aligned huge number) or no cgroup files: no budget.
    assert (
        memory_budget(_cgroup(tmp_path / "max", {"memory.max": "max", "memory.current": "5"}))
        is None
    )
    huge = str((1 << 63) - 4096)
    unlimited_v1 = _cgroup(
        tmp_path / "v1max",
        {"memory/memory.limit_in_bytes": huge, "memory/memory.usage_in_bytes": "0"},
    )
    assert memory_budget(unlimited_v1) is None
    assert memory_budget(tmp_path / "absent") is None


def test_start_prefetch_reports_from_a_daemon_thread(tree: tuple[Path, int, int]) -> None:
    root, total, _ = tree
    assert start_prefetch((), lambda _: None) is None
    results: list[PrefetchResult] = []
    thread = start_prefetch((str(root),), results.append)
    assert thread is not None and thread.daemon and thread is not threading.current_thread()
    thread.join(timeout=60)
    [result] = results
    assert result.bytes_read == total


@pytest.mark.network
def test_the_sidecar_exports_what_it_read(
    tree: tuple[Path, int, int], start_sidecar: SidecarFactory
) -> None:
    root, total, _ = tree
    fake = FakeVLLM(model="tiny")
    sidecar = start_sidecar(
        app_kwargs={"transport": fake.transport()},
        vllm_url="http://fake-vllm:8000",
        prefetch_paths=f"s3://bucket/model,{root}",
    )

    def read() -> float:
        return sample(sidecar.get("/metrics").text, "ministream_prefetch_bytes")

    wait_until(lambda: read() > 0, 30, what="prefetch metric")
    assert read() == total
    assert sample(sidecar.get("/metrics").text, "ministream_prefetch_seconds") > 0
