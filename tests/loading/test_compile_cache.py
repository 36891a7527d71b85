"""`ministream compile-cache`: vLLM's compile cache packed beside the model and seeded into
an empty cache only where vLLM, torch, the accelerator and the model all match
(docs/benchmarks.md, run 9: a seeded H200 start took 29 s to Ready, an empty one 61 s).

The accelerator is the one thing replaced here: these machines have no GPU, so `accelerator`
is set to a named GPU on the packing side and to another on the refusing side. The S3 case
reads the archive and the model's manifest from a real S3-compatible server (conftest.py).
"""

from __future__ import annotations

import errno
import json
import tarfile
from pathlib import Path

import pytest

from ministream import compile_cache as cc
from ministream.cli import main as cli
from ministream.manifest import MANIFEST_NAME
from ministream_testkit.s3_server import S3Server
from tests.loading.conftest import BUCKET

GPU = "Test GPU sm_90"


@pytest.fixture
def model(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / MANIFEST_NAME).write_text(json.dumps({"model_hash": "abc"}))
    return model


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    """A cache root as vLLM leaves it: torch.compile's artifacts and Triton's kernels."""
    cache = tmp_path / "cache"
    (cache / "torch_compile_cache" / "h").mkdir(parents=True)
    (cache / "torch_compile_cache" / "h" / "artifact").write_bytes(b"x" * 10)
    (cache / "triton").mkdir()
    (cache / "triton" / "k").write_bytes(b"k")
    return cache


@pytest.fixture
def archive(model: Path, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(cc, "accelerator", lambda: GPU)
    archive = tmp_path / "cc.tar"
    assert cc.pack(cache, str(model), archive)["model_hash"] == "abc"
    return archive


def _same_tree(a: Path, b: Path) -> bool:
    files = {p.relative_to(a): p.read_bytes() for p in a.rglob("*") if p.is_file()}
    return files == {p.relative_to(b): p.read_bytes() for p in b.rglob("*") if p.is_file()}


def test_round_trip_through_the_cli(
    archive: Path, model: Path, cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seeded = tmp_path / "seeded"
    argv = ["compile-cache", "unpack", "--archive", str(archive), "--cache-root", str(seeded)]
    assert cli([*argv, "--model", str(model)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["seeded"] is True and result["manifest"]["accelerator"] == GPU
    assert _same_tree(cache, seeded)


def test_refusals_write_nothing(
    archive: Path, model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (model / MANIFEST_NAME).write_text(json.dumps({"model_hash": "def"}))
    refused = cc.unpack(archive, tmp_path / "r1", str(model))
    assert refused["seeded"] is False and "model_hash" in refused["reason"]
    assert not (tmp_path / "r1").exists()

    (model / MANIFEST_NAME).write_text(json.dumps({"model_hash": "abc"}))
    monkeypatch.setattr(cc, "accelerator", lambda: "Other GPU sm_80")
    assert "accelerator" in cc.unpack(archive, tmp_path / "r2", str(model))["reason"]
    monkeypatch.setattr(cc, "accelerator", lambda: GPU)
    assert "no archive" in cc.unpack(tmp_path / "absent.tar", tmp_path / "r3", str(model))["reason"]

    # A kept cache (a PVC) is never overwritten, even by a matching archive.
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "mine").write_bytes(b"m")
    assert "not empty" in cc.unpack(archive, kept, str(model))["reason"]
    assert [p.name for p in kept.iterdir()] == ["mine"]

    # An archive with a path leaving the cache folder is refused whole, before any write.
    evil = tmp_path / "evil.tar"
    with tarfile.open(archive) as src, tarfile.open(evil, "w") as dst:
        for member in src.getmembers():
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
        dst.addfile(tarfile.TarInfo("../escaped"))
    refused_evil = cc.unpack(evil, tmp_path / "r4", str(model))
    assert "unsafe path" in refused_evil["reason"]
    assert not (tmp_path / "r4").exists() and not (tmp_path / "escaped").exists()


@pytest.mark.parametrize("damage", ["truncated", "not-a-tar"])
def test_a_broken_archive_leaves_the_cache_empty(
    model: Path, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    """Cut off inside its last file (as a full disk or a broken copy leaves it), or not an
    archive at all: refused, the cache root stays empty, and unpack does not raise."""
    (cache / "triton" / "big").write_bytes(bytes(range(256)) * 400)  # last, 100 KiB
    monkeypatch.setattr(cc, "accelerator", lambda: GPU)
    archive = tmp_path / "cc.tar"
    cc.pack(cache, str(model), archive)
    data = archive.read_bytes()
    archive.write_bytes(data[: len(data) - 60_000] if damage == "truncated" else b"x" * 4096)
    root = tmp_path / "root"
    result = cc.unpack(archive, root, str(model))
    assert result["seeded"] is False and str(archive) in result["reason"], result
    assert not root.exists()  # both are found before anything is written


def test_a_failure_while_extracting_leaves_the_cache_empty(
    archive: Path, model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk half-way (injected: the second entry's move fails with ENOSPC) removes
    what the first one wrote."""
    moves = []
    real_replace = Path.replace

    def replace(self: Path, target: Path) -> Path:
        moves.append(self.name)
        if len(moves) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_replace(self, target)

    monkeypatch.setattr(Path, "replace", replace)
    root = tmp_path / "root"
    result = cc.unpack(archive, root, str(model))
    assert result["seeded"] is False and "No space left" in result["reason"], result
    assert len(moves) == 2 and root.is_dir() and list(root.iterdir()) == []


def test_nothing_to_pack_is_a_clear_error(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    out = tmp_path / "cc.tar"
    argv = ["compile-cache", "pack", "--cache-root", str(tmp_path / "empty"), "--out", str(out)]
    assert cli([*argv, "--model", str(model)]) == 2
    assert "nothing to pack" in capsys.readouterr().err
    assert not out.exists() and not out.with_name("cc.tar.tmp").exists()


@pytest.mark.network
def test_archive_and_model_on_s3(
    archive: Path, model: Path, cache: Path, s3: S3Server, aws: dict[str, str], tmp_path: Path
) -> None:
    """The S3 loading modes: the archive and the model's manifest are read from the store."""
    client = s3.client()
    client.upload_file(str(archive), BUCKET, "cc-test/compile-cache/cc.tar")
    client.upload_file(str(model / MANIFEST_NAME), BUCKET, f"cc-test/model/{MANIFEST_NAME}")
    url = f"s3://{BUCKET}/cc-test"
    seeded = tmp_path / "seeded"
    result = cc.unpack(f"{url}/compile-cache/cc.tar", seeded, f"{url}/model")
    assert result["seeded"] is True, result
    assert _same_tree(cache, seeded)

    missing = cc.unpack(f"{url}/compile-cache/absent.tar", tmp_path / "r", f"{url}/model")
    assert missing["seeded"] is False and "absent.tar" in missing["reason"]
    assert not (tmp_path / "r").exists()
