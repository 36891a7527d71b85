"""`ministream upload` against a real S3 server (moto, separate process): no vLLM here.

What must hold: the manifest is the last object written, so a prefix without it is an
unfinished upload (and the load guard refuses it); re-running skips what is already there;
a killed upload resumes, aborting its stale multipart upload; stray weights are refused;
S3 failures are one-line errors that name the cause.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ministream.errors import CheckpointError, StorageError
from ministream.load_guard import check_model_files
from ministream.manifest import MANIFEST_NAME, Manifest
from ministream.s3 import SHA256_META
from ministream.upload import upload
from ministream_testkit.s3_server import S3Server
from ministream_testkit.waiting import wait_until
from tests.loading.conftest import BUCKET, run_cli
from tests.support.models import ModelFactory

# Every test talks to a moto S3 server process on loopback.
pytestmark = pytest.mark.network


def _puts(s3: S3Server, prefix: str, since: int = 0) -> list[str]:
    """The objects PUT under `prefix`, in the order the requests came (the log's own order is
    the order they ended, and a PUT sent after another's answer can end first)."""
    puts = [
        r
        for r in s3.requests()[since:]
        if r["method"] == "PUT"
        and r["path"].startswith(f"/{BUCKET}/{prefix}/")
        and r["status"] == 200
    ]
    return [r["path"].rsplit("/", 1)[1] for r in sorted(puts, key=lambda r: r["arrived"])]


def test_upload_verifies_and_writes_the_manifest_last(
    aws: dict[str, str], s3: S3Server, model_dir: Path
) -> None:
    before = len(s3.requests())
    result = upload(model_dir, f"s3://{BUCKET}/up-basic", progress=False)
    manifest = Manifest.load(model_dir)
    assert sorted(result.uploaded) == sorted(manifest.files) and not result.skipped
    puts = _puts(s3, "up-basic", before)
    assert puts[-1] == MANIFEST_NAME and puts.count(MANIFEST_NAME) == 1
    client = s3.client()
    for name, meta in manifest.files.items():
        obj = client.head_object(Bucket=BUCKET, Key=f"up-basic/{name}")
        assert obj["ContentLength"] == meta["size"]
        assert obj["Metadata"][SHA256_META] == meta["sha256"]
    check_model_files(f"s3://{BUCKET}/up-basic", "runai_streamer")  # the guard accepts it

    again = len(s3.requests())
    second = upload(model_dir, f"s3://{BUCKET}/up-basic", progress=False)
    assert not second.uploaded and sorted(second.skipped) == sorted(manifest.files)
    assert _puts(s3, "up-basic", again) == []


def _big_model(model_dir: Path, dst: Path) -> Path:
    """The tiny model plus a 12 MiB file, so that a 5 MiB part size means multipart.

    Named to sort last: with --jobs 1 the small files are done before its parts start.
    """
    shutil.copytree(model_dir, dst)
    (dst / "zz_extra_assets.bin").write_bytes(os.urandom(12 * 2**20))
    manifest = Manifest.build(dst, source={"test": "multipart"}, dtype="float32")
    (dst / MANIFEST_NAME).write_text(manifest.to_json())
    return dst


def test_killed_upload_is_incomplete_then_resumes(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL (an evicted pod) in the middle of a multipart upload, then the same command."""
    slow = S3Server(tmp_path / "s3", auth=True, delay_put=0.4).start()
    try:
        slow.client().create_bucket(Bucket=BUCKET)
        for key, value in slow.env().items():
            monkeypatch.setenv(key, value)
        src = _big_model(model_dir, tmp_path / "big")
        url = f"s3://{BUCKET}/resume"
        cmd = [
            sys.executable,
            "-m",
            "ministream.cli",
            "upload",
            str(src),
            url,
            "--jobs",
            "1",
            "--part-size-mib",
            "5",
            "--quiet",
        ]
        proc = subprocess.Popen(cmd, env=os.environ.copy())

        def second_part_sent() -> bool:
            assert proc.poll() is None, "upload ended early"
            return any("partNumber=2" in r["query"] for r in slow.requests())

        wait_until(second_part_sent, 120, what="the upload's second part")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

        client = slow.client()
        names = {
            o["Key"].split("/", 1)[1]
            for o in client.list_objects_v2(Bucket=BUCKET).get("Contents", [])
        }
        assert MANIFEST_NAME not in names
        assert "config.json" not in names  # written just before the manifest
        assert client.list_multipart_uploads(Bucket=BUCKET).get("Uploads")  # left behind
        with pytest.raises(StorageError, match="the upload did not finish"):
            check_model_files(url, "runai_streamer")

        done = run_cli("upload", str(src), url, "--jobs", "4", "--part-size-mib", "5", "--quiet")
        counts = re.search(r"uploaded (\d+) file\(s\).*skipped (\d+) already present", done.stdout)
        assert counts, done.stdout
        uploaded, skipped = int(counts[1]), int(counts[2])
        # Every file listed complete after the kill is skipped. A PUT still inside the store's
        # delay when the uploader died lands after that listing, so it may be skipped too.
        assert skipped >= len(names) >= 1, (names, done.stdout)
        files = [f for f in src.iterdir() if f.name != MANIFEST_NAME]  # the manifest goes last
        assert uploaded >= 1 and uploaded + skipped == len(files), done.stdout
        assert not client.list_multipart_uploads(Bucket=BUCKET).get("Uploads")
        obj = client.head_object(Bucket=BUCKET, Key="resume/zz_extra_assets.bin")
        assert obj["ContentLength"] == 12 * 2**20
        check_model_files(url, "runai_streamer")
    finally:
        slow.stop()


def test_stray_weights_are_refused_then_deleted_on_request(
    aws: dict[str, str], s3: S3Server, model_dir: Path
) -> None:
    client = s3.client()
    client.put_object(Bucket=BUCKET, Key="up-stray/model-00009-of-00009.safetensors", Body=b"old")
    with pytest.raises(StorageError, match=r"model-00009-of-00009\.safetensors.*--delete-stray"):
        upload(model_dir, f"s3://{BUCKET}/up-stray", progress=False)
    assert "Contents" in client.list_objects_v2(Bucket=BUCKET, Prefix="up-stray/")
    result = upload(model_dir, f"s3://{BUCKET}/up-stray", delete_stray=True, progress=False)
    assert result.deleted == ["model-00009-of-00009.safetensors"]
    check_model_files(f"s3://{BUCKET}/up-stray", "runai_streamer")


def test_replacing_a_model_deletes_the_old_manifest_first(
    aws: dict[str, str], s3: S3Server, model_dir: Path, other_model_dir: Path
) -> None:
    url = f"s3://{BUCKET}/up-replace"
    upload(model_dir, url, progress=False)
    before = len(s3.requests())
    result = upload(other_model_dir, url, progress=False)
    assert MANIFEST_NAME in result.deleted
    log = [r for r in s3.requests()[before:] if r["method"] in ("PUT", "POST")]
    # The multi-object delete (POST ?delete) that removes the old manifest precedes every PUT.
    assert log[0]["method"] == "POST" and "delete" in log[0]["query"]
    remote = s3.client().get_object(Bucket=BUCKET, Key=f"up-replace/{MANIFEST_NAME}")
    assert remote["Body"].read().decode() == (other_model_dir / MANIFEST_NAME).read_text()


def test_a_corrupt_local_model_is_not_uploaded(
    aws: dict[str, str], s3: S3Server, model_dir: Path, tmp_path: Path
) -> None:
    bad = shutil.copytree(model_dir, tmp_path / "bad")
    weights = bad / "model-00002-of-00003.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    before = len(s3.requests())
    with pytest.raises(CheckpointError, match=r"model-00002-of-00003\.safetensors: sha256"):
        upload(bad, f"s3://{BUCKET}/up-corrupt", progress=False)
    assert len(s3.requests()) == before


def test_storage_errors_are_one_line_and_name_the_cause(
    s3_env: dict[str, str], model_dir: Path
) -> None:
    wrong = {**s3_env, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    proc = run_cli(
        "upload", str(model_dir), f"s3://{BUCKET}/up-err", "--quiet", env=wrong, check=False
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "refused the credentials (SignatureDoesNotMatch" in proc.stderr

    proc = run_cli(
        "upload", str(model_dir), "s3://no-such-bucket/x", "--quiet", env=s3_env, check=False
    )
    assert proc.returncode == 2
    assert "bucket 'no-such-bucket' does not exist" in proc.stderr

    dead = {**s3_env, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    proc = run_cli(
        "upload", str(model_dir), f"s3://{BUCKET}/up-err", "--quiet", env=dead, check=False
    )
    assert proc.returncode == 2
    assert "cannot reach http://127.0.0.1:9" in proc.stderr


def test_an_adapter_directory_uploads_with_its_config_and_manifest_last(
    aws: dict[str, str], s3: S3Server, model_dir: Path, models: ModelFactory
) -> None:
    """`ministream upload` takes a converted LoRA adapter as it takes a model: verified
    first, adapter_config.json (what vLLM reads first) and then the manifest written last."""
    _, adapter = models.adapter(model_dir, rank=2, targets=("attn.Wqkv",))
    before = len(s3.requests())
    result = upload(adapter, f"s3://{BUCKET}/up-adapter", progress=False)
    assert sorted(result.uploaded) == sorted(Manifest.load(adapter).files)
    assert _puts(s3, "up-adapter", before)[-2:] == ["adapter_config.json", MANIFEST_NAME]
