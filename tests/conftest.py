"""Session-wide fixtures: tiny MiniStream models and one shared real vLLM server.

Engine start costs ~20-60 s on these CPUs, so every test module that needs a running
server shares `vllm_server` (DESIGN §8, "start each server once per test session").
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.models import ModelFactory
from tests.support.vllm_server import VLLMServer

TINY_SERVED_NAME = "ministream-tiny"


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> ModelFactory:
    return ModelFactory(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def tiny_model_dir(models: ModelFactory) -> Path:
    """The tiny GQA preset, converted to float32."""
    return models.converted("tiny", "float32")


@pytest.fixture(scope="session")
def vllm_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VLLMServer]:
    """A real vLLM OpenAI server (CPU) serving `tiny_model_dir`, shared by the session."""
    server = VLLMServer(
        model=str(tiny_model_dir),
        served_name=TINY_SERVED_NAME,
        log_path=tmp_path_factory.mktemp("logs") / "vllm-shared.log",
        args=[
            "--dtype",
            "float32",
            "--max-model-len",
            "512",
            "--enforce-eager",
            "--shutdown-timeout",
            "30",
        ],
    )
    server.start()
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()
