"""Session-wide fixtures (tiny MiniStream models, one shared real vLLM server) and the
test tiers.

Engine start costs ~20-60 s on these CPUs, so every test module that needs a running
server shares `vllm_server` (docs/architecture.md §3, "start each server once per test session").

Tiers (markers, registered in pyproject.toml): `engine` tests run the real vLLM engine
(`make unit` leaves them out), `network` tests talk to local servers over loopback, `root`
tests need root and are skipped with that reason otherwise (counted in the summary).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ministream_sidecar.engine_client import LOAD_TRACKING_FLAG
from ministream_testkit.vllm_server import TINY_ENGINE_ARGS, VLLMServer
from tests.support import workers
from tests.support.models import ModelFactory

TINY_SERVED_NAME = "ministream-tiny"
# Fixtures that start a vLLM engine: a test using one must be marked `engine`.
ENGINE_FIXTURES = {"vllm_server"}


def pytest_configure(config: pytest.Config) -> None:
    """vLLM's caches (model-class info, torch.compile artifacts) go to a temporary directory
    removed at exit, not the user's ~/.cache/vllm: every engine the suite starts inherits it.
    A VLLM_CACHE_ROOT set by the caller is kept."""
    if "VLLM_CACHE_ROOT" not in os.environ:
        root = tempfile.mkdtemp(prefix="ministream-tests-vllm-cache-")
        os.environ["VLLM_CACHE_ROOT"] = root
        config.add_cleanup(lambda: shutil.rmtree(root, ignore_errors=True))


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by these markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unmarked = []
    for item in items:
        uses = ENGINE_FIXTURES & set(getattr(item, "fixturenames", ()))
        if uses and not item.get_closest_marker("engine"):
            unmarked.append(f"{item.nodeid} (uses {', '.join(sorted(uses))})")
        root = item.get_closest_marker("root")
        if root and os.geteuid() != 0:
            why = root.args[0] if root.args else "see the test"
            item.add_marker(pytest.mark.skip(reason=f"needs root: {why}"))
    if unmarked:
        raise pytest.UsageError(
            "tests that start a vLLM engine must be marked `engine`:\n" + "\n".join(unmarked)
        )
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: see tests/support/workers.py
        workers.heaviest_groups_first(items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    return workers.make_scheduler(config, log)


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> ModelFactory:
    return ModelFactory(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def tiny_model_dir(models: ModelFactory) -> Path:
    """The tiny GQA preset, converted to float32 in three safetensors files.

    Split so that the loading tests, which compare every loading path with this directory
    served by `vllm_server`, can also delete a file "in the middle" of its upload."""
    return models.converted("tiny", "float32", split=True)


@pytest.fixture(scope="session")
def vllm_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VLLMServer]:
    """A real vLLM OpenAI server (CPU) serving `tiny_model_dir`, shared by the session.

    Tests may load it but never stop or reconfigure it; a test that kills vLLM starts its own.
    """
    server = VLLMServer(
        model=str(tiny_model_dir),
        served_name=TINY_SERVED_NAME,
        log_path=tmp_path_factory.mktemp("logs") / "vllm-shared.log",
        # As the chart runs vLLM: GET /load counts what its HTTP server holds, which the
        # sidecar's drain waits for.
        args=[*TINY_ENGINE_ARGS, "--shutdown-timeout", "30", LOAD_TRACKING_FLAG],
    )
    with server.running():
        yield server
