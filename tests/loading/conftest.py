"""Session fixtures for the loading paths: a real S3 server, the model there, shard sets.

The S3 server is moto in server mode (`ministream_testkit/s3_server.py`), a separate process on
127.0.0.1, with signature and IAM checks on, stopped by PID at teardown. Each expensive
artefact (upload, shard run) is made once per session and shared; the local TP=1 load is
the session's shared `vllm_server` (tests/conftest.py), which serves this model.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ministream.upload import upload
from ministream_testkit.s3_server import S3Server
from ministream_testkit.vllm_server import VLLMServer
from tests.loading.helpers import PROMPTS, Served, complete
from tests.support.models import ModelFactory

BUCKET = "models"


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("s3"), auth=True).start()
    try:
        server.client().create_bucket(Bucket=BUCKET)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_env(s3: S3Server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment for processes that talk to the S3 server (vLLM, the CLI)."""
    # vLLM mirrors an S3 model's config into VLLM_ASSETS_CACHE/model_streamer/<url hash>.
    return {**s3.env(), "VLLM_ASSETS_CACHE": str(tmp_path_factory.mktemp("vllm-assets"))}


@pytest.fixture
def aws(s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The S3 server's environment in this process (for in-process upload/shard calls)."""
    for key, value in s3_env.items():
        monkeypatch.setenv(key, value)
    return s3_env


def run_cli(
    *args: str, env: dict[str, str] | None = None, check: bool = True, timeout: float = 1800
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "ministream.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        pytest.fail(
            f"ministream {' '.join(args)} failed ({proc.returncode}):\n"
            f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        )
    return proc


def upload_to(store: S3Server, model_dir: Path, prefix: str) -> str:
    """`ministream upload`'s own function, in this process: what the CLI runs, without a
    Python start per upload (test_upload.py runs the CLI itself)."""
    url = f"s3://{BUCKET}/{prefix}"
    upload(model_dir, url, progress=False, client=store.client())
    return url


@pytest.fixture(scope="session")
def model_dir(tiny_model_dir: Path) -> Path:
    """The session's tiny model (three safetensors files), the one `vllm_server` serves."""
    return tiny_model_dir


@pytest.fixture(scope="session")
def other_model_dir(models: ModelFactory) -> Path:
    """Same preset and shapes, other weights (seed 1): shards of it load without complaint."""
    return models.converted("tiny", "float32", seed=1, split=True)


@pytest.fixture(scope="session")
def model_url(s3: S3Server, model_dir: Path) -> str:
    return upload_to(s3, model_dir, "tiny")


def shard(model: str, output: str, tp: int, pp: int = 1, env: dict[str, str] | None = None) -> str:
    """`ministream shard` through its CLI, as users run it; returns `output`."""
    layout = ["--tensor-parallel-size", str(tp), "--pipeline-parallel-size", str(pp)]
    run_cli("shard", "--model", model, *layout, "--output", output, "--quiet", env=env)
    return output


@pytest.fixture(scope="session")
def shards_tp2(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(shard(str(model_dir), str(tmp_path_factory.mktemp("shards") / "tiny-tp2"), 2))


@pytest.fixture(scope="session")
def shards_tp2_url(s3_env: dict[str, str], model_url: str) -> str:
    """Sharded straight from S3 to S3: ranks stream the source with runai_streamer."""
    return shard(model_url, f"s3://{BUCKET}/tiny-tp2", 2, env=s3_env)


@pytest.fixture(scope="session")
def baseline(vllm_server: VLLMServer, model_dir: Path) -> Served:
    """The local TP=1 load every other path must match: the session's shared server, which
    serves `model_dir` with the same engine arguments as `serve` (no engine of its own)."""
    assert Path(vllm_server.model) == model_dir
    return Served([complete(vllm_server, prompt) for prompt in PROMPTS])
