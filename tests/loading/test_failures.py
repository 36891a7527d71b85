"""Every loading failure ends the real vLLM server with a clear error: nothing served.

Each case starts `vllm.entrypoints.openai.api_server` and requires that it exits non-zero
without `/health` ever answering 200, and that its log carries the message a user needs.
Cases that vLLM 0.32 would otherwise let through (TP mismatch, shards of another model,
an incomplete upload) are stopped by the plugin's load guard before any weight is read, in
the API server while vLLM builds its config: no engine-core process ever starts.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from ministream.manifest import MANIFEST_NAME
from ministream.shardset import HEADER_MODEL_HASH
from ministream_testkit.s3_server import S3Server
from ministream_testkit.vllm_server import VLLMServer
from ministream_testkit.waiting import wait_until
from tests.loading.conftest import BUCKET, upload_to
from tests.loading.helpers import BASE_ARGS, START_TIMEOUT, expect_start_failure

# Session fixtures (uploads, shard runs, the TP=1 baseline) count toward the first test's
# timeout; engine starts take minutes when other engines share the two cores.
pytestmark = [pytest.mark.engine, pytest.mark.network, pytest.mark.timeout(7200)]
RUNAI = ["--load-format", "runai_streamer"]
WEIGHTS_READ = "Loading weights took"  # vLLM logs this once weights were read
ENGINE_CORE = "(EngineCore"  # the prefix of every line the engine-core process logs


def assert_stopped_before_the_engine_core(log: str) -> None:
    """The load guard ran in the API server (ministream.load_guard.EngineStartCheck)."""
    assert ENGINE_CORE not in log, "the engine core started: the guard ran too late"
    assert WEIGHTS_READ not in log


def test_wrong_credentials(model_url: str, s3_env: dict[str, str], tmp_path: Path) -> None:
    env = {**s3_env, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    log = expect_start_failure(model_url, tmp_path / "vllm.log", env=env, extra_args=RUNAI)
    assert "SignatureDoesNotMatch" in log


def test_missing_bucket(s3_env: dict[str, str], tmp_path: Path) -> None:
    log = expect_start_failure(
        "s3://no-such-bucket/tiny", tmp_path / "vllm.log", env=s3_env, extra_args=RUNAI
    )
    assert "NoSuchBucket" in log


def test_missing_prefix(model_url: str, s3_env: dict[str, str], tmp_path: Path) -> None:
    log = expect_start_failure(
        f"s3://{BUCKET}/no-such-model", tmp_path / "vllm.log", env=s3_env, extra_args=RUNAI
    )
    assert "config.json" in log


def test_object_deleted_from_the_middle(
    model_dir: Path, s3: S3Server, s3_env: dict[str, str], tmp_path: Path
) -> None:
    url = upload_to(s3, model_dir, "holey")
    s3.client().delete_object(Bucket=BUCKET, Key="holey/model-00002-of-00003.safetensors")
    log = expect_start_failure(url, tmp_path / "vllm.log", env=s3_env, extra_args=RUNAI)
    assert f"{url} is incomplete: missing model-00002-of-00003.safetensors" in log
    assert_stopped_before_the_engine_core(log)


def test_interrupted_upload_is_not_served(
    model_dir: Path, s3: S3Server, s3_env: dict[str, str], tmp_path: Path
) -> None:
    """An upload cut off after its last file, before the manifest (written last).

    The one interrupted state in which every file vLLM needs is present: without the guard
    it would load. Earlier cut-offs lack config.json too (uploaded just before the manifest;
    test_upload.py kills a real upload and checks that), which vLLM refuses by itself.
    """
    url = upload_to(s3, model_dir, "half")
    s3.client().delete_object(Bucket=BUCKET, Key=f"half/{MANIFEST_NAME}")
    log = expect_start_failure(url, tmp_path / "vllm.log", env=s3_env, extra_args=RUNAI)
    assert f"{url} has no {MANIFEST_NAME}: the upload did not finish" in log
    assert_stopped_before_the_engine_core(log)


def test_s3_server_stopped_during_load(model_dir: Path, tmp_path: Path) -> None:
    """A store that dies while weights stream: vLLM must fail, not hang or serve."""
    store = S3Server(tmp_path / "s3", auth=True, delay_get=2.0).start()
    try:
        store.client().create_bucket(Bucket=BUCKET)
        env = {**store.env(), "VLLM_ASSETS_CACHE": str(tmp_path / "assets")}
        url = upload_to(store, model_dir, "tiny")
        server = VLLMServer(
            model=url, log_path=tmp_path / "vllm.log", args=[*BASE_ARGS, *RUNAI], env=env
        ).start()
        try:

            def weights_get_done() -> bool:
                assert server.process is not None and server.process.poll() is None, (
                    server.log_tail()
                )
                # The request log lists a request when it completes.
                return any(
                    r["method"] == "GET" and r["path"].endswith(".safetensors")
                    for r in store.requests()
                )

            wait_until(
                weights_get_done,
                START_TIMEOUT,
                0.2,
                what="the first weights GET",
                detail=server.log_tail,
            )
            store.kill()
            assert server.wait_exit(timeout=START_TIMEOUT) != 0
        finally:
            server.stop()
    finally:
        store.stop()
    log = (tmp_path / "vllm.log").read_text(errors="replace")
    assert "Engine core initialization failed" in log


def test_tp_mismatch_fails_before_reading_weights(shards_tp2: Path, tmp_path: Path) -> None:
    log = expect_start_failure(
        str(shards_tp2), tmp_path / "vllm.log", extra_args=["--load-format", "sharded_state"], tp=1
    )
    assert (
        f"shard set {shards_tp2} was made for tensor-parallel size 2, but vLLM is "
        "starting with tensor-parallel size 1"
    ) in log
    assert "--tensor-parallel-size 2" in log
    assert "ministream shard --model" in log and "--tensor-parallel-size 1" in log
    assert_stopped_before_the_engine_core(log)


def test_shard_set_from_another_model(shards_tp2: Path, tmp_path: Path) -> None:
    """A rank file of another model's shard set copied in. Same shapes, so vLLM would serve
    it, and the same size, so the listing agrees: only its header tells. The file is this
    set's own rank-1 file saved again under another model's hash (the guard reads nothing
    else of it; sharding a second model for this took a minute of CI)."""
    mixed = shutil.copytree(shards_tp2, tmp_path / "mixed")
    rank1 = mixed / "model-rank-1-part-0.safetensors"
    with safe_open(str(rank1), "pt") as f:
        header = f.metadata()
    size = rank1.stat().st_size
    save_file(load_file(str(rank1)), str(rank1), metadata={**header, HEADER_MODEL_HASH: "f" * 64})
    assert rank1.stat().st_size == size
    log = expect_start_failure(
        str(mixed), tmp_path / "vllm.log", tp=2, extra_args=["--load-format", "sharded_state"]
    )
    assert f"{mixed}/model-rank-1-part-0.safetensors was made from another model" in log
    # Each worker checks its own files' headers (the API server opens no shard file): rank 1
    # stops before reading; rank 0 may read its own (valid) shard meanwhile.
    assert not [ln for ln in log.splitlines() if "Worker_TP1" in ln and WEIGHTS_READ in ln]
